"""`kvwire bench serve`: closed-loop load through the router, per KV format: TTFT, TPOT, tokens/s.

``--concurrency`` clients each send a request, wait for its last token, and send the next,
until ``--requests`` per format are done. Prompts are seeded random token ids of exactly
``--prompt-tokens`` (distinct per request, so the prefix cache does not flatter TTFT) and
every request generates ``--output-tokens`` (EOS ignored). Against ``--router HOST:PORT``, or,
without it, a router this command starts with one pool per format, on a local Ray cluster of its
own or, with ``--address``, on an existing one (as `kvwire serve --address`; under `ray job
submit`, ``--address auto`` is the job's cluster). The exit status is 1 when a format had no
successful request (the JSON is written first).
"""
from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor


# Flags that describe the pools this command starts: meaningless against a running --router.
POOL_FLAGS = ("model", "load_format", "model_shape", "device", "num_pages", "address")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--router", metavar="HOST:PORT", help="a running `kvwire serve` (default: start one here)")
    parser.add_argument("--address", metavar="RAY_ADDRESS",
                        help="start the router's pools on this Ray cluster (e.g. head-svc:6379, or 'auto' "
                             "for the cluster of a `ray job submit` job) instead of a local Ray of its own")
    parser.add_argument("--kv-formats", help="comma-separated formats (default: with --router, every format it "
                        "serves; without, bf16,nvfp4)")
    parser.add_argument("--concurrency", type=int, default=8, help="clients in the closed loop (default 8)")
    parser.add_argument("--requests", type=int, default=32, help="requests per format (default 32)")
    parser.add_argument("--prompt-tokens", type=int, default=512, help="prompt length in tokens (default 512)")
    parser.add_argument("--output-tokens", type=int, default=32, help="tokens generated per request (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the prompts (default 0)")
    parser.add_argument("--num-pages", type=int, default=None, help="KV pages per worker when starting the router")
    from kvwire.commands.model_args import add_model_arguments
    add_model_arguments(parser)   # the model of the pools this command starts
    # None: not given, so the pools take PoolConfig's defaults (those the help names) and --router
    # can tell the flags were not passed.
    parser.set_defaults(model=None, load_format=None, model_shape=None, device=None)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[k]


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 30000) for _ in range(n)]  # ordinary vocabulary ids, no specials


def _load(target: str, fmt: str, args: argparse.Namespace) -> dict:
    import grpc

    from router.client import RouterClient

    rng = random.Random(f"{args.seed}-{fmt}")
    prompts = [_prompt(rng, args.prompt_tokens) for _ in range(args.requests)]
    lock = threading.Lock()
    rows: list[dict] = []
    errors: dict[str, int] = {}
    messages: dict[str, str] = {}           # the first message of each status code
    next_index = iter(range(args.requests))

    def client_loop() -> None:
        with RouterClient(target, timeout_s=600) as client:
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                start = time.perf_counter()
                try:
                    done = client.complete(prompt_ids=prompts[i], kv_format=fmt, max_tokens=args.output_tokens,
                                           ignore_eos=True).finished
                except grpc.RpcError as exc:
                    with lock:
                        errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                        messages.setdefault(exc.code().name, exc.details())
                    continue
                end = time.perf_counter()
                ttft = done.ttft_s
                tpot = (done.total_s - ttft) / (done.completion_tokens - 1) if done.completion_tokens > 1 else 0.0
                with lock:
                    rows.append({"ttft_s": ttft, "tpot_s": tpot, "latency_s": end - start,
                                 "completion_tokens": done.completion_tokens, "wire_bytes": done.wire_bytes,
                                 "wire_bf16_bytes": done.wire_bf16_bytes})

    wall = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as ex:
        for f in [ex.submit(client_loop) for _ in range(args.concurrency)]:
            f.result()
    wall = time.perf_counter() - wall
    ttfts, tpots = [r["ttft_s"] for r in rows], [r["tpot_s"] for r in rows]
    tokens = sum(r["completion_tokens"] for r in rows)
    wire = sum(r["wire_bytes"] for r in rows)
    bf16 = sum(r["wire_bf16_bytes"] for r in rows)
    return {"kv_format": fmt, "requests_ok": len(rows), "errors": errors, "error_messages": messages, "wall_s": wall,
            "ttft_p50_s": _percentile(ttfts, 0.5), "ttft_p90_s": _percentile(ttfts, 0.9),
            "tpot_p50_s": _percentile(tpots, 0.5), "tpot_p90_s": _percentile(tpots, 0.9),
            "tpot_mean_s": statistics.fmean(tpots) if tpots else float("nan"),
            "output_tokens_per_s": tokens / wall if wall else 0.0, "wire_bytes": wire, "wire_bf16_bytes": bf16,
            "wire_ratio": wire / bf16 if bf16 else float("nan")}


