#!/usr/bin/env bash
# Fill the ignored .whl/ with Ray, NIXL and gguf for the GPU machine (../shared/gpu/make-wheels.sh),
# then drop the Ray libraries this project never imports there (rllib, data, serve, tune, train,
# llm) and NIXL's headers and example scripts: with this tree (about 5 MiB) the shared script's
# 61 MiB no longer fits the 64 MiB a device run may carry; this leaves about 55 MiB.
# Usage (repository root): bash scripts/gpu/wheels.sh; then carry .whl and install as
# ../shared/gpu/README.md says.
set -euo pipefail
bash ../shared/gpu/make-wheels.sh
slim() { python3 ../shared/gpu/slim_wheel.py "$1" "$1.slim" "${@:2}" && mv "$1.slim" "$1"; }
slim .whl/ray-2.60.0-*.whl 'ray/rllib/*' 'ray/data/*' 'ray/serve/*' 'ray/tune/*' 'ray/train/*' 'ray/llm/*'
slim .whl/nixl_cu13-1.5.1-*.whl 'nixl_cu13-1.5.1.data/headers/*' 'nixl_cu13.scripts/*'
du -b .whl | tail -1 | awk '{printf ".whl: %.1f MiB\n", $1/1048576}'
