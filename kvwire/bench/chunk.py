"""`kvwire bench chunk`: chunk attention (chunked prefill, prefix hits) over compact pages vs SDPA.

For each prefix length, chunk length and KV format, ONE layer (Hq=32, Hkv=8, D=128, page size 16
by default): a chunk of queries after a stored prefix (512 tokens: a chunked-prefill step; 64: a
short question after a cached document), laid out as the runner calls
``paged_chunk_attention`` (the prefix and the chunk's own full pages in the pool, the chunk's
bf16 K/V as the open region). It reports the median time with the split count the engine picks
and in one pass (``num_splits=1``, the kernel before split-KV), the TFLOP/s of the causal
attention, and the ratio to torch SDPA on contiguous bf16 K/V: the faster of SDPA with the same
causal mask (lower-right aligned: query i sees keys 0 .. prefix + i) and SDPA with no mask (a bit
more work, but the mask can steer torch to a slower backend), all measured in one run. The error is
against ``paged_chunk_reference`` (pages decoded by the torch reference, fp32 attention). With
``--gathered-backends`` (default: all three), each row also times ``chunk_gathered.gathered_chunk_attention`` (the prefix decoded
to bf16 by ``page_gather``, then each of torch's cuDNN / flash / efficient kernels) and the gather alone;
``--key-splits`` times it with the prefix's keys in that many runs (labels ``cudnn/4``; default: the
engine's count, ``chunk_plan.prefix_key_splits``). ``engine_path`` / ``engine_ms`` say which of the two
the runner takes for that call and its time.

Timing: each call captured in a CUDA graph (no host launch cost), median of the replays.
"""
from __future__ import annotations

import argparse
import sys

import torch

from kvwire.bench.sizes import token_count

DEFAULT_FORMATS = ("bf16", "fp8-token", "fp8-tensor", "nvfp4", "fp8-token/nvfp4")
DEFAULT_PREFIXES = ("8k", "32k")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                        help="comma-separated KV formats (KEYS/VALUES for mixed)")
    parser.add_argument("--prefixes", default=",".join(DEFAULT_PREFIXES),
                        help="comma-separated stored-prefix lengths in tokens (k = 1024)")
    parser.add_argument("--chunks", default="512,64", help="comma-separated query counts of the chunk")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--gathered-backends", default="cudnn,flash,efficient",
                        help="prefix kernels to time on the gathered path (the prefix decoded to bf16, then torch's "
                             "cuDNN / flash / efficient attention); empty: skip that path")
    parser.add_argument("--key-splits", default="auto",
                        help="comma-separated key-run counts to time on the gathered path (cuDNN does not split "
                             "the keys, so a narrow chunk fills the GPU only in runs); auto: the engine's count")
    parser.add_argument("--num-q-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--splits", type=int, default=None,
                        help="split count of the split run (default: what the engine picks)")


def causal_flops(chunk: int, prefix: int, num_q_heads: int, head_dim: int) -> float:
    """Multiply-adds x 2 of QK^T and PV when query i sees keys 0 .. prefix + i."""
    keys = chunk * prefix + chunk * (chunk + 1) / 2
    return 4.0 * num_q_heads * head_dim * keys


