#!/usr/bin/env bash
# Split-KV chunk attention on the GPU: correctness tests (chunk attention at every split mode and
# tile, plus the other Triton-path and engine GPU tests), a sweep of tile shape x split count, then
# `kvwire bench chunk`. Results in $OUT.
# Usage (GPU machine, repo root): bash scripts/gpu/chunk_split.sh [FORMATS] [PREFIXES] [CHUNKS]
#   TILES="ROWSxBNxWARPSxSTAGES ..." the sweep's tile shapes; SKIP_TESTS=1 / SKIP_SWEEP=1 / SKIP_BENCH=1 leave a part out.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
FORMATS=${1:-bf16,fp8-token,nvfp4,fp8-token/nvfp4}
PREFIXES=${2:-8k,32k}
CHUNKS=${3:-512,64}
if [ -z "${SKIP_TESTS:-}" ]; then
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} python3 -m pytest -q -p no:cacheprovider -n ${TEST_WORKERS:-4} --durations=8 \
      tests/kernels/test_gpu.py tests/kvwire/test_engine_gpu.py tests/kvwire/test_runner_batch.py \
      2>&1 | tee "$OUT/tests_chunk.txt" | tail -25
fi
if [ -z "${SKIP_SWEEP:-}" ]; then
python3 - "$FORMATS" "$PREFIXES" "$CHUNKS" <<'PY' 2>&1 | tee "$OUT/chunk_sweep.txt"
import os, sys, torch
from kvwire.bench.attention import time_graph
from kvwire.bench.chunk import causal_flops, stored_pages
from kvwire.bench.sizes import token_count
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels.chunk_attention import paged_chunk_attention
from kvwire.kernels.chunk_plan import planned_splits
TILES = [tuple(int(x) for x in t.split('x')) for t in os.environ.get('TILES', '64x32x4x2 128x64x8x2 128x128x8x2').split()]
dev, hq, h, d, p = torch.device("cuda"), 32, 8, 128, 16
gen = torch.Generator(device=dev).manual_seed(0)
for prefix, n in [(token_count(a), int(c)) for a in sys.argv[2].split(",") for c in sys.argv[3].split(",")]:
    total = prefix + n
    q = torch.randn((n, hq, d), device=dev, generator=gen).to(torch.bfloat16)
    pos = torch.arange(prefix, total, device=dev)
    kv = torch.randn((2, total, h, d), device=dev, generator=gen).to(torch.bfloat16)
    flops = causal_flops(n, prefix, hq, d)
    for name in sys.argv[1].split(","):
        f = PageFormat(KVFormat.parse(name), p, 1, h, d)
        npg = total // p
        st, ids, static = stored_pages(f, kv[0], kv[1], gen)
        out = torch.empty_like(q)
        for rows, bn, w, stg in TILES:
            base = planned_splits(n, hq, f, npg, dev, (rows, bn, w, stg))
            res = []
            for s in sorted({1, 2, base, 2 * base}):
                try:
                    ms = time_graph([lambda: paged_chunk_attention(q, pos, st, f, 0, ids, kv[0, prefix:], kv[1, prefix:],
                                     prefix, static, out=out, rows=rows, block_n=bn, num_warps=w, num_stages=stg,
                                     num_splits=s)], 20)
                    res.append(f"s={s}{'*' if s == base else ''}: {ms:.3f} ms {flops / ms / 1e9:.0f} TF")
                except Exception as e:
                    res.append(f"s={s}: FAILED {type(e).__name__} {str(e)[:80]}")
            print(f"prefix {prefix:6d} chunk {n:4d} {name:16s} rows={rows:3d} BN={bn:3d} w={w} st={stg} | " + " | ".join(res), flush=True)
        del st
PY
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  python3 -m kvwire.bench.chunk --prefixes "$PREFIXES" --chunks "$CHUNKS" --out "$OUT/chunk.json" 2>&1 | tee "$OUT/chunk.txt" | tail -20
fi
