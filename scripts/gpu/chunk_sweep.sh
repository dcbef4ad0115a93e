#!/usr/bin/env bash
# Tile-shape sweep of paged_chunk_attention: 512-token chunk after an 8k prefix, one layer.
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 - <<'PY'
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels.chunk_attention import benchmark
for name in ("bf16", "fp8-token", "nvfp4"):
    f = PageFormat(KVFormat.parse(name), 16, 1, 8, 128)
    for rows, bn, w, st in ((64, 32, 4, 2), (128, 64, 8, 2), (128, 64, 4, 2), (64, 64, 4, 3), (128, 32, 4, 3), (128, 128, 8, 2)):
        try:
            r = benchmark(f, prefix=8192, chunk=512, rows=rows, block_n=bn, num_warps=w, num_stages=st)
            print(f"{name:10s} rows={rows:3d} BN={bn:3d} warps={w} stages={st}: {r['ms']:.3f} ms {r['tflops']:.0f} TFLOP/s", flush=True)
        except Exception as e:
            print(f"{name:10s} rows={rows} BN={bn} warps={w} stages={st}: FAILED {type(e).__name__} {str(e)[:150]}", flush=True)
PY
