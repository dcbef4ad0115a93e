#!/usr/bin/env bash
# `kvwire bench serve` on the H200: the router, Ray prefill/decode actors sharing the GPU, NIXL over
# VRAM, random weights at real shapes (the speed does not depend on the weights' values; prompts are
# token ids). Carry .whl (Ray, NIXL, gguf: scripts/gpu/wheels.sh) and .gpuwheels
# (grpcio-health-checking, grpcio-reflection, prometheus-client: pure-Python wheels the image lacks).
# Results: $OUT/serve-<shape>.json and logs.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    $(ls .gpuwheels/*.whl | grep -v gguf) || exit 1
export PYTHONPATH=$PWD:/tmp/site RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import grpc, torch; print('grpcio', grpc.__version__, 'torch', torch.__version__)"
# The committed gRPC code names grpcio 1.85.1; an older grpcio in the image only trips its guard.
python3 -c "import router.api.router_pb2_grpc" 2>/dev/null || {
    echo "patching the grpcio version guard in this copy"; sed -i 's/^if _version_not_supported:/if False:/' router/api/router_pb2_grpc.py; }
python3 -c "import router.serve" || exit 1
bench() {  # shape formats requests num_pages
    timeout 280 python3 -m kvwire.cli bench serve --load-format dummy --model-shape "$1" --kv-formats "$2" \
        --concurrency 16 --requests "$3" --prompt-tokens 2048 --output-tokens 64 --num-pages "$4" \
        --out "$OUT/serve-$1.json" 2>&1 | tail -40 | tee "$OUT/serve-$1.log"
}
bench smollm2-135m bf16,nvfp4,fp8-token/nvfp4 64 8192
bench llama-3-8b bf16,nvfp4 32 4096
