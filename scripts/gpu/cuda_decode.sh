#!/usr/bin/env bash
# The CUDA (NVRTC) decode split kernel on the GPU: correctness tests, then one bench run against
# the Triton kernel and bf16 SDPA, then a split-count sweep. Results under $OUT.
# Usage (GPU machine, repo root): bash scripts/gpu/cuda_decode.sh [SHAPES] [FORMATS] [SPLITS]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SHAPES=${1:-1x32k,32x32k}
FORMATS=${2:-fp8-tensor,fp8-token,nvfp4,fp8-token/nvfp4}
SPLITS=${3:-"1 2 3 4 8 16 33 66 132"}
python3 -m pytest -q -p no:cacheprovider tests/kernels/test_gpu_cuda_decode.py 2>&1 | tee "$OUT/tests_cuda.txt" | tail -25
python3 -m kvwire.bench.attention --formats "$FORMATS" --shapes "$SHAPES" --backends cuda,triton \
    --no-dequant-baseline --out "$OUT/attention.json" 2>&1 | tee "$OUT/attention.txt" | tail -30
python3 - "$FORMATS" "$SHAPES" "$SPLITS" <<'PY' 2>&1 | tee "$OUT/splits.txt"
import sys, torch
from kvwire.bench.attention import build_problem, copies_for, parse_shape, time_graph
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels import paged_decode_cuda
from kvwire.kernels.paged_decode import kv_bytes_read, paged_decode_attention
formats, shapes, splits = sys.argv[1].split(","), [parse_shape(s) for s in sys.argv[2].split(",")], sys.argv[3].split()
for b, ctx in shapes:
    for name in formats:
        f = PageFormat(KVFormat.parse(name), 16, 1, 8, 128)
        prob = build_problem(f, b, ctx, 32, "cuda")
        k = paged_decode_cuda.kernel_for(f, 32, prob.args[0].dtype, prob.args[0].device)
        nbytes = kv_bytes_read(f, prob.total_pages, prob.tail_tokens)
        probs = [prob] + [build_problem(f, b, ctx, 32, "cuda", seed=i + 1) for i in range(copies_for(nbytes) - 1)]
        dflt = paged_decode_cuda.default_splits(b, 8, prob.args[4].shape[1], prob.args[0].device)
        res = []
        for s in splits:
            fns = [(lambda pr=pr, s=int(s): paged_decode_attention(*pr.args, out=pr.out, backend="cuda", num_splits=s)) for pr in probs]
            fns[0](); torch.cuda.synchronize()
            ms = time_graph(fns, 10)
            res.append(f"{s}:{ms:.4f}")
        print(f"{b}x{ctx} {name} regs={k.num_regs} default_splits={dflt} " + " ".join(res), flush=True)
        del probs, prob; torch.cuda.empty_cache()
PY
