"""FP8 keys on fp8 tensor cores (``k_fp8_mma``) against the default fp16-conversion path, with
bf16 SDPA on contiguous K/V as the baseline, all in one run (issue 3 experiment).

    python3 scripts/gpu/fp8_mma_probe.py [--shapes 32x32k,1x32k] [--formats fp8-tensor,...] [--out F]

One layer, Hq=32, Hkv=8, D=128, page size 16; graph-captured medians over enough problem copies
to defeat L2 (kvwire.bench.attention.time_graph); each variant's relative error against the torch
reference on the same problem.
"""
from __future__ import annotations

import argparse
import json

import torch

from kvwire.bench.attention import _sdpa_fns, build_problem, copies_for, parse_shape, time_graph
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels.paged_decode import kv_bytes_read, paged_decode_attention, paged_decode_reference


def sdpa_ms(batch: int, context: int) -> float:
    q = torch.randn((batch, 32, 128), device="cuda", dtype=torch.bfloat16)
    k = torch.randn((batch, 8, context, 128), device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    n = copies_for(2 * k.numel() * 2)
    kvs = [(k, v)] + [(torch.randn_like(k), torch.randn_like(v)) for _ in range(n - 1)]
    best = min(time_graph([fns[name] for fns in (_sdpa_fns(q, kk, vv) for kk, vv in kvs)], 20)
               for name in ("gqa", "grouped"))
    del k, v, kvs
    torch.cuda.empty_cache()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="32x32k,1x32k")
    ap.add_argument("--formats", default="fp8-tensor,fp8-token,fp8-token/nvfp4")
    ap.add_argument("--out", default="fp8_mma.json")
    args = ap.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        b, ctx = parse_shape(shape)
        base = sdpa_ms(b, ctx)
        print(f"{shape}: bf16 SDPA {base:.4f} ms", flush=True)
        for name in args.formats.split(","):
            f = PageFormat(KVFormat.parse(name), 16, 1, 8, 128)
            prob = build_problem(f, b, ctx, 32, "cuda")
            nbytes = kv_bytes_read(f, prob.total_pages, prob.tail_tokens)
            probs = [prob] + [build_problem(f, b, ctx, 32, "cuda", seed=i + 1) for i in range(copies_for(nbytes) - 1)]
            ref = paged_decode_reference(*prob.args).float() if b <= 8 else None
            for mma in (False, True):
                out = torch.full_like(prob.out, float("nan"))
                try:
                    paged_decode_attention(*prob.args, out=out, k_fp8_mma=mma)
                except Exception as exc:  # e.g. a Triton build without fp8 dots at this tile shape
                    print(f"  {name:16s} k_fp8_mma={mma!s:5s} FAILED {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                err = float((out.float() - ref).norm() / ref.norm()) if ref is not None else float("nan")
                ms = time_graph([(lambda pr=pr: paged_decode_attention(*pr.args, out=pr.out, k_fp8_mma=mma))
                                 for pr in probs], 20)
                rows.append({"shape": shape, "format": name, "k_fp8_mma": mma, "ms": ms, "sdpa_ms": base,
                             "vs_sdpa": base / ms, "tb_per_s": nbytes / ms / 1e9, "rel_err": err})
                print(f"  {name:16s} k_fp8_mma={mma!s:5s} {ms:.4f} ms  {base / ms:.2f}x SDPA  "
                      f"{nbytes / ms / 1e9:.2f} TB/s  rel err {err:.1e}", flush=True)
            del prob, probs
            torch.cuda.empty_cache()
    with open(args.out, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
