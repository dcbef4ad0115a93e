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
# Optional: CUDA kernel at other chunks per thread and division steps, e.g. CPL_SWEEP="2 4 8" STEPS_SWEEP="1 2".
if [ -n "${CPL_SWEEP:-}" ]; then
  python3 - "$FORMATS" "$CPL_SWEEP" "${STEPS_SWEEP:-2}" <<'PY' 2>&1 | tee "$OUT/cpl_sweep.txt"
import sys, torch
from kvwire.bench.attention import time_graph
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels import quantize_cuda
from kvwire.kernels.quantize import write_pages, written_bytes
n, h, d = 2048, 8, 128
xs = [torch.randn((n, 16, h, d), device="cuda").to(torch.bfloat16) for _ in range(8)]
for name in sys.argv[1].split(","):
    f = PageFormat(KVFormat.parse(name), 16, 1, h, d)
    if not quantize_cuda.supports(f, 0, xs[0], xs[0]):
        continue
    pools = [torch.zeros((2 * n, f.page_bytes), dtype=torch.uint8, device="cuda") for _ in xs]
    ids = torch.randperm(2 * n, device="cuda")[:n]
    static = torch.full((h,), 0.01, device="cuda")
    for cpl, steps in [(int(c), int(t)) for c in sys.argv[2].split() for t in sys.argv[3].split()]:
        quantize_cuda.CHUNKS_PER_THREAD[f.kv.key.element] = cpl
        quantize_cuda.DIVISION_STEPS = steps
        if quantize_cuda.chunks_per_thread(f, 0) != cpl:
            continue
        fns = [(lambda p=p, x=x: write_pages(p, f, 0, 0, ids, x, static, check_finite=False, backend="cuda"))
               for p, x in zip(pools, xs)]
        ms = time_graph(fns, 20)
        k = quantize_cuda.kernel_for(f, 0, False, xs[0].device)
        tb = (xs[0].numel() * 2 + written_bytes(f, 0, n)) / ms / 1e9
        print(f"{name:11s} CPL={cpl} steps={steps} regs={k.num_regs} blocks/SM={k.blocks_per_sm(16 * d // (8 * quantize_cuda.chunks_per_thread(f, 0)))} {ms * 1e3:.1f} us {tb:.2f} TB/s", flush=True)
    del pools
PY
fi
# Optional: compile-time variants of the NVFP4 path (quantize_cuda.TUNING), interleaved as listed,
# e.g. VARIANTS="default NOCLAMP=1,AMAX2=1 default NOCLAMP=1,AMAX2=1"; the copy rate is measured once.
if [ -n "${VARIANTS:-}" ]; then
  python3 - "$VARIANTS" <<'PY' 2>&1 | tee "$OUT/variants.txt"
import sys, torch
from kvwire.bench.attention import copy_bandwidth, time_graph
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels import quantize_cuda
from kvwire.kernels.quantize import write_pages, written_bytes
n, h, d = 2048, 8, 128
bw = copy_bandwidth(device="cuda")["tb_per_s"]
xs = [torch.randn((n, 16, h, d), device="cuda").to(torch.bfloat16) for _ in range(8)]
f = PageFormat(KVFormat.parse("nvfp4"), 16, 1, h, d)
pools = [torch.zeros((2 * n, f.page_bytes), dtype=torch.uint8, device="cuda") for _ in xs]
ids = torch.randperm(2 * n, device="cuda")[:n]
static = torch.full((h,), 0.01, device="cuda")
print(f"copy rate {bw:.2f} TB/s", flush=True)
for var in sys.argv[1].split():
    quantize_cuda.TUNING.clear()
    if var != "default":
        quantize_cuda.TUNING.update({k: int(v) for k, v in (kv.split("=") for kv in var.split(","))})
    fns = [(lambda p=p, x=x: write_pages(p, f, 0, 0, ids, x, static, check_finite=False, backend="cuda"))
           for p, x in zip(pools, xs)]
    ms = time_graph(fns, 20)
    k = quantize_cuda.kernel_for(f, 0, False, xs[0].device)
    tb = (xs[0].numel() * 2 + written_bytes(f, 0, n)) / ms / 1e9
    print(f"nvfp4 {var:28s} regs={k.num_regs} {ms * 1e3:.1f} us {tb:.2f} TB/s {100 * tb / bw:.1f}% of copy", flush=True)
quantize_cuda.TUNING.clear()
PY
fi
