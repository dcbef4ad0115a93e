#!/usr/bin/env bash
# The CUDA (NVRTC) quantise-on-write kernel on the GPU: its bit-identity tests and the Triton ones,
# `kvwire bench quantize` (CUDA vs Triton vs the copy rate), then the engine GPU tests (which
# quantise through it). Results in $OUT.
# Usage (GPU machine, repo root): bash scripts/gpu/cuda_quantize.sh [FORMATS]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FORMATS=${1:-bf16,fp8-tensor,fp8-page,fp8-token,nvfp4}
timeout 240 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/test_gpu_cuda_quantize.py \
    tests/kernels/test_gpu.py -k "quantize" 2>&1 | tee "$OUT/tests_quantize.txt" | tail -25
timeout 240 python3 -m kvwire.bench.quantize --formats "$FORMATS" --out "$OUT/quantize.json" 2>&1 \
    | tee "$OUT/quantize.txt" | tail -30
if [ -z "${SKIP_ENGINE:-}" ]; then
  OMP_NUM_THREADS=2 timeout ${ENGINE_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -n 4 --durations=8 \
      tests/kvwire/test_engine_gpu.py tests/kvwire/test_runner_batch.py 2>&1 | tee "$OUT/tests_engine.txt" | tail -25
fi
# Optional sweeps (scripts/gpu/quantize_sweep.py): chunks per thread x division steps, e.g.
# CPL_SWEEP="2 4 8" STEPS_SWEEP="1 2"; compile-time variants of the NVFP4 path, interleaved as listed,
# e.g. VARIANTS="default NOCLAMP=1,AMAX2=1 default NOCLAMP=1,AMAX2=1".
if [ -n "${CPL_SWEEP:-}" ]; then
  python3 scripts/gpu/quantize_sweep.py chunks "$FORMATS" "$CPL_SWEEP" "${STEPS_SWEEP:-2}" 2>&1 | tee "$OUT/cpl_sweep.txt"
fi
if [ -n "${VARIANTS:-}" ]; then
  python3 scripts/gpu/quantize_sweep.py variants "$VARIANTS" 2>&1 | tee "$OUT/variants.txt"
fi
