#!/usr/bin/env bash
# Launch-configuration sweep of the decode kernel at one shape (default 32x32k), one layer.
# Usage (on the GPU machine, repo root): bash scripts/gpu/sweep.sh [FORMATS] [SHAPE] [CONFIGS]
#   CONFIGS: space-separated BN:warps:stages:packed[:splits], e.g. "64:4:3:1 128:4:3:0"
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
FORMATS=${1:-bf16,fp8-tensor,fp8-token,nvfp4,fp8-token/nvfp4}
SHAPE=${2:-32x32k}
CONFIGS=${3:-"32:4:3:1 64:4:3:1 128:4:3:0"}
python3 - "$FORMATS" "$SHAPE" "$CONFIGS" <<'PY'
import sys, time, torch
from kvwire.bench.attention import build_problem, parse_shape, rotated_copies, time_graph
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels.paged_decode import paged_decode_attention, default_config
formats, shape, configs = sys.argv[1].split(","), parse_shape(sys.argv[2]), sys.argv[3].split()
b, ctx = shape
for name in formats:
    f = PageFormat(KVFormat.parse(name), 16, 1, 8, 128)
    prob = build_problem(f, b, ctx, 32, "cuda")
    probs, nbytes = rotated_copies(prob, f, b, ctx, 32, "cuda")
    print(name, "default", default_config(f, b, prob.args[4].shape[1], torch.device("cuda")), flush=True)
    for c in configs:
        parts = [int(x) for x in c.split(":")]
        kw = dict(block_n=parts[0], num_warps=parts[1], num_stages=parts[2])
        kw["packed"] = bool(parts[3])
        if len(parts) > 4:
            kw["num_splits"] = parts[4]
        t = time.time()
        try:
            paged_decode_attention(*prob.args, out=prob.out, **kw); torch.cuda.synchronize()
            ct = time.time() - t
            ms = time_graph([(lambda pr=pr: paged_decode_attention(*pr.args, out=pr.out, **kw)) for pr in probs], 20)
            print(f"  {name:16s} {c:12s} {ms:.4f} ms {nbytes / ms / 1e9:.2f} TB/s (compile+first {ct:.1f}s)", flush=True)
        except Exception as e:  # a config that does not compile (e.g. out of shared memory)
            print(f"  {name:16s} {c:12s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
    del prob, probs
    torch.cuda.empty_cache()
PY
