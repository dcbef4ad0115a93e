"""A/B of chunk attention: this tree's kernel against another revision's, interleaved, graph-timed, one run.

Usage (GPU machine, repo root): PYTHONPATH=$PWD python3 scripts/gpu/chunk_ab.py OLD_MODULE [FORMATS] [PREFIXES] [CHUNKS]
OLD_MODULE is an importable copy of the other revision's chunk_attention.py (e.g. written by
`git show REV:kvwire/kernels/chunk_attention.py > kvwire/kernels/chunk_attention_old.py`). Also
times tile shapes of the new kernel given by TILES="ROWSxBNxWARPSxSTAGES ..." and launch options
given by KWARGS="key=int[,key=int] ..." (e.g. "fp8_dot=0"; default: none of either).
"""
import importlib
import os
import sys

import torch

from kvwire.bench.attention import time_graph
from kvwire.bench.chunk import causal_flops, stored_pages
from kvwire.bench.sizes import token_count
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels import chunk_attention as new

old = importlib.import_module(sys.argv[1])
formats = (sys.argv[2] if len(sys.argv) > 2 else "bf16,fp8-tensor,fp8-token,nvfp4,fp8-token/nvfp4").split(",")
prefixes = [token_count(a) for a in (sys.argv[3] if len(sys.argv) > 3 else "32k").split(",")]
chunks = [int(c) for c in (sys.argv[4] if len(sys.argv) > 4 else "512,64").split(",")]
tiles = [tuple(int(x) for x in t.split("x")) for t in os.environ.get("TILES", "").split()]
kwargs = [{k: int(v) for k, v in (kv.split("=") for kv in item.split(","))}
          for item in os.environ.get("KWARGS", "").split()]
dev, hq, h, d, p = torch.device("cuda"), 32, 8, 128, 16
gen = torch.Generator(device=dev).manual_seed(0)
for prefix in prefixes:
    for n in chunks:
        total = prefix + n
        q = torch.randn((n, hq, d), device=dev, generator=gen).to(torch.bfloat16)
        pos = torch.arange(prefix, total, device=dev)
        kv = torch.randn((2, total, h, d), device=dev, generator=gen).to(torch.bfloat16)
        flops = causal_flops(n, prefix, hq, d)
        for name in formats:
            f = PageFormat(KVFormat.parse(name), p, 1, h, d)
            st, ids, static = stored_pages(f, kv[0], kv[1], gen)
            args = (q, pos, st, f, 0, ids, kv[0, prefix:], kv[1, prefix:], prefix, static)
            ref = new.paged_chunk_reference(*args)
            variants = [("old", old.paged_chunk_attention, {}), ("new", new.paged_chunk_attention, {})]
            variants += [(f"new {r}x{bn}x{w}x{s}", new.paged_chunk_attention,
                          {"rows": r, "block_n": bn, "num_warps": w, "num_stages": s}) for r, bn, w, s in tiles]
            variants += [("new " + ",".join(f"{k}={v}" for k, v in kw.items()), new.paged_chunk_attention, kw)
                         for kw in kwargs]
            res = {}
            for rnd in range(2):
                for label, fn, kw in variants:
                    out = torch.empty_like(q)
                    try:
                        ms = time_graph([lambda fn=fn, kw=kw, out=out: fn(*args, out=out, **kw)], 20)
                    except Exception as e:         # a tile that does not fit: say so, go on
                        res[label] = f"FAILED {type(e).__name__} {str(e)[:60]}"
                        continue
                    err = float((out.float() - ref.float()).norm() / ref.float().norm())
                    prev = res.get(label, "")
                    res[label] = f"{prev}{' / ' if prev else ''}{ms:.3f}"
                    if rnd == 1:
                        res[label] += f" ms ({flops / ms / 1e9:.0f} TF, err {err:.1e})"
            cells = " | ".join(f"{k}: {v}" for k, v in res.items())
            print(f"prefix {prefix} chunk {n} {name:16s} | {cells}", flush=True)
            del st
