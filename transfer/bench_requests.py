"""`kvwire bench transfer`: what one request's KV costs on the wire, per prompt length and format.

For each KV format and prompt length N, a request's full pages ((N-1) // page_size of them, the
newest token's page stays the bf16 tail) are pushed (NIXL WRITE, the default mode) from one
process's registered pool into another's, as a prefill worker does for a decode worker. Reported:
wire bytes (the descriptors actually issued, plus the bf16 tail that travels in the manifest),
the bf16 bytes they stand for, the ratio, median transfer time, GB/s, descriptors per request,
and the rate against a same-device copy of the largest request measured in the same run.
The bytes depend only on the model's shape (Llama-3-8B by default: 32 layers, 8 KV heads, head
dim 128), so pools hold patterned bytes, not a model's K/V; pools live in DRAM on the CPU and in
VRAM with ``--device cuda``. Each pool holds one request of the longest prompt, twice over
(sender and receiver): 64k tokens of bf16 at the 8B shape is 8.6 GB per pool.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
from multiprocessing.connection import Connection

import torch

from kvwire.bench.sizes import token_count
from kvwire.formats import KVFormat, PageFormat

DEFAULT_FORMATS = "bf16,fp8-tensor,fp8-token,nvfp4,fp8-token/nvfp4"
PAGE_SIZE = 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", default="1024,4096,16384,65536",
                        help="prompt lengths in tokens (default 1k,4k,16k,64k)")
    parser.add_argument("--formats", default=DEFAULT_FORMATS, help="comma-separated KV formats")
    parser.add_argument("--shape", default="llama-3-8b", help="model shape for the page layout (default llama-3-8b)")
    parser.add_argument("--device", default="auto", help="cpu (DRAM pools), cuda (VRAM pools), auto")
    parser.add_argument("--reps", type=int, default=3, help="timed transfers per cell, median reported")


def _pool(fmt: PageFormat, num_pages: int, device: str, fill: int) -> torch.Tensor:
    return torch.full((num_pages, fmt.page_bytes), fill, dtype=torch.uint8, device=device)


def _serve(conn: Connection, fmt_dict: dict, num_pages: int, device: str) -> None:
    """The receiving side: register a pool, connect, wait to be told to stop (WRITEs are one-sided)."""
    from transfer.handshake import decode_handshake
    from transfer.nixl_transport import NixlTransport
    fmt = PageFormat.from_dict(fmt_dict)
    t = NixlTransport("bench-receiver")
    t.register_pool(_pool(fmt, num_pages, device, 0x11), fmt)
    conn.send(t.handshake().encode())
    t.add_peer(decode_handshake(conn.recv()))
    conn.recv()
    t.close()


def _one_format(fmt: PageFormat, prompts: list[int], device: str, reps: int) -> list[dict]:
    from transfer.handshake import decode_handshake
    from transfer.nixl_transport import NixlTransport
    num_pages = max((n - 1) // fmt.page_size for n in prompts)
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_serve, args=(there, fmt.to_dict(), num_pages, device), daemon=True)
    child.start()
    t = NixlTransport("bench-sender")
    rows = []
    try:
        t.register_pool(_pool(fmt, num_pages, device, 0x5A), fmt)
        peer = t.add_peer(decode_handshake(here.recv()))
        here.send(t.handshake().encode())
        for n in prompts:
            pages = list(range((n - 1) // fmt.page_size))
            tail = n - len(pages) * fmt.page_size
            times, stats = [], None
            for rep in range(reps + 1):          # the first is a warm-up (connection, page faults)
                h = t.write_pages(peer, pages, pages, deadline_s=300)
                if h.wait(300).value != "done":
                    raise RuntimeError(f"push of {len(pages)} pages ended {h.state.value}: {h.error}")
                stats = h.stats
                if rep:
                    times.append(stats.seconds)
            wire = stats.compact_bytes + tail * fmt.bf16_bytes_per_token
            bf16 = n * fmt.bf16_bytes_per_token
            seconds = statistics.median(times)
            rows.append({"format": fmt.name, "prompt_tokens": n, "pages": len(pages), "tail_tokens": tail,
                         "wire_bytes": wire, "bf16_bytes": bf16, "ratio": wire / bf16,
                         "expected_wire_bytes": fmt.bytes_per_token * len(pages) * fmt.page_size
                         + tail * fmt.bf16_bytes_per_token,
                         "descriptors": stats.num_descriptors, "ms": seconds * 1e3,
                         "gb_s": stats.compact_bytes / seconds / 1e9})
    finally:
        here.send("stop")
        child.join(60)
        t.close()
    return rows


def copy_gbytes_per_s(nbytes: int, device: str, reps: int = 3) -> float:
    """Same-device copy rate (bytes copied per second, not read + write): the transfer's ceiling."""
    import time
    src = torch.full((nbytes,), 0x33, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    cuda = torch.device(device).type == "cuda"
    times = []
    for rep in range(reps + 1):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        if cuda:
            torch.cuda.synchronize(device)
        if rep:
            times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def _device(name: str) -> str:
    """Pools are registered with NIXL as DRAM or VRAM, so only the CPU and CUDA devices can hold them.
    The CPU is one DRAM whatever index torch was given (``cpu:1``), so it is reported as ``cpu``."""
    from kvwire.commands.model_args import resolve_device
    from kvwire.errors import UsageError

    device = resolve_device(name)
    if device.type == "cpu":
        return "cpu"
    if device.type != "cuda":
        raise UsageError(f"--device {name}: pools live in DRAM (cpu) or VRAM (cuda); use auto, cpu or cuda")
    return str(device)


def _prompts(text: str) -> list[int]:
    """Each length needs one full page to push (the newest token's page stays the bf16 tail)."""
    from kvwire.errors import UsageError

    try:
        prompts = [token_count(x) for x in text.split(",")]
    except ValueError:
        raise UsageError(f"--prompts takes comma-separated token counts, e.g. 1024,4k; got {text!r}") from None
    if min(prompts) <= PAGE_SIZE:
        raise UsageError(f"--prompts: each length must be at least {PAGE_SIZE + 1} tokens (one full page of "
                         f"{PAGE_SIZE} to send); got {text!r}")
    return prompts


def run(args: argparse.Namespace) -> dict:
    from kvwire.errors import UsageError
    from kvwire.model.config import SHAPES
    if args.shape not in SHAPES:
        raise UsageError(f"unknown --shape {args.shape!r}; known: {', '.join(SHAPES)}")
    if args.reps < 1:
        raise UsageError(f"--reps must be at least 1, got {args.reps}")
    cfg = SHAPES[args.shape]
    prompts = _prompts(args.prompts)
    device = _device(args.device)
    formats = [KVFormat.parse(name) for name in args.formats.split(",")]    # all checked before any runs
    rows = []
    for kv in formats:
        fmt = PageFormat(kv, PAGE_SIZE, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        print(f"[bench transfer] {kv.name}: {len(prompts)} prompt lengths on {device}", flush=True)
        rows += _one_format(fmt, prompts, device, args.reps)
    biggest = max(r["wire_bytes"] for r in rows)
    copy = copy_gbytes_per_s(biggest, device)
    for r in rows:
        r["vs_copy"] = r["gb_s"] / copy
    return {"shape": args.shape, "device": device, "mode": "push", "reps": args.reps,
            "copy_gb_s": copy, "copy_bytes": biggest, "rows": rows}


def format_table(result: dict) -> str:
    lines = [f"KV transfer per request, {result['shape']} shape, {result['device']} pools, NIXL {result['mode']}, "
             f"median of {result['reps']}; same-device copy of {result['copy_bytes'] / 1e6:.0f} MB: "
             f"{result['copy_gb_s']:.1f} GB/s",
             f"{'format':<17} {'tokens':>7} {'wire MB':>9} {'bf16 MB':>9} {'ratio':>6} {'descr':>5} "
             f"{'ms':>9} {'GB/s':>7} {'vs copy':>7}"]
    for r in result["rows"]:
        lines.append(f"{r['format']:<17} {r['prompt_tokens']:>7} {r['wire_bytes'] / 1e6:>9.1f} "
                     f"{r['bf16_bytes'] / 1e6:>9.1f} {r['ratio']:>6.3f} {r['descriptors']:>5} "
                     f"{r['ms']:>9.2f} {r['gb_s']:>7.2f} {r['vs_copy']:>7.2f}")
    return "\n".join(lines)
