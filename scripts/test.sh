#!/usr/bin/env bash
# The test command: set up .venv (with test dependencies) and run the whole suite on the CPU.
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
exec .venv/bin/python -m pytest -q "$@"
