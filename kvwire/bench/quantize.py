"""`kvwire bench quantize`: quantise-on-write (``write_pages``) against memory bandwidth.

For each format: one layer's K of ``--tokens`` tokens (bf16 in, Hkv=8, D=128, page size 16 by
default) quantised into scattered pages of a pool; median time, bytes read (x) + written (the
compact sections), the rate and its fraction of a device-to-device copy's rate (read + write)
measured in the same run. Timed in a CUDA graph over rotated inputs (>= 512 MB, past the L2):
the CUDA kernel where it applies (FP8/NVFP4 pages) and the Triton kernel at 1, 2 and 8 KV heads
per program (its best is reported); then the faster of the two eagerly with the fused non-finite
check on (it adds a device sync and the host launch cost).
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from kvwire.bench.targets import format_verdicts, judge

DEFAULT_FORMATS = ("bf16", "fp8-tensor", "fp8-page", "fp8-token", "nvfp4")
HEADS_PER_PROGRAM = (1, 2, 8)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--formats", default=",".join(DEFAULT_FORMATS), help="comma-separated element formats")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=16)


def run(args) -> dict:
    from triton.testing import do_bench

    from kvwire.bench.attention import copy_bandwidth, time_graph
    from kvwire.errors import NoGpuError
    from kvwire.formats import KVFormat, PageFormat
    from kvwire.kernels import quantize_cuda
    from kvwire.kernels.quantize import write_pages, written_bytes

    if not torch.cuda.is_available():
        raise NoGpuError("kvwire bench quantize needs a CUDA GPU (torch sees none here)")
    dev = "cuda"
    quick = bool(getattr(args, "quick", False))
    copy = copy_bandwidth(device=dev)
    bw = copy["tb_per_s"]
    h, d, p = args.num_kv_heads, args.head_dim, args.page_size
    n = args.tokens // p
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn((n, p, h, d), device=dev, generator=gen).to(torch.bfloat16)
    rows = []
    copies = -(-(512 << 20) // (x.numel() * x.element_size()))          # rotate inputs past the L2
    xs = [x] + [torch.randn_like(x, dtype=torch.float32).to(torch.bfloat16) for _ in range(copies - 1)]
    for name in [s.strip() for s in args.formats.split(",") if s.strip()]:
        f = PageFormat(KVFormat.parse(name), p, 1, h, d)
        pools = [torch.zeros((2 * n, f.page_bytes), dtype=torch.uint8, device=dev) for _ in xs]
        ids = torch.randperm(2 * n, device=dev, generator=gen)[:n]
        static = torch.full((h,), float(x.float().abs().amax()) / 448.0, device=dev)
        read = x.numel() * x.element_size()
        written = written_bytes(f, 0, n)
        # The CUDA kernel where it applies, and the Triton kernel at its best heads per program.
        variants = [("triton", hb) for hb in HEADS_PER_PROGRAM]
        if quantize_cuda.supports(f, 0, x, pools[0]):
            variants.insert(0, ("cuda", None))
        best: dict[str, tuple[float, int | None]] = {}
        for backend, hb in variants:
            fns = [(lambda pool=pool, xx=xx, b=backend, hb=hb: write_pages(
                pool, f, 0, 0, ids, xx, static, check_finite=False, backend=b, _heads_per_program=hb))
                for pool, xx in zip(pools, xs)]
            ms = time_graph(fns, 10 if quick else 30)
            if backend not in best or ms < best[backend][0]:
                best[backend] = (ms, hb)
            print(f"  {name:11s} {backend}{'' if hb is None else f' heads/program={hb}'}: {ms * 1e3:.1f} us",
                  flush=True)
        for backend, (ms, hb) in best.items():
            tbs = (read + written) / ms / 1e9
            rows.append({"format": f.kv.key.name, "tokens": args.tokens, "backend": backend, "check_finite": False,
                         "timing": "cuda graph", "heads_per_program": hb, "ms": ms, "bytes_read": read,
                         "bytes_written": written, "tb_per_s": tbs, "of_copy_bw": tbs / bw})
            print(_line(rows[-1]), flush=True)
        backend, (_, hb) = min(best.items(), key=lambda kv: kv[1][0])
        fn = lambda: write_pages(pools[0], f, 0, 0, ids, x, static, check_finite=True, backend=backend,  # noqa: E731
                                 _heads_per_program=hb)
        ms = float(do_bench(fn, warmup=10 if quick else 25, rep=50 if quick else 200, return_mode="median"))
        tbs = (read + written) / ms / 1e9
        rows.append({"format": f.kv.key.name, "tokens": args.tokens, "backend": backend, "check_finite": True,
                     "timing": "eager (sync)", "heads_per_program": hb, "ms": ms, "bytes_read": read,
                     "bytes_written": written, "tb_per_s": tbs, "of_copy_bw": tbs / bw})
        print(_line(rows[-1]), flush=True)
        del pools
    result = {"bench": "quantize", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "shape": {"num_kv_heads": h, "head_dim": d, "page_size": p, "input": "bf16, one layer's K"},
              "copy_bandwidth": copy, "rows": rows, "targets": judge("quantize", rows)}
    return result


def _line(r: dict) -> str:
    return (f"{r['format']:<11} {r.get('backend', 'triton'):<6} check={str(r['check_finite']):<5} {r['ms'] * 1e3:8.1f} us  "
            f"read {r['bytes_read'] / 1e6:6.1f} MB  write {r['bytes_written'] / 1e6:6.1f} MB  "
            f"{r['tb_per_s']:5.2f} TB/s  {100 * r['of_copy_bw']:5.1f}% of copy")


def format_table(result: dict) -> str:
    c = result["copy_bandwidth"]
    lines = [f"device: {result['device']}   copy bandwidth (read+write): {c['tb_per_s']:.2f} TB/s   "
             f"{result['rows'][0]['tokens'] if result['rows'] else 0} tokens, Hkv={result['shape']['num_kv_heads']} "
             f"D={result['shape']['head_dim']} P={result['shape']['page_size']}, bf16 input",
             "| format | kernel | non-finite check | timing | heads/program | us | MB read | MB written | TB/s | % of copy bandwidth |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        hb = "-" if r["heads_per_program"] is None else r["heads_per_program"]
        lines.append(f"| {r['format']} | {r.get('backend', 'triton')} | {'fused (+1 sync)' if r['check_finite'] else 'off'} | {r['timing']} | "
                     f"{hb} | {r['ms'] * 1e3:.1f} | "
                     f"{r['bytes_read'] / 1e6:.1f} | {r['bytes_written'] / 1e6:.1f} | {r['tb_per_s']:.2f} | "
                     f"{100 * r['of_copy_bw']:.1f}% |")
    return "\n".join(lines) + format_verdicts(result.get("targets", []))


def main(argv=None) -> None:
    from kvwire.bench import module_main
    module_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
