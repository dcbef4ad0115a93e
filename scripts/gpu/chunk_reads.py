"""How fast a GPU reads scattered fixed-size chunks: the decode page walk without the kernel.

Two Triton probes over a 4 GiB fp32 buffer (past L2), each program reducing what it reads to one
maximum, so that nearly every byte moved is a read:
  tiles  one chunk of 512 B - 16 KB per program, in order or in a random permutation (below 4 KB
         the launch of one program per chunk, not the memory, sets the rate);
  walk   the decode kernel's access pattern: programs of (32 sequences x 18 splits x 8 KV heads),
         each walking 112 pages of a random (or sequential) page list and reading its head's 2 KB
         slice of two 16 KB sections per page (an fp8 page of 8 heads, D = 128); "walk4" reads 4
         pages per step, one per warp, as the CUDA kernel's warps do.
  layouts  the same walk over each section of real page layouts (kvwire.formats.PageFormat at 8 KV
         heads, D = 128: every head's slice of data and scale sections, as the decode kernel reads
         them), for version 2 (LINE = 128) and with version 1's 16-byte page size (LINE = 16).
  heads    version 2 against a head-major placement of the same slices (each head's data and scales
         of one layer contiguous, the block padded to 128 bytes): what such a format could gain.
  pages    version 2 at 16, 32 and 64 tokens a page, each program walking the same 2,048 tokens: what
         larger pages (larger slices, fewer page-table reads) could gain.
  scales   version 2 against the same page with each head's small per-token sections side by side:
         fp8-token's K and V token scales as one 128-byte line per head instead of two 64-byte
         halves of two lines, fp8-token/nvfp4's K token scales beside its V block scales (192
         bytes per head, one run): what pairing them in the format could gain.
What the walk reaches is what an fp8 page walk could read with this placement; the CUDA kernel's
memory-path probe (PROBE_LOADS=1, scripts/gpu/decode_sweep.py) is compared against it in
docs/benchmarks.md (session 29). Usage (GPU machine): python3 scripts/gpu/chunk_reads.py [walk|layouts|heads|pages|scales] [--out F]
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


@triton.jit
def _sec(acc, x, pg, h, OFF: tl.constexpr, HS: tl.constexpr, C: tl.constexpr, PAGE: tl.constexpr):
    p = x + pg[:, None] * PAGE + OFF + h * HS + tl.arange(0, C)[None, :]
    return tl.maximum(acc, tl.load(p))


@triton.jit
def _walk_sections(x, ids, out, NPG: tl.constexpr, PAGE: tl.constexpr, HEADS: tl.constexpr, PPI: tl.constexpr,
                   O0: tl.constexpr, S0: tl.constexpr, C0: tl.constexpr, O1: tl.constexpr, S1: tl.constexpr,
                   C1: tl.constexpr, O2: tl.constexpr, S2: tl.constexpr, C2: tl.constexpr, O3: tl.constexpr,
                   S3: tl.constexpr, C3: tl.constexpr, O4: tl.constexpr, S4: tl.constexpr, C4: tl.constexpr):
    """Up to five sections per page (offset, head stride, size in fp32 units; size 0: absent)."""
    pid = tl.program_id(0)
    h = pid % HEADS
    base = pid // HEADS
    a0 = tl.full([PPI, C0], -1e30, tl.float32)
    a1 = tl.full([PPI, C1], -1e30, tl.float32)
    a2 = tl.full([PPI, C2 if C2 > 0 else 1], -1e30, tl.float32)
    a3 = tl.full([PPI, C3 if C3 > 0 else 1], -1e30, tl.float32)
    a4 = tl.full([PPI, C4 if C4 > 0 else 1], -1e30, tl.float32)
    for i in range(0, NPG, PPI):
        pg = tl.load(ids + base * NPG + i + tl.arange(0, PPI)).to(tl.int64)
        a0 = _sec(a0, x, pg, h, O0, S0, C0, PAGE)
        a1 = _sec(a1, x, pg, h, O1, S1, C1, PAGE)
        if C2 > 0:
            a2 = _sec(a2, x, pg, h, O2, S2, C2, PAGE)
        if C3 > 0:
            a3 = _sec(a3, x, pg, h, O3, S3, C3, PAGE)
        if C4 > 0:
            a4 = _sec(a4, x, pg, h, O4, S4, C4, PAGE)
    m = tl.maximum(tl.max(tl.max(a0, axis=1), axis=0), tl.max(tl.max(a1, axis=1), axis=0))
    m = tl.maximum(m, tl.maximum(tl.max(tl.max(a2, axis=1), axis=0), tl.max(tl.max(a3, axis=1), axis=0)))
    tl.store(out + pid, tl.maximum(m, tl.max(tl.max(a4, axis=1), axis=0)))


def layout_sections(name: str, line: int, tokens: int = 16) -> tuple[int, list[tuple[int, int, int]], int]:
    """(page size, [(offset, head stride, size)] in fp32 units, bytes read per page and head) of
    format ``name`` at 8 KV heads, D = 128, one layer, ``tokens`` per page, laid out with
    formats.LINE = ``line``."""
    from kvwire import formats
    old, formats.LINE = formats.LINE, line
    try:
        f = formats.PageFormat(formats.KVFormat.parse(name), tokens, 1, 8, 128)
        secs = []
        for part in (0, 1):
            for sec_name, shape, _ in f.part_format(part).sections(tokens, 8, 128):
                s = f.section(0, part, sec_name)
                per_head = s.nbytes // shape[0]
                secs.append((s.offset // 4, per_head // 4 if per_head >= 4 else 0, max(1, per_head // 4)))
        secs = secs[:5]      # nvfp4's sixth, V's 4-byte global scale, shares K's 32-byte sector
        return f.page_bytes // 4, secs, sum(4 * c for _, _, c in secs)
    finally:
        formats.LINE = old


PAGE_TOKENS = (16, 32, 64)     # "pages": each program reads the same tokens in 128, 64 or 32 pages


def head_major_sections(name: str) -> tuple[int, list[tuple[int, int, int]], int]:
    """As layout_sections, with each head's slices of every section in one block per head (data,
    then scales, in version 2's order), blocks padded to 128 bytes: a layout kvwire does not use."""
    from kvwire import formats
    f = formats.PageFormat(formats.KVFormat.parse(name), 16, 1, 8, 128)
    found = [(f.section(0, part, sec_name), shape[0]) for part in (0, 1)
             for sec_name, shape, _ in f.part_format(part).sections(16, 8, 128)]
    per_head = [sec.nbytes // heads for sec, heads in sorted(found, key=lambda x: x[0].offset)]
    block = -(-sum(per_head) // 128) * 128
    secs, off = [], 0
    for nbytes in per_head:
        secs.append((off // 4, block // 4, nbytes // 4))
        off += nbytes
    secs = secs[:5]
    return 8 * block // 4, secs, sum(4 * c for _, _, c in secs)


PAIRED = {"fp8-token": (1, 3), "fp8-token/nvfp4": (1, 3)}   # "scales": the sections laid side by side


def paired_scale_sections(name: str) -> tuple[int, list[tuple[int, int, int]], int]:
    """As layout_sections (version 2), with the two per-token scale sections of PAIRED[name] (K's
    and V's, adjacent in version 2) interleaved by head: head h's slice of the first, then of the
    second, then head h + 1's. Same page, same bytes read; a layout kvwire does not use."""
    page, secs, per = layout_sections(name, 128)
    i, j = PAIRED[name]
    (o0, s0, c0), (o1, s1, c1) = secs[i], secs[j]
    if o1 != o0 + 8 * s0 or s0 != c0 or s1 != c1:
        raise ValueError(f"{name}: sections {i} and {j} are not two adjacent per-head sections")
    secs = list(secs)
    secs[i], secs[j] = (o0, c0 + c1, c0), (o0 + c0, c0 + c1, c1)
    return page, secs, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", default="all", choices=["all", "walk", "layouts", "heads", "pages", "scales"])
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
    if args.mode in ("layouts", "heads", "pages", "scales"):
        rows, splits, tokens_per_program, heads = 32, 16, 2048, 8
        grid = rows * splits * heads
        out = torch.empty(grid, device="cuda")
        if args.mode == "layouts":
            cases = [(f"{n} line={line}", lambda n=n, line=line: layout_sections(n, line), 16)
                     for n in ("bf16", "fp8-tensor", "fp8-token", "fp8-token/nvfp4", "fp8-tensor/nvfp4", "nvfp4")
                     for line in (16, 128)]
        elif args.mode == "pages":
            cases = [(f"{n} tokens={t}", lambda n=n, t=t: layout_sections(n, 128, t), t)
                     for _ in range(2) for n in ("fp8-tensor", "fp8-token", "fp8-token/nvfp4", "nvfp4")
                     for t in PAGE_TOKENS]
        elif args.mode == "scales":
            cases = [(f"{n} {kind}", lambda n=n, kind=kind: (layout_sections(n, 128) if kind == "v2"
                                                             else paired_scale_sections(n)), 16)
                     for _ in range(2) for n in ("fp8-tensor", "fp8-token", "fp8-token/nvfp4") for kind in ("v2", "paired")
                     if kind == "v2" or n in PAIRED]
        else:
            cases = [(f"{n} {kind}", lambda n=n, kind=kind: (layout_sections(n, 128) if kind == "v2"
                                                             else head_major_sections(n)), 16)
                     for _ in range(2) for n in ("fp8-token", "fp8-token/nvfp4", "fp8-tensor/nvfp4", "nvfp4")
                     for kind in ("v2", "head-major")]
        for label, layout, tokens in cases:          # (what it is, its sections, tokens a page)
            page, secs, per = layout()
            npg = tokens_per_program // tokens
            n = rows * splits * npg
            ids = torch.randperm(x.numel() // page, device="cuda")[:n].int()
            kw = {}
            for k, (o, hs, c) in enumerate(secs + [(0, 0, 0)] * (5 - len(secs))):
                kw.update({f"O{k}": o, f"S{k}": hs, f"C{k}": c})
            for ppi, warps in ((4, 4), (4, 8)):
                record(f"{args.mode} {label} page={4 * page}B warps={warps}", grid * npg * per,
                       lambda: _walk_sections[(grid,)](x, ids, out, NPG=npg, PAGE=page, HEADS=heads, PPI=ppi,
                                                       num_warps=warps, num_stages=1, **kw))
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)
        return
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
