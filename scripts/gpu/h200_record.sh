#!/usr/bin/env bash
# The figures of record on the H200 (docs/benchmarks.md, "Next on the device"): the attention bench
# twice on 16-token pages and once on 64-token pages, then the page walks with no kernel
# (chunk_reads.py scales and layouts), then the GPU test suite in the rest of the call (below).
# On any other card it exits at once (status 3), so a call that lands on an H100 costs little, or with
# "other-card" runs only the GPU test suite (over five minutes on a fresh machine, most of it
# compiling: session 33's H100 reached 95% in 300 s). The suite gets what is left of CALL_S seconds
# (default 590: a device call's limit is 600), so a call is not killed before its summary line.
# Usage (device, repo root): OUT=/path [CALL_S=590] bash scripts/gpu/h200_record.sh [other-card]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); CALL_S=${CALL_S:-590}
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $NAME"
H200=0; case "$NAME" in *H200*) H200=1;; esac
if [ $H200 = 0 ] && [ "${1:-}" != "other-card" ]; then echo "not an H200: nothing run"; exit 3; fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"
SHAPES=1x32k,32x32k,16x128k,8x32k
step() {  # step NAME LIMIT_S COMMAND...: run one step under a time limit, output to $OUT/NAME.txt
  local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  echo "$name: rc $rc in $(( $(date +%s) - t0 )) s"
  grep -E "^ *32x32k|\"case\"|^FAILED|^ERROR" "$OUT/$name.txt" | head -24
}
if [ $H200 = 1 ]; then
  step attention-16 200 python3 -m kvwire.bench.attention --shapes $SHAPES --out "$OUT/attention-16.json"
  step attention-64 200 python3 -m kvwire.bench.attention --shapes $SHAPES --page-size 64 --out "$OUT/attention-64.json"
  step attention-16-run2 200 python3 -m kvwire.bench.attention --shapes $SHAPES --out "$OUT/attention-16-run2.json"
  step chunk-reads-scales 120 python3 scripts/gpu/chunk_reads.py scales --out "$OUT/chunk-reads-scales.json"
  step chunk-reads-layouts 120 python3 scripts/gpu/chunk_reads.py layouts --out "$OUT/chunk-reads-layouts.json"
fi
LEFT=$(( CALL_S - ($(date +%s) - T0) )); [ $LEFT -lt 10 ] && LEFT=10   # "timeout 0" would never stop
step gpu-tests $LEFT python3 -m pytest -q -m gpu tests/kernels tests/kvwire -n 14 -p no:cacheprovider
tail -3 "$OUT/gpu-tests.txt"
