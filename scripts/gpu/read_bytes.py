"""What the decode kernels and bf16 SDPA read from DRAM, for ncu to count: each kernel runs twice
(the first call warms up), and the script prints the bytes each should read.

Why: at 32x32k the page walk reads compact pages at 4.1-4.3 TB/s of *compact bytes* while SDPA
reads contiguous bf16 K/V at 4.5-4.6 TB/s. Whether the walk moves more bytes than it needs (over-
fetch, re-reads) or moves the same bytes more slowly is a question of DRAM counters, not timers.

Usage (GPU machine, repo root, PYTHONPATH=$PWD; ncu replays each launch with L2 flushed first):
    ncu --clock-control none --kernel-name regex:"kvwire_decode|_decode_reduce|flash|fmha|attention|sdpa" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_op_read_hit_rate.pct \
        --csv python3 scripts/gpu/read_bytes.py 32x32k fp8-token,nvfp4 > ncu.csv
"""
from __future__ import annotations

import argparse

import torch

from kvwire.bench.attention import _sdpa_fns, build_problem, parse_shape
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels.paged_decode import kv_bytes_read, paged_decode_attention

HQ, HKV, D = 32, 8, 128


def measured(label: str, fn) -> None:
    """A warm-up call of ``fn`` and one more."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    print(f"ran {label}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", nargs="?", default="32x32k", help="BATCHxCONTEXT (default 32x32k)")
    ap.add_argument("formats", nargs="?", default="fp8-token,fp8-tensor,nvfp4,fp8-token/nvfp4",
                    help="comma-separated KV formats")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("read_bytes.py needs a CUDA GPU (run it on the GPU machine, under ncu)")
    batch, ctx = parse_shape(args.shape)
    names = args.formats.split(",")
    gen = torch.Generator(device="cuda").manual_seed(1)
    k = torch.randn((batch, HKV, ctx, D), device="cuda", generator=gen).to(torch.bfloat16)
    v = torch.randn((batch, HKV, ctx, D), device="cuda", generator=gen).to(torch.bfloat16)
    q = torch.randn((batch, HQ, D), device="cuda", generator=gen).to(torch.bfloat16)
    print(f"sdpa bf16: K+V bytes {2 * k.numel() * 2}", flush=True)
    for name, fn in _sdpa_fns(q, k, v).items():
        measured(f"sdpa {name}", fn)
    del k, v
    torch.cuda.empty_cache()
    for name in names:
        f = PageFormat(KVFormat.parse(name), 16, 1, HKV, D)
        prob = build_problem(f, batch, ctx, HQ, "cuda")
        print(f"{name}: compact bytes {kv_bytes_read(f, prob.total_pages, prob.tail_tokens)}", flush=True)
        measured(name, lambda: paged_decode_attention(*prob.args, out=prob.out, backend="cuda"))
        del prob
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
