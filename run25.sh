#!/bin/bash
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=$OUT; export OUT=/tmp/o; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee $OUT/gpu.txt
T0=$(date +%s)
el() { echo "=== $1 at $(( $(date +%s) - T0 )) s" | tee -a $OUT/progress.txt; cd /tmp/o && tar czf $O/run.tgz . ; cd - >/dev/null; }
timeout 90 python3 -m kvwire.bench.attention --out $OUT/attention.json > $OUT/attention.txt 2>&1; tail -22 $OUT/attention.txt
el attention
SKIP_ENGINE=1 VARIANTS="default LDL1=0 default LDL1=0" timeout 200 bash scripts/gpu/cuda_quantize.sh > $OUT/q.log 2>&1
tail -4 $OUT/tests_quantize.txt; grep -A8 "^| format" $OUT/quantize.txt | grep nvfp4; cat $OUT/variants.txt
el quantize
timeout 60 python3 scripts/gpu/decode_sweep.py variants 32x32k fp8-token "0" "STAGES=2 STAGES=2,BESIDE=1 STAGES=2 STAGES=2,BESIDE=1" > $OUT/beside.txt 2>&1
timeout 60 python3 scripts/gpu/decode_sweep.py variants 32x32k fp8-token/nvfp4 "0" "default BESIDE=1 default BESIDE=1" > $OUT/beside-mixed.txt 2>&1
cut -c1-60,150- $OUT/beside*.txt
el beside
timeout 100 python3 scripts/gpu/decode_sweep.py variants 32x32k fp8-tensor,fp8-page,fp8-token,fp8-tensor/nvfp4,fp8-token/nvfp4 "0" "PROBE_LOADS=1,STAGES=0 default PROBE_LOADS=1,STAGES=0 default" > $OUT/walk.txt 2>&1
cut -c1-60,150- $OUT/walk.txt
el done