def run(args) -> dict:
    from torch.nn.attention.bias import causal_lower_right

    from kvwire.bench.attention import time_graph
    from kvwire.errors import NoGpuError, UsageError
    from kvwire.formats import KVFormat, PageFormat
    from kvwire.kernels.chunk_attention import paged_chunk_attention, paged_chunk_reference
    from kvwire.kernels.chunk_gathered import DEFAULT_BACKEND, PrefixBackend
    from kvwire.kernels.chunk_plan import default_tile, gathered_prefix_pays, planned_splits, prefix_key_splits
    if not torch.cuda.is_available():
        raise NoGpuError("kvwire bench chunk needs a CUDA GPU (torch sees none here)")
    dev = torch.device("cuda")
    reps = 10 if args.quick else 30
    hq, h, d, p = args.num_q_heads, args.num_kv_heads, args.head_dim, args.page_size
    gen = torch.Generator(device=dev).manual_seed(0)
    names = [b.strip() for b in args.gathered_backends.split(",") if b.strip()]
    unknown = sorted(set(names) - {b.value for b in PrefixBackend})
    if unknown:
        raise UsageError(f"--gathered-backends: unknown {', '.join(unknown)} "
                         f"(choose from {', '.join(b.value for b in PrefixBackend)})")
    backends = [PrefixBackend(b) for b in names]
    key_splits = _key_splits(args.key_splits)
    rows = []
    cases = [(token_count(a), int(c)) for a in args.prefixes.split(",") if a.strip()
             for c in args.chunks.split(",") if c.strip()]
    for prefix, n in cases:
        if prefix % p or n % p:
            raise UsageError(f"prefix {prefix} and chunk {n} must be multiples of the page size {p}")
        total = prefix + n
        q = torch.randn((n, hq, d), device=dev, generator=gen).to(torch.bfloat16)
        pos = torch.arange(prefix, total, device=dev)
        k_all = torch.randn((total, h, d), device=dev, generator=gen).to(torch.bfloat16)
        v_all = torch.randn((total, h, d), device=dev, generator=gen).to(torch.bfloat16)
        qs, ks, vs = q.transpose(0, 1)[None], k_all.permute(1, 0, 2)[None], v_all.permute(1, 0, 2)[None]
        sdpa = _time_sdpa(qs, ks, vs, causal_lower_right(n, total), reps)
        sdpa_ms = min(sdpa.values())
        flops = causal_flops(n, prefix, hq, d)
        print(f"prefix {prefix}, chunk {n}: bf16 SDPA (contiguous) causal {sdpa['causal']:.3f} ms, "
              f"no mask {sdpa['no_mask']:.3f} ms ({flops / sdpa_ms / 1e9:.0f} TFLOP/s)", flush=True)
        for name in [s.strip() for s in args.formats.split(",") if s.strip()]:
            f = PageFormat(KVFormat.parse(name), p, 1, h, d)
            storage, ids, static = stored_pages(f, k_all, v_all, gen)
            ko, vo = k_all[prefix:], v_all[prefix:]

            def call(splits, out):
                return paged_chunk_attention(q, pos, storage, f, 0, ids, ko, vo, prefix, static, out=out,
                                             num_splits=splits)

            splits = args.splits or planned_splits(n, hq, f, ids.numel(), dev)
            out = torch.empty_like(q)
            one_ms = time_graph([lambda: call(1, out)], reps)
            split_ms = time_graph([lambda: call(splits, out)], reps)
            call(splits, out)
            ref = paged_chunk_reference(q, pos, storage, f, 0, ids, ko, vo, prefix, static)
            err = float((out.double() - ref.double()).norm() / ref.double().norm())
            tile = "x".join(map(str, default_tile(f, dev)))       # rows x keys x warps x stages
            row = {"format": name, "prefix": prefix, "chunk": n, "splits": splits, "tile": tile,
                   "ms": split_ms, "one_pass_ms": one_ms, "sdpa_ms": sdpa_ms,
                   "sdpa_causal_ms": sdpa["causal"], "sdpa_no_mask_ms": sdpa["no_mask"],
                   "tflops": flops / split_ms / 1e9, "speedup_vs_one_pass": one_ms / split_ms,
                   "vs_sdpa": sdpa_ms / split_ms, "rel_err": err}
            rows.append(row)
            print(f"  {name:16s} tile {tile} splits={splits:2d} {split_ms:.3f} ms (one pass {one_ms:.3f}) "
                  f"{row['tflops']:.0f} TFLOP/s  {row['vs_sdpa']:.2f}x SDPA  err {err:.1e}", flush=True)
            engine_splits = prefix_key_splits(n, hq, prefix, f, dev)     # the runs the engine would cut
            if backends:
                runs = key_splits or [engine_splits]
                row.update(_time_gathered(q, pos, storage, f, ids, ko, vo, prefix, static, ref, reps, backends,
                                          runs))
                row["gathered_vs_sdpa"] = {b: sdpa_ms / t for b, t in row["gathered_ms"].items() if t}
                print(f"  {'':16s} gathered: prefix gather {row['gather_ms']:.3f} ms; "
                      + ", ".join(f"{b} {t:.3f} ms ({sdpa_ms / t:.2f}x SDPA, err {row['gathered_err'][b]:.1e})"
                                  if t else f"{b} failed" for b, t in row["gathered_ms"].items()), flush=True)
            # what the runner takes for this call (chunk_plan.gathered_prefix_pays), where it was timed
            row["engine_path"] = "gathered" if gathered_prefix_pays(n, hq, prefix, f, dev) else "paged"
            row["engine_ms"] = (row.get("gathered_ms", {}).get(gathered_label(DEFAULT_BACKEND.value, engine_splits))
                                if row["engine_path"] == "gathered" else split_ms)
            row["engine_vs_sdpa"] = sdpa_ms / row["engine_ms"] if row["engine_ms"] else None
            del storage
    return {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
            "shape": {"num_q_heads": hq, "num_kv_heads": h, "head_dim": d, "page_size": p},
            "rows": rows}


def _key_splits(text: str) -> list[int]:
    """``--key-splits``: [] for auto, else the counts (each at least 1)."""
    from kvwire.errors import UsageError
    if text.strip() == "auto":
        return []
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise UsageError(f"--key-splits: 'auto' or comma-separated counts of at least 1, got {text!r}")
    return counts


def gathered_label(backend: str, key_splits: int) -> str:
    """The key of a gathered timing: the backend, with ``/S`` for S key runs."""
    return backend if key_splits == 1 else f"{backend}/{key_splits}"


