#!/usr/bin/env bash
# `kvwire bench serve` on the GPU with NIXL's progress thread as this tree sets it (poll timeout
# 1 ms) and as NIXL's Python wrapper leaves it (0: the thread spins a core per agent), alternated
# in one call: delay, spin, delay, spin. SmolLM2 shape, random weights, bf16 and nvfp4 pools, the
# settings of scripts/gpu/serve_bench.sh but 32 requests per format. Carry .whl and .gpuwheels
# (serve_bench.sh says what they hold). Results: $OUT/serve-{delay,spin}-{1,2}.{json,log}.
set -uo pipefail
rm -rf /tmp/site; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    $(ls .gpuwheels/*.whl | grep -v gguf) || exit 1
export PYTHONPATH=$PWD:/tmp/site RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
echo "cpus: $(nproc)" | tee -a "$OUT/gpu.txt"
python3 -c "import router.api.router_pb2_grpc" 2>/dev/null || {
    echo "patching the grpcio version guard in this copy"; sed -i 's/^if _version_not_supported:/if False:/' router/api/router_pb2_grpc.py; }
cp transfer/nixl_transport.py /tmp/nixl_transport.py.tree
delay() { cp /tmp/nixl_transport.py.tree transfer/nixl_transport.py; }
spin() { sed -i 's/config.pthrDelay = progress_delay_us/config.pthrDelay = 0/' transfer/nixl_transport.py
         grep -q "config.pthrDelay = 0" transfer/nixl_transport.py || { echo "spin patch failed"; exit 1; }; }
bench() {
    local t0=$(date +%s)
    timeout 170 python3 -m kvwire.cli bench serve --load-format dummy --model-shape smollm2-135m \
        --kv-formats bf16,nvfp4 --concurrency 16 --requests 32 --prompt-tokens 2048 --output-tokens 64 \
        --num-pages 8192 --out "$OUT/serve-$1.json" > "$OUT/serve-$1.log" 2>&1
    echo "$1: rc $? in $(( $(date +%s) - t0 )) s"; grep -E "^\| (bf16|nvfp4) " "$OUT/serve-$1.log"
}
delay; bench delay-1; spin; bench spin-1; delay; bench delay-2; spin; bench spin-2; delay