def _served_formats(target: str) -> list[str]:
    """The KV formats of the router's pools, in its order (default pool first)."""
    import grpc

    from kvwire.errors import UsageError
    from router.client import RouterClient

    try:
        with RouterClient(target, timeout_s=30) as client:
            pools = sorted(client.list_pools().pools, key=lambda p: not p.is_default)
    except grpc.RpcError as exc:
        raise UsageError(f"cannot ask the router at {target} for its pools: "
                         f"{exc.code().name}: {exc.details()}") from None
    return list(dict.fromkeys(p.kv_format for p in pools))


def run(args: argparse.Namespace) -> dict:
    from kvwire.errors import UsageError
    from kvwire.formats import KVFormat

    asked = args.kv_formats if args.kv_formats is not None else ("" if args.router else "bf16,nvfp4")
    formats = [KVFormat.parse(f.strip()).name for f in asked.split(",") if f.strip()]
    twice = sorted({f for f in formats if formats.count(f) > 1})
    if twice:
        raise UsageError(f"--kv-formats names {', '.join(twice)} more than once")
    if args.router:
        given = [f"--{k.replace('_', '-')}" for k in POOL_FLAGS if getattr(args, k) is not None]
        if given:
            raise UsageError(f"{', '.join(given)} describe the pools this command starts; with --router, "
                             f"the pools of that router are measured as they are")
        served = _served_formats(args.router)
        formats = formats or served
        missing = [f for f in formats if f not in served]
        if missing:
            raise UsageError(f"{args.router} serves {', '.join(served)}; not {', '.join(missing)} (--kv-formats)")
    if not formats:
        raise UsageError("--kv-formats needs at least one format")
    for key in ("concurrency", "requests", "prompt_tokens", "output_tokens"):
        if getattr(args, key) < 1:
            raise UsageError(f"--{key.replace('_', '-')} must be at least 1")
    router = None
    target = args.router
    if target is None:
        from router.config import ConfigError, PoolConfig, RouterConfig, ServeConfig
        from router.serve import start_router

        model = {k: getattr(args, k) for k in ("model", "load_format", "model_shape", "device")
                 if getattr(args, k) is not None}
        try:       # e.g. --num-pages 0: one line, as `kvwire serve` says it, before Ray starts
            pools = tuple(PoolConfig(f"bench-{f.replace('/', '-')}", kv_format=f, num_pages=args.num_pages,
                                     max_batch=max(args.concurrency, 1), **model) for f in formats)
            config = ServeConfig(RouterConfig(port=0, metrics_port=0, max_inflight=args.concurrency,
                                              max_queue=args.concurrency), pools)
        except ConfigError as exc:
            raise UsageError(str(exc)) from exc
        router = start_router(config, ray_address=args.address,
                              progress=lambda m: print(f"[bench serve] {m}", flush=True))
        target = router.target
    try:
        results = []
        for fmt in formats:
            print(f"[bench serve] {fmt}: {args.requests} requests, concurrency {args.concurrency}", flush=True)
            results.append(_load(target, fmt, args))
    finally:
        if router is not None:
            router.stop()
    return {"bench": "serve", "router": args.router or "started here", "concurrency": args.concurrency,
            "requests": args.requests, "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
            "date": time.strftime("%Y-%m-%d"), "results": results}


def failures(result: dict) -> list[str]:
    """A format none of whose requests succeeded measured nothing: its row of NaNs is not a result."""
    return [f"no request of {result['requests']} succeeded for {r['kv_format']}; the table lists the errors"
            for r in result["results"] if r["requests_ok"] == 0]


def format_table(result: dict) -> str:
    head = (f"closed loop, concurrency {result['concurrency']}, {result['prompt_tokens']} prompt + "
            f"{result['output_tokens']} output tokens, {result['requests']} requests per format\n"
            "| format | ok | errors | TTFT p50 (s) | TTFT p90 (s) | TPOT p50 (ms) | TPOT p90 (ms) | tokens/s | wire vs bf16 |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in result["results"]:
        errs = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "0"
        lines.append(f"| {r['kv_format']} | {r['requests_ok']} | {errs} | {r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f} "
                     f"| {1e3 * r['tpot_p50_s']:.1f} | {1e3 * r['tpot_p90_s']:.1f} | {r['output_tokens_per_s']:.1f} "
                     f"| {r['wire_ratio']:.3f} |")
    for r in result["results"]:
        for code, message in r.get("error_messages", {}).items():
            lines.append(f"{r['kv_format']}: {code}: {message}")
    return "\n".join(lines)
