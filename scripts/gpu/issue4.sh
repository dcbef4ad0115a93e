#!/usr/bin/env bash
# One device run for issue 4 (NIXL VRAM push between two processes on one GPU): what a transfer
# spends its time on, `kvwire bench transfer`, and the GPU disaggregation equality test.
# Needs Ray + NIXL from .whl, installed as ../shared/gpu/README.md says (pytest-timeout, if
# there, bounds each test: `pip download --no-deps pytest-timeout -d .whl`).
# Usage: bash scripts/gpu/issue4.sh [probe] [bench] [test]    (default: all three); results under $OUT
set -uo pipefail
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${*:-probe bench test}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u;
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/env.txt"
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    probe)
      UCX_PROTO_INFO=y timeout 120 python3 scripts/gpu/transfer_probe.py --out "$OUT/probe.json" > "$OUT/probe.log" 2>&1
      echo "probe exit $?" | tee -a "$OUT/probe.log"; grep '^{' "$OUT/probe.log" ;;
    bench)
      timeout 240 python3 -m kvwire.cli bench transfer --device cuda --out "$OUT/transfer.json" > "$OUT/bench_transfer.log" 2>&1
      echo "bench exit $?" | tee -a "$OUT/bench_transfer.log"; grep -A30 '^KV transfer' "$OUT/bench_transfer.log" ;;
    test)
      # pytest-timeout's thread method: its default (a signal) cannot interrupt a ray.get blocked in Ray's C++ core
      TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout 150 --timeout-method=thread"
      timeout 330 python3 -m pytest -x -s -q -rA $TO -o faulthandler_timeout=120 -p no:cacheprovider \
        tests/disagg/test_ray_pd_gpu.py tests/transfer/test_nixl_gpu.py > "$OUT/gpu_test.log" 2>&1
      echo "pytest exit $?" | tee -a "$OUT/gpu_test.log"; grep -E "passed|failed|^FAILED|^ERROR|Error|Timeout" "$OUT/gpu_test.log" | tail -20 ;;
  esac
  echo "[$step] $(( $(date +%s) - t0 )) s" | tee -a "$OUT/env.txt"
done
