"""`kvwire bench attention`: paged decode attention over compact pages vs bf16 SDPA, one GPU run.

For each (batch x context) shape and KV format it reports, for ONE layer (Hq=32, Hkv=8, D=128,
page size 16 by default): the median time of ``paged_decode_attention``; the compact KV bytes it
reads (K and V sections of every page plus the bf16 tail); the effective TB/s; the floor (those
bytes over the read bandwidth measured in the same run: the fastest of a 4 GiB read pass and bf16
SDPA at each shape, see read_bandwidth.py) and the fraction of it reached; the JSON also keeps the
floor against a device-to-device copy (read + write), as earlier runs reported it; the speedup
against torch SDPA on contiguous bf16 KV and against "dequantise with the torch reference, then
SDPA"; and the kernel's error against that dequantised SDPA.

Pools are built at the needed size directly: a few hundred pages are quantised from random data
with ``write_pages`` and then tiled over the pool (distinct addresses, so every page is a real
HBM read); page tables are random permutations.

Timing: kernels and the SDPA baselines are captured in a CUDA graph (no host launch cost, as in
a serving loop) over enough independent copies of the problem (>= 512 MB together) that no call
finds its data in L2; the median per call is reported. The eager time (do_bench, L2 flushed,
Python launch cost included) is reported too; dequantise-then-SDPA is timed eagerly and compared
with the kernel's eager time.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

import torch

from kvwire.bench.sizes import token_count
from kvwire.bench.targets import format_verdicts, judge

DEFAULT_FORMATS = ("bf16", "fp8-token", "fp8-tensor", "nvfp4", "fp8-token/nvfp4", "fp8-tensor/nvfp4")
DEFAULT_SHAPES = ("1x32k", "8x32k", "32x32k", "16x128k", "64x8k", "128x2k")
QUICK_SHAPES = ("1x32k", "32x32k")


def parse_shape(s: str) -> tuple[int, int]:
    b, l = s.lower().split("x")
    return int(b), token_count(l)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                        help="comma-separated KV formats (KEYS/VALUES for mixed)")
    parser.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated BATCHxCONTEXT, e.g. 32x32k")
    parser.add_argument("--quick", action="store_true", help="two shapes, fewer repetitions")
    parser.add_argument("--num-q-heads", type=int, default=32)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--no-dequant-baseline", action="store_true", help="skip dequantise-then-SDPA")
    parser.add_argument("--backends", default="auto",
                        help="comma-separated decode backends to time per format: auto (what the engine "
                             "runs), cuda (the NVRTC kernel, where it applies), triton")


# ---- problem construction ------------------------------------------------------------------------

@dataclass
class Problem:
    args: tuple
    out: torch.Tensor
    total_pages: int
    tail_tokens: int
    static: torch.Tensor | None


def _fill_pool(storage: torch.Tensor, page_format, static: torch.Tensor, seed_pages: int = 256,
               gen: torch.Generator | None = None) -> None:
    """Quantise ``seed_pages`` pages of random data, then tile them over the whole pool."""
    from kvwire.kernels.quantize import write_pages
    f = page_format
    n = storage.shape[0]
    k = min(seed_pages, n)
    ids = torch.arange(k, device=storage.device)
    for layer in range(f.num_layers):
        for part in (0, 1):
            x = torch.randn((k, f.page_size, f.num_kv_heads, f.head_dim), device=storage.device, generator=gen)
            x = x * (0.5 + torch.rand((k, f.page_size, f.num_kv_heads, 1), device=storage.device, generator=gen))
            write_pages(storage, f, layer, part, ids, x.to(torch.bfloat16), static[layer, part], check_finite=False)
    done = k
    while done < n:
        m = min(done, n - done)
        storage[done:done + m].copy_(storage[:m])
        done += m


def build_problem(page_format, batch: int, context: int, num_q_heads: int = 32, device: str = "cuda",
                  seed: int = 0) -> Problem:
    """One layer's decode problem: ``context`` tokens per sequence = full pages + a full bf16 tail."""
    f = page_format
    p = f.page_size
    gen = torch.Generator(device=device).manual_seed(seed)
    n = max(context // p - 1, 0)
    tail_len = context - n * p
    total = batch * n
    storage = torch.empty((max(total, 1), f.page_bytes), dtype=torch.uint8, device=device)
    static = torch.rand((f.num_layers, 2, f.num_kv_heads), device=device, generator=gen) * 0.01 + 0.005
    _fill_pool(storage, f, static, gen=gen)
    perm = torch.randperm(max(total, 1), device=device, generator=gen)[:total]
    page_table = perm.view(batch, n).to(torch.int32).contiguous()
    num_pages = torch.full((batch,), n, dtype=torch.int32, device=device)
    tail = torch.randn((batch, f.num_layers, 2, f.num_kv_heads, p, f.head_dim), device=device,
                       generator=gen).to(torch.bfloat16)
    tail_slot = torch.arange(batch, dtype=torch.int32, device=device)
    tail_lens = torch.full((batch,), tail_len, dtype=torch.int32, device=device)
    q = torch.randn((batch, num_q_heads, f.head_dim), device=device, generator=gen).to(torch.bfloat16)
    out = torch.empty_like(q)
    args = (q, storage, f, 0, page_table, num_pages, tail, tail_slot, tail_lens, static)
    return Problem(args, out, total, batch * tail_len, static)


def time_fn(fn, quick: bool = False) -> float:
    """Eager median ms (triton.testing.do_bench: L2 flushed before each call; host launch cost included)."""
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=10 if quick else 25, rep=50 if quick else 150, return_mode="median"))


