"""Sweeps of the CUDA quantise-on-write kernel (kvwire/kernels/quantize_cuda.py) at 32k tokens.

Two kinds, one timing harness (each variant graph-timed over 8 rotated inputs, so every call reads
HBM; bytes read + written over the time):
  chunks FORMATS "CPL..." "STEPS..."   chunks (8 elements) per thread x division correction steps
  variants "VAR ..." [FORMATS]         compile-time variants (quantize_cuda.TUNING) of the NVFP4 path or
                                       of FORMATS, interleaved as listed, e.g. "default HFAST=1 default";
                                       the copy rate is measured once, first

Usage (GPU machine, repo root, PYTHONPATH=$PWD): python3 scripts/gpu/quantize_sweep.py chunks nvfp4 "4 8" "1 2"
(scripts/gpu/cuda_quantize.sh runs it from CPL_SWEEP / STEPS_SWEEP / VARIANTS).
"""
from __future__ import annotations

import argparse

import torch

from kvwire.bench.attention import copy_bandwidth, time_graph
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels import quantize_cuda
from kvwire.kernels.quantize import write_pages, written_bytes

from decode_sweep import set_tuning          # scripts/gpu/ (this script's directory is on sys.path)

PAGES, HEADS, HEAD_DIM = 2048, 8, 128      # 32,768 tokens of one layer's K, bf16


class Problem:
    """One format's pools and inputs: 8 copies, pages scattered over a pool twice the size."""

    def __init__(self, name: str, xs: list[torch.Tensor]) -> None:
        self.format = PageFormat(KVFormat.parse(name), 16, 1, HEADS, HEAD_DIM)
        self.xs = xs
        self.pools = [torch.zeros((2 * PAGES, self.format.page_bytes), dtype=torch.uint8, device="cuda") for _ in xs]
        self.ids = torch.randperm(2 * PAGES, device="cuda")[:PAGES]
        self.static = torch.full((HEADS,), 0.01, device="cuda")

    def time(self) -> tuple[float, float, quantize_cuda.CudaKernel]:
        """(us per call, TB/s read + written, the kernel) under the module's current tuning."""
        f = self.format
        fns = [(lambda p=p, x=x: write_pages(p, f, 0, 0, self.ids, x, self.static, check_finite=False,
                                             backend="cuda")) for p, x in zip(self.pools, self.xs)]
        ms = time_graph(fns, 20)
        tb = (self.xs[0].numel() * 2 + written_bytes(f, 0, PAGES)) / ms / 1e9
        return ms * 1e3, tb, quantize_cuda.kernel_for(f, 0, False, self.xs[0].device)


def chunks(problems: list[Problem], cpls: list[int], steps: list[int]) -> None:
    for prob in problems:
        f = prob.format
        for cpl in cpls:
            for step in steps:
                quantize_cuda.CHUNKS_PER_THREAD[f.kv.key.element] = cpl
                quantize_cuda.DIVISION_STEPS = step
                if quantize_cuda.chunks_per_thread(f, 0) != cpl:
                    continue
                us, tb, k = prob.time()
                threads = 16 * HEAD_DIM // (8 * cpl)
                print(f"{f.name:11s} CPL={cpl} steps={step} regs={k.num_regs} "
                      f"blocks/SM={k.blocks_per_sm(threads)} {us:.1f} us {tb:.2f} TB/s", flush=True)


def variants(problems: list[Problem], names: list[str]) -> None:
    bw = copy_bandwidth(device="cuda")["tb_per_s"]
    print(f"copy rate {bw:.2f} TB/s", flush=True)
    try:
        for var in names:
            for prob in problems:
                set_tuning(var, quantize_cuda.TUNING)
                us, tb, k = prob.time()
                print(f"{prob.format.name:11s} {var:28s} regs={k.num_regs} {us:.1f} us {tb:.2f} TB/s "
                      f"{100 * tb / bw:.1f}% of copy", flush=True)
    finally:
        quantize_cuda.TUNING.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="kind", required=True)
    c = sub.add_parser("chunks", help="chunks per thread x division steps")
    c.add_argument("formats", help="comma-separated, e.g. fp8-token,nvfp4 (bf16 has no CUDA kernel: skipped)")
    c.add_argument("cpl", help='chunks per thread, e.g. "2 4 8"')
    c.add_argument("steps", nargs="?", default="2", help='division correction steps, e.g. "1 2"')
    v = sub.add_parser("variants", help="compile-time variants, interleaved")
    v.add_argument("variants", help='e.g. "default NOCLAMP=1,AMAX2=1 default"')
    v.add_argument("formats", nargs="?", default="nvfp4", help="comma-separated, e.g. nvfp4,fp8-token (default nvfp4)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("quantize_sweep: needs a CUDA GPU")
    xs = [torch.randn((PAGES, 16, HEADS, HEAD_DIM), device="cuda").to(torch.bfloat16) for _ in range(8)]
    if args.kind == "variants":
        variants([Problem(name, xs) for name in args.formats.split(",")], args.variants.split())
        return
    problems = [Problem(name, xs) for name in args.formats.split(",")]
    problems = [p for p in problems if quantize_cuda.supports(p.format, 0, xs[0], p.pools[0])]
    chunks(problems, [int(x) for x in args.cpl.split()], [int(x) for x in args.steps.split()])


if __name__ == "__main__":
    main()
