"""Sweeps of the CUDA decode split kernel (kvwire/kernels/paged_decode_cuda.py), against bf16 SDPA in the same run.

Each point is graph-timed over rotated copies of the problem (together past L2, so every call reads
HBM) and printed as ms(TB/s of compact KV, speedup vs SDPA). Two kinds:
  variants SHAPES FORMATS "SPLITS" "VARIANTS"   compile-time variants x split counts. VARIANTS:
        space-separated KEY=V,KEY=V overrides of paged_decode_cuda.tuning_for, or "default"
        (e.g. "default DEPTH=2 DEPTH=3,MINB=3"); SPLITS: counts, 0 = the default choice
  placement SHAPE FORMATS                        page placement in the pool, for the kernel and its
        memory-path probe (PROBE_LOADS=1): page tables as kvwire bench attention draws them (a
        random permutation), in shuffled runs of 64 and of 8 consecutive pages, and sequential
  align SHAPE FORMATS "LINES"                    the page layout's data-section and page-size alignment
        (formats.LINE: 128 since format version 2; 16 puts pages and data off the 128-byte line
        as version 1 did), kernel and memory-path probe, each twice, interleaved
  pages SHAPE FORMATS "SIZES"                    page sizes (tokens): 16, and 32 / 64, whose 16-token
        tiles a block's warps share (PT in the kernel), each twice, interleaved

Usage (GPU machine, repo root, PYTHONPATH=$PWD):
    python3 scripts/gpu/decode_sweep.py variants 32x32k nvfp4,fp8-token "0 10 18" "default DEPTH=2"
    python3 scripts/gpu/decode_sweep.py placement 32x32k fp8-token,nvfp4
    python3 scripts/gpu/decode_sweep.py align 32x32k nvfp4,fp8-token/nvfp4 "16 128"
    python3 scripts/gpu/decode_sweep.py pages 32x32k fp8-token/nvfp4,nvfp4 "16 32 64"
(scripts/gpu/cuda_decode.sh runs the first after the GPU tests and the bench.)
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from kvwire import formats as page_formats
from kvwire.bench.attention import build_problem, parse_shape, rotated_copies, time_graph, time_sdpa
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels import paged_decode_cuda as pdc
from kvwire.kernels.paged_decode import paged_decode_attention

HQ, HKV, D = 32, 8, 128


class Shape:
    """One (batch, context): its SDPA time, measured once, and a formatter for timed points."""

    def __init__(self, text: str) -> None:
        self.batch, self.context = parse_shape(text)
        self.sdpa = min(time_sdpa(self.batch, self.context, HQ, HKV, D, quick=True)[0].values())
        print(f"{self.batch}x{self.context} bf16 SDPA {self.sdpa:.4f} ms (same run)", flush=True)

    def problems(self, name: str, page_size: int = 16):
        """(format, the first problem, rotated copies, compact bytes read per call)."""
        f = PageFormat(KVFormat.parse(name), page_size, 1, HKV, D)
        prob = build_problem(f, self.batch, self.context, HQ, "cuda")
        probs, nbytes = rotated_copies(prob, f, self.batch, self.context, HQ, "cuda")
        return f, prob, probs, nbytes

    def point(self, label, fns: list[Callable[[], object]], nbytes: int) -> str:
        """``label:ms(TB/s,x)``, or ``label:fails(...)`` when the first call raises."""
        try:
            fns[0]()
            torch.cuda.synchronize()
        except RuntimeError as e:      # e.g. a deep-grid kernel of this variant that does not build
            return f"{label}:fails({str(e).splitlines()[-1][:80]})"
        ms = time_graph(fns, 10)
        return f"{label}:{ms:.4f}({nbytes / ms / 1e9:.2f}TB/s,{self.sdpa / ms:.2f}x)"


def set_tuning(variant: str, table: dict[str, int] = pdc.TUNING) -> None:
    """Overrides ``table`` (a kernel module's TUNING) with a variant's "K=V,K=V" ("default": none)."""
    table.clear()
    if variant != "default":
        table.update({k: int(v) for k, v in (kv.split("=") for kv in variant.split(","))})


def variants(shapes: list[str], formats: list[str], splits: list[int], names: list[str]) -> None:
    for text in shapes:
        shape = Shape(text)
        for name in formats:
            f, prob, probs, nbytes = shape.problems(name)
            for var in names:
                set_tuning(var)
                try:
                    k = pdc.kernel_for(f, HQ, prob.args[0].dtype, prob.args[0].device)
                except RuntimeError as e:          # e.g. a ring that does not fit in shared memory
                    print(f"{text} {name:16s} {var:18s} does not build: {str(e).splitlines()[-2:]}", flush=True)
                    continue
                dflt = pdc.default_splits(k, shape.batch, HKV, prob.args[4].shape[1], prob.args[0].device)
                res = [shape.point(s or dflt, [(lambda pr=pr, s=s or dflt: paged_decode_attention(
                    *pr.args, out=pr.out, backend="cuda", num_splits=s)) for pr in probs], nbytes) for s in splits]
                tun = ",".join(f"{a}={v}" for a, v in pdc.tuning_for(f).items())
                print(f"{text} {name:16s} {var:26s} [{tun}] regs={k.num_regs} blocks/SM={k.blocks_per_sm(128)} "
                      f"default={dflt} " + " ".join(res), flush=True)
            del probs, prob
            torch.cuda.empty_cache()
    pdc.TUNING.clear()


def placed(prob, run: int, seed: int) -> list:
    """The problem's arguments with its page table rebuilt: runs of ``run`` consecutive ids in
    shuffled order (0: sequential)."""
    pt = prob.args[4]
    b, n = pt.shape
    total = b * n
    ids = torch.arange(total, device=pt.device, dtype=torch.int32)
    if run:
        gen = torch.Generator(device=pt.device).manual_seed(seed)
        order = torch.randperm(-(-total // run), device=pt.device, generator=gen)
        ids = (order.view(-1, 1) * run + torch.arange(run, device=pt.device)).view(-1)
        ids = ids[ids < total].int()
    args = list(prob.args)
    args[4] = ids.view(b, n).contiguous()
    return args


def placement(text: str, formats: list[str]) -> None:
    shape = Shape(text)
    for name in formats:
        _, prob, probs, nbytes = shape.problems(name)
        for _ in range(2):
            for probe in (0, 1):
                set_tuning(f"PROBE_LOADS={probe}")
                res = []
                for label, run in (("random", None), ("runs-64", 64), ("runs-8", 8), ("sequential", 0)):
                    argss = [pr.args if run is None else placed(pr, run, i) for i, pr in enumerate(probs)]
                    res.append(shape.point(label, [(lambda a=a, pr=pr: paged_decode_attention(
                        *a, out=pr.out, backend="cuda")) for a, pr in zip(argss, probs)], nbytes))
                print(f"{text} {name:16s} {'probe' if probe else 'kernel':6s} " + " ".join(res), flush=True)
        del probs, prob
        torch.cuda.empty_cache()
    pdc.TUNING.clear()


def cuda_calls(probs) -> list[Callable[[], object]]:
    """One CUDA-kernel decode call per problem copy, into its own output (for ``Shape.point``)."""
    return [(lambda pr=pr: paged_decode_attention(*pr.args, out=pr.out, backend="cuda")) for pr in probs]


def cuda_vs_triton(prob) -> float:
    """Largest absolute difference between the CUDA and the Triton kernel's outputs for ``prob``."""
    cuda = paged_decode_attention(*prob.args, backend="cuda").float()
    return (cuda - paged_decode_attention(*prob.args, backend="triton").float()).abs().max().item()


def alignment(text: str, formats: list[str], lines: list[int]) -> None:
    """Each format laid out with each data-section alignment (a new PageFormat per arm: its layout
    is computed from formats.LINE when first used), kernel and memory-path probe, two rounds."""
    shape = Shape(text)
    shipped = page_formats.LINE
    try:
        for name in formats:
            for _ in range(2):
                for line in lines:
                    page_formats.LINE = line
                    f, prob, probs, nbytes = shape.problems(name)
                    res = []
                    for probe in (0, 1):
                        set_tuning(f"PROBE_LOADS={probe}")
                        res.append(shape.point("probe" if probe else "kernel", cuda_calls(probs), nbytes))
                    pdc.TUNING.clear()
                    diff = cuda_vs_triton(prob)
                    print(f"{text} {name:16s} line={line:<4d} page_bytes={f.page_bytes} cuda-vs-triton={diff:.1e} "
                          + " ".join(res), flush=True)
                    del probs, prob
                    torch.cuda.empty_cache()
    finally:
        page_formats.LINE = shipped
        pdc.TUNING.clear()


def page_sizes(text: str, formats: list[str], sizes: list[int]) -> None:
    """Each format at each page size (16, and 32 / 64: tiles shared by a block's warps), the kernel
    at its default splits, two rounds interleaved; the bf16 tail is one page long at every size."""
    shape = Shape(text)
    for name in formats:
        for _ in range(2):
            for size in sizes:
                f, prob, probs, nbytes = shape.problems(name, size)
                point = shape.point("kernel", cuda_calls(probs), nbytes)
                diff = cuda_vs_triton(prob)
                print(f"{text} {name:16s} page={size:<3d} page_bytes={f.page_bytes} cuda-vs-triton={diff:.1e} {point}",
                      flush=True)
                del probs, prob
                torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="kind", required=True)
    v = sub.add_parser("variants", help="compile-time variants x split counts")
    v.add_argument("shapes", help="comma-separated BxCTX, e.g. 1x32k,32x32k")
    v.add_argument("formats", help="comma-separated KV formats, e.g. fp8-token,nvfp4")
    v.add_argument("splits", nargs="?", default="0", help='split counts, 0 = the default choice, e.g. "0 10 18"')
    v.add_argument("variants", nargs="?", default="default", help='e.g. "default DEPTH=2 DEPTH=3,MINB=3"')
    p = sub.add_parser("placement", help="page placement, kernel and memory-path probe")
    p.add_argument("shape", nargs="?", default="32x32k")
    p.add_argument("formats", nargs="?", default="fp8-tensor,fp8-token,nvfp4,fp8-token/nvfp4")
    a = sub.add_parser("align", help="data-section alignment of the page layout, kernel and memory-path probe")
    a.add_argument("shape", nargs="?", default="32x32k")
    a.add_argument("formats", nargs="?", default="nvfp4,fp8-token/nvfp4,fp8-tensor/nvfp4,fp8-token")
    a.add_argument("lines", nargs="?", default="16 128")
    g = sub.add_parser("pages", help="page sizes of 16, 32 and 64 tokens, the kernel")
    g.add_argument("shape", nargs="?", default="32x32k")
    g.add_argument("formats", nargs="?", default="fp8-token/nvfp4,fp8-tensor/nvfp4,nvfp4,fp8-token,fp8-tensor")
    g.add_argument("sizes", nargs="?", default="16 32 64")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("decode_sweep: needs a CUDA GPU")
    if args.kind == "variants":
        variants(args.shapes.split(","), args.formats.split(","), [int(s) for s in args.splits.split()],
                 args.variants.split())
    elif args.kind == "pages":
        page_sizes(args.shape, args.formats.split(","), [int(x) for x in args.sizes.split()])
    elif args.kind == "align":
        alignment(args.shape, args.formats.split(","), [int(x) for x in args.lines.split()])
    else:
        placement(args.shape, args.formats.split(","))


if __name__ == "__main__":
    main()
