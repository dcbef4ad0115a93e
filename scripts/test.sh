#!/usr/bin/env bash
# The test command: set up .venv (with test dependencies) and run the whole suite on the CPU.
# Two pytest-xdist processes, each taking whole test files (--dist loadfile), so a module's
# Ray cluster and the session's model load start once per process: the suite spends much of
# its time waiting on subprocesses and Ray actors, and two processes finish it in about 14 of
# the 17-20 minutes one takes on a 2-core machine. Extra arguments go to pytest and win over
# these, e.g. scripts/test.sh -m "not slow", or scripts/test.sh -n 0 for one process.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
