#!/usr/bin/env bash
# The CUDA (NVRTC) decode split kernel on the GPU: correctness tests, one bench run against the
# Triton kernel and bf16 SDPA, then a sweep of compile-time variants x split counts
# (scripts/gpu/decode_sweep.py). Results in $OUT.
# Usage (GPU machine, repo root): bash scripts/gpu/cuda_decode.sh [SHAPES] [FORMATS] [SPLITS] [VARIANTS]
#   VARIANTS: space-separated KEY=V,KEY=V overrides of paged_decode_cuda.tuning_for (or "default"),
#             e.g. "default DEPTH=2 DEPTH=3,MINB=3"
#   SPLITS: space-separated counts; 0 = the default choice
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SHAPES=${1:-1x32k,32x32k}
FORMATS=${2:-fp8-tensor,fp8-token,nvfp4,fp8-token/nvfp4}
SPLITS=${3:-"0"}
VARIANTS=${4:-"default"}
if [ -z "${SKIP_TESTS:-}" ]; then
  # The engine test also runs its model on the CPU: cap torch's threads per worker (oversubscribed
  # OpenMP threads spin and can stall a test for minutes).
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} python3 -m pytest -q -p no:cacheprovider -n ${TEST_WORKERS:-4} --durations=8 \
      tests/kernels/test_gpu_cuda_decode.py tests/kvwire/test_engine_gpu.py tests/kernels/test_gpu.py \
      -k "decode or cuda or kernel_path" 2>&1 | tee "$OUT/tests_cuda.txt" | tail -25
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  python3 -m kvwire.bench.attention --formats "$FORMATS" --shapes "$SHAPES" --backends cuda,triton \
      --no-dequant-baseline --out "$OUT/attention.json" 2>&1 | tee "$OUT/attention.txt" | tail -30
fi
python3 scripts/gpu/decode_sweep.py variants "$SHAPES" "$FORMATS" "$SPLITS" "$VARIANTS" 2>&1 | tee "$OUT/sweep.txt"