def _time_gathered(q, pos, storage, f, ids, ko, vo, prefix: int, static, ref: torch.Tensor, reps: int,
                   backends: list, key_splits: list[int]) -> dict:
    """``gathered_chunk_attention`` with each prefix backend and key-run count (time and error
    against ``ref``; None where the backend refused the call), and ``gather_pages`` of the prefix alone."""
    from kvwire.bench.attention import time_graph
    from kvwire.kernels.chunk_gathered import gathered_chunk_attention
    from kvwire.kernels.page_gather import gather_pages

    lead = ids[: prefix // f.page_size]
    buf = torch.empty((2, f.num_kv_heads, prefix, f.head_dim), dtype=torch.bfloat16, device=q.device)
    res = {"gather_ms": time_graph([lambda: gather_pages(storage, f, 0, lead, static, buf)], reps),
           "gathered_ms": {}, "gathered_err": {}}
    for b in backends:
        for s in key_splits:
            label = gathered_label(b.value, s)
            out = torch.full_like(q, float("nan"))

            def call():
                return gathered_chunk_attention(q, pos, storage, f, 0, ids, ko, vo, prefix, static, out, backend=b,
                                                key_splits=s, fallback=False)
            try:
                call()
                res["gathered_err"][label] = float((out.double() - ref.double()).norm() / ref.double().norm())
                res["gathered_ms"][label] = time_graph([call], reps)
            except RuntimeError as e:
                print(f"  gathered, {label}: {type(e).__name__} {str(e)[:160]}", flush=True)
                res["gathered_ms"][label] = res["gathered_err"][label] = None
    return res


def stored_pages(f, k_all: torch.Tensor, v_all: torch.Tensor, gen: torch.Generator):
    """Layer 0 of a pool holding K/V [tokens, H, D] (bf16, whole pages) in format ``f``, laid out as
    the runner leaves a sequence: pages at random places among 8 spare ones. Returns (storage,
    page ids, static scales [1, 2, H] for fp8 tensor/head formats)."""
    from kvwire.kernels.quantize import write_pages

    dev, p, h, d = k_all.device, f.page_size, f.num_kv_heads, f.head_dim
    n_pages = k_all.shape[0] // p
    storage = torch.empty((n_pages + 8, f.page_bytes), dtype=torch.uint8, device=dev)
    ids = torch.randperm(n_pages + 8, device=dev, generator=gen)[:n_pages]
    static = (torch.rand((1, 2, h), device=dev, generator=gen) + 0.5) * (4.0 / 448)
    for part, x in ((0, k_all), (1, v_all)):
        write_pages(storage, f, 0, part, ids, x[: n_pages * p].view(n_pages, p, h, d), static[0, part],
                    check_finite=False)
    return storage, ids, static


def _time_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, reps: int) -> dict[str, float]:
    """bf16 SDPA over the same keys: with the causal mask and with none (slightly more work, but the
    mask can steer torch to a slower backend), each the best of enable_gqa and K/V expanded."""
    import torch.nn.functional as F

    from kvwire.bench.attention import time_graph
    rep = q.shape[1] // k.shape[1]
    ke, ve = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = {}
    for key, m in (("causal", mask), ("no_mask", None)):
        best = float("inf")
        for kk, vv, gqa in ((k, v, True), (ke, ve, False)):
            try:
                best = min(best, time_graph([lambda: F.scaled_dot_product_attention(q, kk, vv, attn_mask=m,
                                                                                   enable_gqa=gqa)], reps))
            except (RuntimeError, TypeError) as e:
                print(f"SDPA {key} enable_gqa={gqa}: {type(e).__name__} {str(e)[:100]}")
        out[key] = best
    return out


def format_table(result: dict) -> str:
    s = result["shape"]
    lines = [f"device: {result['device']}   one layer: Hq={s['num_q_heads']} Hkv={s['num_kv_heads']} "
             f"D={s['head_dim']} P={s['page_size']}, a chunk of queries after a stored prefix",
             "SDPA: bf16 on contiguous K/V, the faster of causal-masked and unmasked",
             "| prefix | chunk | format | tile | splits | ms | one pass ms | speedup | TFLOP/s | SDPA causal ms "
             "| SDPA no mask ms | vs SDPA | rel err | gathered: best ms | vs SDPA | engine takes | engine vs SDPA |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|"]
    for r in result["rows"]:
        timed = {b: t for b, t in r.get("gathered_ms", {}).items() if t}
        best = min(timed, key=timed.get) if timed else None
        gathered = f"{timed[best]:.3f} ({best}) | {r['sdpa_ms'] / timed[best]:.2f}x" if best else "- | -"
        lines.append(f"| {r['prefix']} | {r['chunk']} | {r['format']} | {r['tile']} | {r['splits']} | "
                     f"{r['ms']:.3f} | {r['one_pass_ms']:.3f} | {r['speedup_vs_one_pass']:.2f}x | "
                     f"{r['tflops']:.0f} | {r['sdpa_causal_ms']:.3f} | {r['sdpa_no_mask_ms']:.3f} | "
                     f"{r['vs_sdpa']:.2f}x | {r['rel_err']:.1e} | {gathered} | {r.get('engine_path', '-')} | "
                     + (f"{r['engine_vs_sdpa']:.2f}x |" if r.get("engine_vs_sdpa") else "- |"))
    return "\n".join(lines)


def main(argv=None) -> None:
    from kvwire.bench import module_main
    module_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