def time_graph(fns: list, reps: int = 30) -> float:
    """Median ms per call of ``fns`` run in turn inside one CUDA graph (no host launch cost).

    Pass several copies of a problem whose data together exceed the L2 cache, so that every call
    reads its bytes from HBM (each copy is touched once per replay)."""
    import statistics
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            for f in fns:
                f()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in fns:
            f()
    t0 = time.perf_counter()             # replay for at least 0.2 s first: a problem timed right
    while True:                          # after it was built read 1-8% slow for its first ~30 calls
        graph.replay()
        torch.cuda.synchronize()
        if time.perf_counter() - t0 > 0.2:
            break
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / len(fns))
    del graph
    return float(statistics.median(times))


ROTATE_BYTES = 512 << 20     # > 8x the H200's 60 MB L2


def copies_for(nbytes: int) -> int:
    return max(1, min(16, -(-ROTATE_BYTES // max(nbytes, 1))))


def rotated_copies(prob: Problem, page_format, batch: int, context: int, num_q_heads: int = 32,
                   device: str = "cuda") -> tuple[list[Problem], int]:
    """``prob`` and seeded copies of it that together exceed the L2 cache (for ``time_graph``), and
    the KV bytes one call reads."""
    from kvwire.kernels.paged_decode import kv_bytes_read
    nbytes = kv_bytes_read(page_format, prob.total_pages, prob.tail_tokens)
    copies = [build_problem(page_format, batch, context, num_q_heads, device, seed=i + 1)
              for i in range(copies_for(nbytes) - 1)]
    return [prob] + copies, nbytes


def copy_bandwidth(nbytes: int = 4 << 30, device: str = "cuda") -> dict:
    """Device-to-device copy of ``nbytes``: TB/s counting read + write (the floor's bandwidth)."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    b = torch.empty_like(a)
    ms = time_fn(lambda: b.copy_(a))
    del a, b
    torch.cuda.empty_cache()
    return {"bytes": nbytes, "ms": ms, "tb_per_s": 2 * nbytes / ms / 1e9}


# ---- baselines -----------------------------------------------------------------------------------

def _sdpa_fns(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Two ways of running bf16 decode through torch SDPA on contiguous K/V [B, H, L, D]."""
    import torch.nn.functional as F
    b, hq, d = q.shape
    h = k.shape[1]
    q4 = q.view(b, hq, 1, d)
    qg = q.view(b, h, hq // h, d)   # a GQA group as the query rows of one KV head (no mask needed)
    return {
        "gqa": lambda: F.scaled_dot_product_attention(q4, k, v, enable_gqa=True),
        "grouped": lambda: F.scaled_dot_product_attention(qg, k, v),
    }


def time_sdpa(batch: int, context: int, hq: int, h: int, d: int, quick: bool = False,
              device: str = "cuda") -> tuple[dict[str, float], dict[str, float]]:
    """bf16 SDPA decode on contiguous K/V: (graph-timed ms, eager ms) per variant of ``_sdpa_fns``."""
    gen = torch.Generator(device=device).manual_seed(1)
    kvs = []
    for _ in range(copies_for(2 * batch * h * context * d * 2)):
        kc = torch.randn((batch, h, context, d), device=device, generator=gen).to(torch.bfloat16)
        vc = torch.randn((batch, h, context, d), device=device, generator=gen).to(torch.bfloat16)
        qc = torch.randn((batch, hq, d), device=device, generator=gen).to(torch.bfloat16)
        kvs.append(_sdpa_fns(qc, kc, vc))
    graph = {name: time_graph([fns[name] for fns in kvs], 10 if quick else 30) for name in kvs[0]}
    eager = {name: time_fn(kvs[0][name], quick) for name in kvs[0]}
    del kvs
    torch.cuda.empty_cache()
    return graph, eager


def _dequant_then_sdpa(prob: Problem, page_format):
    """The unfused path: torch-reference dequantisation of every page, then bf16 SDPA."""
    import torch.nn.functional as F

    from kvwire.kernels._common import read_pages_reference
    q, storage, f, layer, page_table, num_pages, tail, tail_slot, tail_len, static = prob.args
    b, hq, d = q.shape
    h = f.num_kv_heads

    def fn():
        ids = page_table.reshape(-1)
        kv = []
        for part in (0, 1):
            x = read_pages_reference(storage, f, layer, part, ids, static).to(torch.bfloat16)
            x = x.view(b, -1, h, d)
            t = tail[tail_slot.long(), layer, part, :, :int(tail_len[0])].transpose(1, 2)   # [B, tail, H, D]
            kv.append(torch.cat((x, t), dim=1).transpose(1, 2))
        return F.scaled_dot_product_attention(q.view(b, h, hq // h, d), kv[0], kv[1]).reshape(b, hq, d)
    return fn


# ---- run -----------------------------------------------------------------------------------------

def run(args) -> dict:
    from kvwire.errors import NoGpuError
    from kvwire.formats import KVFormat, PageFormat
    from kvwire.kernels.paged_decode import paged_decode_attention

    if not torch.cuda.is_available():
        raise NoGpuError("kvwire bench attention needs a CUDA GPU (torch sees none here)")
    dev = "cuda"
    quick = bool(getattr(args, "quick", False))
    shapes = [parse_shape(s) for s in (QUICK_SHAPES if quick and args.shapes == ",".join(DEFAULT_SHAPES)
                                       else args.shapes.split(","))]
    formats = [s.strip() for s in args.formats.split(",") if s.strip()]
    backends = [s.strip() for s in getattr(args, "backends", "auto").split(",") if s.strip()]
    for k in backends:
        if k not in ("auto", "cuda", "triton"):
            raise ValueError(f"unknown backend {k!r} (auto, cuda, triton)")
    hq, h, d, p = args.num_q_heads, args.num_kv_heads, args.head_dim, args.page_size
    t_start = time.time()
    copy = copy_bandwidth(device=dev)
    bw = copy["tb_per_s"] * 1e12
    from kvwire.bench.read_bandwidth import read_pass
    read = read_pass(device=dev)
    rows = []
    for batch, context in shapes:
        sdpa_bytes = 2 * batch * h * context * d * 2
        sdpa, sdpa_eager = time_sdpa(batch, context, hq, h, d, quick, dev)
        sdpa_ms = min(sdpa.values())
        timed: set[tuple[str, str]] = set()
        for name, backend in [(n, k) for n in formats for k in backends]:
            f = PageFormat(KVFormat.parse(name), p, 1, h, d)
            prob = build_problem(f, batch, context, hq, dev)
            kernel = _kernel_name(f, prob, backend)
            if kernel is None or (f.name, kernel) in timed:
                print(f"{batch}x{_ctx(context)} {f.name} {backend}: "
                      f"{'not covered by the CUDA kernel' if kernel is None else 'already timed'}, skipped", flush=True)
                continue
            timed.add((f.name, kernel))
            probs, nbytes = rotated_copies(prob, f, batch, context, hq, dev)
            fns = [(lambda pr=pr: paged_decode_attention(*pr.args, out=pr.out, backend=backend)) for pr in probs]
            fns[0]()
            torch.cuda.synchronize()
            ms = time_graph(fns, 10 if quick else 30)
            eager_ms = time_fn(fns[0], quick)
            row = {"batch": batch, "context": context, "format": f.name, "kernel": kernel, "ms": ms, "eager_ms": eager_ms,
                   "kv_bytes": nbytes, "tb_per_s": nbytes / ms / 1e9, "floor_ms": nbytes / bw * 1e3,
                   "sdpa_bf16_ms": sdpa_ms, "sdpa_variants_ms": sdpa, "sdpa_eager_ms": sdpa_eager,
                   "sdpa_bf16_kv_bytes": sdpa_bytes, "copies": len(probs)}
            row["of_floor"] = row["floor_ms"] / ms
            row["vs_sdpa"] = sdpa_ms / ms
            del probs[1:], fns
            if not args.no_dequant_baseline:
                try:
                    dq = _dequant_then_sdpa(prob, f)
                    ref = dq()
                    row["rel_err"] = float((prob.out.float() - ref.float()).norm() / ref.float().norm())
                    row["dequant_sdpa_ms"] = time_fn(dq, True)
                    row["vs_dequant_sdpa"] = row["dequant_sdpa_ms"] / eager_ms
                    del ref
                except torch.OutOfMemoryError:
                    row["dequant_sdpa_ms"] = None
            rows.append(row)
            print(_row_line(row), flush=True)
            _write(args, _result(rows, copy, read, hq, h, d, p, t_start))   # a cut-short run keeps its rows
            del prob
            torch.cuda.empty_cache()
    result = _result(rows, copy, read, hq, h, d, p, t_start)
    _write(args, result)
    return result


def add_read_floor(rows: list[dict], read: dict | None) -> dict:
    """Set each row's ``read_floor_ms`` and ``of_read_floor`` against the fastest read of the run:
    the read pass ``read`` (read_bandwidth.read_pass; None for runs recorded before it) and every
    row's bf16 SDPA (contiguous K+V bytes over its time). Returns that bandwidth and its source."""
    sdpa = {f"bf16 SDPA at {r['batch']}x{_ctx(r['context'])}": r["sdpa_bf16_kv_bytes"] / r["sdpa_bf16_ms"] / 1e9
            for r in rows}
    found = dict(sdpa, **({"read pass": read["tb_per_s"]} if read else {}))
    if not found:
        return {"tb_per_s": None, "source": None, "read_pass": read}
    source = max(found, key=found.get)
    tb = found[source]
    for r in rows:
        r["read_floor_ms"] = r["kv_bytes"] / (tb * 1e12) * 1e3
        r["of_read_floor"] = r["read_floor_ms"] / r["ms"]
    return {"tb_per_s": tb, "source": source, "read_pass": read}


def _result(rows: list, copy: dict, read: dict | None, hq: int, h: int, d: int, p: int, t_start: float) -> dict:
    read_bw = add_read_floor(rows, read)
    return {
        "bench": "attention", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": __import__("triton").__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "shape": {"num_q_heads": hq, "num_kv_heads": h, "head_dim": d, "page_size": p, "layers_timed": 1},
        "copy_bandwidth": copy, "read_bandwidth": read_bw, "rows": rows, "targets": judge("attention", rows),
        "seconds": time.time() - t_start,
    }


def _write(args, result: dict) -> None:
    out = getattr(args, "out", None)
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=1)


def _kernel_name(f, prob: Problem, backend: str) -> str | None:
    """Which split kernel ``backend`` runs for this problem ("cuda"/"triton"), None if it cannot."""
    from kvwire.kernels import nvrtc, paged_decode_cuda
    q = prob.args[0]
    covered = paged_decode_cuda.supports(f, q.shape[1], q)
    if backend == "triton":
        return "triton"
    if backend == "cuda":
        return "cuda" if covered else None
    return "cuda" if covered and not nvrtc.UNAVAILABLE else "triton"


def _row_line(r: dict) -> str:
    dq = r.get("vs_dequant_sdpa")
    return (f"{r['batch']:>4}x{_ctx(r['context']):<5} {r['format']:<16} {r.get('kernel', '-'):<6} {r['ms']:8.4f} ms (eager {r['eager_ms']:.4f})  "
            f"{r['kv_bytes'] / 1e9:7.3f} GB  {r['tb_per_s']:5.2f} TB/s  copy floor {r['floor_ms']:7.4f} ms "
            f"({100 * r['of_floor']:5.1f}%)  vs SDPA {r['vs_sdpa']:5.2f}x  "
            f"vs dequant+SDPA {'-' if dq is None else f'{dq:5.1f}x'}  err {_err(r)}")


def _err(r: dict) -> str:
    """The row's error against dequant+SDPA, or '-' where that baseline was not run."""
    return f"{r['rel_err']:.1e}" if "rel_err" in r else "-"


def _tb(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} TB/s"


def _ctx(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def format_table(result: dict) -> str:
    """The run as a markdown table; floors against the read bandwidth (``add_read_floor``)."""
    c = result["copy_bandwidth"]
    read = result.get("read_bandwidth") or add_read_floor(result["rows"], None)
    pass_ = read.get("read_pass")
    pass_text = f"; read pass {_tb(pass_['tb_per_s'])}" if pass_ else ""
    lines = [f"device: {result['device']}   read bandwidth {_tb(read['tb_per_s'])} (the floors' bandwidth: the "
             f"fastest read of this run, {read['source']}{pass_text})   copy bandwidth (read+write): {c['tb_per_s']:.2f} TB/s",
             f"shape: Hq={result['shape']['num_q_heads']} Hkv={result['shape']['num_kv_heads']} "
             f"D={result['shape']['head_dim']} P={result['shape']['page_size']}, one layer",
             "| batch x ctx | format | kernel | ms | eager ms | KV GB | TB/s | floor ms | % of floor | bf16 SDPA ms | vs SDPA | "
             "vs dequant+SDPA | rel err |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        dq = r.get("vs_dequant_sdpa")
        lines.append(f"| {r['batch']}x{_ctx(r['context'])} | {r['format']} | {r.get('kernel', '-')} | {r['ms']:.4f} | {r['eager_ms']:.4f} | {r['kv_bytes'] / 1e9:.3f} | "
                     f"{r['tb_per_s']:.2f} | {r['read_floor_ms']:.4f} | {100 * r['of_read_floor']:.1f}% | {r['sdpa_bf16_ms']:.4f} | "
                     f"{r['vs_sdpa']:.2f}x | {'-' if dq is None else f'{dq:.1f}x'} | "
                     f"{_err(r)} |")
    return "\n".join(lines) + format_verdicts(result.get("targets", []))


def main(argv=None) -> None:
    from kvwire.bench import module_main
    module_main(sys.modules[__name__], argv)


if __name__ == "__main__":
    main()
