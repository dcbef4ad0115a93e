#!/usr/bin/env bash
# One device run: GPU tests (kernels, runner), the CUDA-vs-CPU reference check, benches; in full mode
# also `kvwire bench decode-step` (CUDA graphs vs eager). Results under $OUT.
# Usage: bash scripts/gpu/run_all.sh [quick|full] [sweep]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
MODE=${1:-quick}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pytest -q -m gpu tests/kernels tests/kvwire -rA -n 6 > "$OUT/gpu_tests.log" 2>&1; echo "pytest exit $?" >> "$OUT/gpu_tests.log"
grep -E "passed|failed|^FAILED|^ERROR|XFAIL|differ|hardware cast" "$OUT/gpu_tests.log" | tail -25
bash scripts/gpu/ref_cuda_vs_cpu.sh 2>&1 | tee "$OUT/ref_cuda_vs_cpu.log"
if [ "${2:-}" = "sweep" ]; then bash scripts/gpu/sweep.sh 2>&1 | tee "$OUT/sweep.log"; fi
if [ "$MODE" = "full" ]; then Q=""; else Q="--quick"; fi
python3 -m kvwire.bench.quantize $Q --out "$OUT/quantize.json" 2>&1 | tee "$OUT/quantize.log"
python3 -m kvwire.bench.attention $Q --out "$OUT/attention.json" 2>&1 | tee "$OUT/attention.log"
if [ "$MODE" = "full" ]; then
  python3 -m kvwire.bench.decode_step --out "$OUT/decode_step.json" 2>&1 | tee "$OUT/decode_step.log"
fi
