"""How much of a decode step the reduce kernel costs, and its launch tuned, against bf16 SDPA.

A step is the CUDA split kernel (pages -> fp32 partials) and the Triton reduce kernel (bf16 tail +
log-sum-exp merge of the partials), the reduce launched as a programmatic dependent of the split.
Under ncu (L2 flushed, launches serialised) the reduce took 14 us at 32x32k on an H100, 25% of
DRAM bandwidth, against 755 us for the split: ~2% of the step. Each point here is graph-timed
over rotated copies (as `kvwire bench attention` times): the whole step as shipped, the split
kernel alone, the reduce alone (on partials left by the split), the whole step for each
split-kernel variant (paged_decode_cuda.TUNING) and reduce warp count in two interleaved rounds,
and split + reduce on preallocated partials for each reduce launch (warps x splits merged per
loop iteration, dependent launch on or off).

Usage (GPU machine, repo root, PYTHONPATH=$PWD):
    python3 scripts/gpu/reduce_parts.py 32x32k fp8-token,nvfp4 "2 4 8" "16 64" "default DEPTH=2"
"""
from __future__ import annotations

import argparse
import functools
import math

import torch

from kvwire.bench.attention import build_problem, parse_shape, rotated_copies, time_graph, time_sdpa
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels import paged_decode_cuda as pdc
from kvwire.kernels._common import part_offsets, static_arg
from kvwire.kernels import paged_decode
from kvwire.kernels.paged_decode import LOG2E, paged_decode_attention, reduce_splits

from decode_sweep import set_tuning          # scripts/gpu/ (this script's directory is on sys.path)

HQ, HKV, D = 32, 8, 128


class Step:
    """One problem's split launch and preallocated partials, so the two kernels can run apart."""

    def __init__(self, prob, f: PageFormat) -> None:
        self.prob = prob
        q, _, _, layer, page_table, _, _, _, _, static = prob.args
        self.kernel = pdc.select("cuda", f, HQ, q, True)
        self.splits = pdc.default_splits(self.kernel.regular, q.shape[0], HKV, page_table.shape[1], q.device)
        rows = q.shape[0] * HKV * self.splits * (HQ // HKV)
        self.parts = (torch.empty((rows, D), device=q.device), torch.empty(rows, device=q.device),
                      torch.empty(rows, device=q.device))
        self.static = static_arg(f, static, q.device)
        self.offsets = (part_offsets(f, layer, 0), part_offsets(f, layer, 1))

    def split(self) -> None:
        q, storage, f, layer, page_table, num_pages = self.prob.args[:6]
        pdc.split_partials(self.kernel, q, storage, f, layer, page_table, num_pages, self.static, *self.parts,
                           self.splits, LOG2E / math.sqrt(D), self.offsets)

    def reduce(self, pdl: bool, warps: int, per_iter: int) -> None:
        q, _, f, layer, _, _, tail, tail_slot, tail_len = self.prob.args[:9]
        reduce_splits(q, f, layer, tail, tail_slot, tail_len, self.parts, self.splits, self.prob.out, pdl,
                      num_warps=warps, splits_per_iter=per_iter)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("shape", nargs="?", default="32x32k", help="BATCHxCONTEXT (default 32x32k)")
    ap.add_argument("formats", nargs="?", default="fp8-token,nvfp4", help="comma-separated KV formats")
    ap.add_argument("warps", nargs="?", default="2 4 8", help="reduce num_warps values")
    ap.add_argument("per_iter", nargs="?", default="16 64", help="splits merged per loop iteration")
    ap.add_argument("variants", nargs="?", default="default",
                    help='split-kernel tunings for the whole-step A/B: "default" or KEY=V,KEY=V '
                         '(paged_decode_cuda.TUNING), e.g. "default DEPTH=2"')
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("reduce_parts.py needs a CUDA GPU")
    batch, ctx = parse_shape(args.shape)
    sdpa = min(time_sdpa(batch, ctx, HQ, HKV, D, quick=True)[0].values())
    print(f"{args.shape} bf16 SDPA {sdpa:.4f} ms (same run)", flush=True)
    pdl = pdc.dependent_launch(torch.device("cuda"))
    for name in args.formats.split(","):
        f = PageFormat(KVFormat.parse(name), 16, 1, HKV, D)
        prob = build_problem(f, batch, ctx, HQ, "cuda")
        probs, _ = rotated_copies(prob, f, batch, ctx, HQ, "cuda")
        steps = [Step(p, f) for p in probs]
        ref = paged_decode_attention(*prob.args, backend="cuda").float()

        def point(label: str, fn, check: bool = False) -> str:
            ms = time_graph([lambda s=s: fn(s) for s in steps], 10)
            err = ""
            if check:
                steps[0].prob.out.fill_(float("nan"))
                fn(steps[0])
                err = f",err {(steps[0].prob.out.float() - ref).abs().max().item():.1e}"
            return f"{label}:{ms:.4f}({sdpa / ms:.3f}x{err})"

        res = [point("shipped", lambda s: paged_decode_attention(*s.prob.args, out=s.prob.out, backend="cuda")),
               point("split-only", lambda s: s.split())]
        for _ in range(2):           # the whole step, each split-kernel variant x reduce warp count, interleaved
            for var in args.variants.split():
                set_tuning(var)
                for w in (int(x) for x in args.warps.split()):
                    paged_decode.reduce_splits = functools.partial(reduce_splits, num_warps=w)
                    res.append(point(f"shipped-{var}-w{w}", lambda s: paged_decode_attention(
                        *s.prob.args, out=s.prob.out, backend="cuda"), check=True))
            paged_decode.reduce_splits = reduce_splits
            pdc.TUNING.clear()
        for s in steps:
            s.split()
        res.append(point("reduce-only", lambda s: s.reduce(False, 4, 64)))
        for on in sorted({False, pdl}):
            for w in (int(x) for x in args.warps.split()):
                for it in (int(x) for x in args.per_iter.split()):
                    res.append(point(f"pdl{int(on)}-w{w}-sb{it}",
                                     lambda s, on=on, w=w, it=it: (s.split(), s.reduce(on, w, it)), check=True))
        print(f"{args.shape} {name} splits={steps[0].splits} " + " ".join(res), flush=True)
        del steps, probs, prob
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
