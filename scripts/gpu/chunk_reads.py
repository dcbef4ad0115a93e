"""How fast a GPU reads scattered fixed-size chunks: the decode page walk without the kernel.

Two Triton probes over a 4 GiB fp32 buffer (past L2), each program reducing what it reads to one
maximum, so that nearly every byte moved is a read:
  tiles  one chunk of 512 B - 16 KB per program, in order or in a random permutation (below 4 KB
         the launch of one program per chunk, not the memory, sets the rate);
  walk   the decode kernel's access pattern: programs of (32 sequences x 18 splits x 8 KV heads),
         each walking 112 pages of a random (or sequential) page list and reading its head's 2 KB
         slice of two 16 KB sections per page (an fp8 page of 8 heads, D = 128); "walk4" reads 4
         pages per step, one per warp, as the CUDA kernel's warps do.
What the walk reaches is what an fp8 page walk could read with this placement; the CUDA kernel's
memory-path probe (PROBE_LOADS=1, scripts/gpu/decode_sweep.py) is compared against it in
docs/benchmarks.md (session 29). Usage (GPU machine): python3 scripts/gpu/chunk_reads.py [walk] [--out F]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from triton.testing import do_bench


@triton.jit
def _tiles(x, ids, out, C: tl.constexpr):
    pid = tl.program_id(0)
    t = tl.load(ids + pid).to(tl.int64)
    tl.store(out + pid, tl.max(tl.load(x + t * C + tl.arange(0, C)), axis=0))


@triton.jit
def _walk(x, ids, out, NPG: tl.constexpr, PAGE: tl.constexpr, SEC: tl.constexpr, C: tl.constexpr,
          HEADS: tl.constexpr, PPI: tl.constexpr):
    pid = tl.program_id(0)
    h = pid % HEADS
    base = pid // HEADS
    acc = tl.full([PPI, C], -1e30, tl.float32)
    for i in range(0, NPG, PPI):
        pg = tl.load(ids + base * NPG + i + tl.arange(0, PPI)).to(tl.int64)
        p = x + pg[:, None] * PAGE + h * C + tl.arange(0, C)[None, :]
        acc = tl.maximum(acc, tl.load(p))
        acc = tl.maximum(acc, tl.load(p + SEC))
    tl.store(out + pid, tl.max(tl.max(acc, axis=1), axis=0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", default="all", choices=["all", "walk"])
    ap.add_argument("--out", default="chunk_reads.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("chunk_reads.py needs a CUDA GPU")
    x = torch.empty((4 << 30) // 4, dtype=torch.float32, device="cuda").normal_()
    results = []

    def record(case: str, nbytes: int, fn) -> None:
        ms = do_bench(fn, warmup=10, rep=60, return_mode="median")
        results.append({"case": case, "ms": ms, "tb_per_s": nbytes / ms / 1e9})
        print(json.dumps(results[-1]), flush=True)

    for cb in ((512, 1024, 2048, 4096, 16384) if args.mode == "all" else ()):
        c = cb // 4
        n = x.numel() // c
        for order in ("seq", "perm"):
            ids = (torch.arange(n, device="cuda") if order == "seq" else torch.randperm(n, device="cuda")).int()
            out = torch.empty(n, device="cuda")
            for nw in (1, 4):
                record(f"tiles {cb}B {order} warps={nw}", n * cb,
                       lambda: _tiles[(n,)](x, ids, out, C=c, num_warps=nw))
    heads, c = 8, 2048 // 4
    sec = heads * c
    page = 2 * sec + 256                                   # two sections and 1 KB of "scales"
    rows, splits, npg = 32, 18, 112
    grid = rows * splits * heads
    out = torch.empty(grid, device="cuda")
    for place in ("perm", "seq"):
        n = rows * splits * npg
        ids = (torch.randperm(x.numel() // page, device="cuda")[:n] if place == "perm"
               else torch.arange(n, device="cuda")).int()
        for name, ppi, warps in (("walk", 1, 1), ("walk", 1, 4), ("walk4", 4, 4), ("walk4", 4, 8)):
            record(f"{name} {place} 2x2048B warps={warps}", grid * npg * 2 * 2048,
                   lambda: _walk[(grid,)](x, ids, out, NPG=npg, PAGE=page, SEC=sec, C=c, HEADS=heads, PPI=ppi,
                                          num_warps=warps, num_stages=1))
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
