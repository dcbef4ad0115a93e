#!/usr/bin/env bash
# `kvwire validate` on the H200 up to SmolLM2's 8k context, in-process engine on CUDA (Triton
# kernels). The GPU image has no Ray or NIXL, so the router backends do not run there; the
# in-process engine is the same page code the workers run. It has no matplotlib either: fetch
# $OUT/validate and draw the plots here with
#   kvwire validate --report-only --out <fetched dir>
#
# Before: the two model-parts runs of ../shared/gpu/README.md (the second one assembles
# /root/model/smollm2.gguf and then runs this script). Carry .gpuwheels (gguf: about 0.1 MiB, so
# it fits next to a model piece; never .whl with a model piece).
# Usage (repo root on the GPU machine): bash scripts/gpu/validate.sh [extra kvwire validate flags]
#   SAMPLES=3 by default (seeds per cell; cheap on the GPU, and it narrows the accuracy steps).
set -euo pipefail
wheel=$(ls .gpuwheels/gguf-*.whl .whl/gguf-*.whl 2>/dev/null | head -1 || true)
[ -n "$wheel" ] || { echo "no gguf wheel in .gpuwheels/ or .whl/: carry one" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheel"
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
model=${MODEL:-/root/model/smollm2.gguf}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m kvwire.validate --model "$model" --device cuda --samples "${SAMPLES:-3}" \
    --lengths 1024,2048,4096,8192 --out "$OUT/validate" --no-progress "$@" 2>&1 | tee "$OUT/validate.log"
