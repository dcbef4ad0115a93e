"""`kvwire serve`: the whole system on this machine (or on an existing Ray cluster)."""
from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading

from kvwire.errors import UsageError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="start prefill/decode workers and the gRPC router",
        description="Start a local Ray cluster on 127.0.0.1 (or join one with --address), one pool of "
                    "prefill and decode workers per KV format (default: one bf16 pool of SmolLM2 with one "
                    "worker of each role, on the GPU when there is one), and the gRPC router (kvwire.v1.Router, "
                    "health and reflection) with Prometheus metrics. Ctrl-C stops everything. Query it with "
                    "`kvwire generate --router 127.0.0.1:50051 \"PROMPT\"`.",
        epilog="A config file declares several pools side by side; see router/config.py for every key:\n"
               "  [router]\n  port = 50051\n  [[pools]]\n  name = \"smollm2-nvfp4\"\n  kv_format = \"nvfp4\"\n"
               "  prefill_workers = 1\n  decode_workers = 2",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="pools and router settings (TOML, YAML or JSON)")
    p.add_argument("--address", metavar="RAY_ADDRESS",
                   help="join this Ray cluster (e.g. head-svc:6379 or 'auto') instead of starting one")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1; 0.0.0.0 in a container)")
    p.add_argument("--port", type=int, help="gRPC port (default 50051)")
    p.add_argument("--metrics-port", type=metrics_port_arg, metavar="PORT|any",
                   help="Prometheus /metrics port (default 9464; 0 turns it off; 'any' lets the OS pick a "
                        "free one, printed at start)")
    p.add_argument("--kv-format", help="KV format of the default pool when no --config (default bf16)")
    p.add_argument("--device", help="worker device when no --config: auto, cpu or cuda (default auto)")
    p.add_argument("--num-pages", type=int, help="KV pages per worker when no --config (default: engine's)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="GPU decode steps replayed from CUDA graphs, when no --config (default on; "
                        "--no-cuda-graphs runs every step eagerly)")
    p.add_argument("--drain-timeout", type=float, metavar="SECONDS",
                   help="on Ctrl-C or SIGTERM, refuse new requests and give those in flight this long to "
                        "finish (default 30; 0 cancels them at once; a second Ctrl-C cancels them now)")
    p.set_defaults(run=run)


def metrics_port_arg(text: str) -> int | str:
    """--metrics-port's value: a port number or "any" (checked against 0-65535 by RouterConfig)."""
    if text == "any":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number or 'any', got {text!r}") from None


def build_config(args: argparse.Namespace):
    from router.config import ConfigError, PoolConfig, ServeConfig, load_config

    try:
        if args.config:
            if args.kv_format or args.device or args.num_pages or args.cuda_graphs is not None:
                raise UsageError("--kv-format/--device/--num-pages/--cuda-graphs describe the default pool; "
                                 "with --config, set them per pool in the file")
            config = load_config(args.config)
        else:
            fmt = args.kv_format or "bf16"
            config = ServeConfig(pools=(PoolConfig(f"smollm2-{fmt.replace('/', '-')}", kv_format=fmt,
                                                   device=args.device or "auto", num_pages=args.num_pages,
                                                   cuda_graphs=args.cuda_graphs is not False),))
        overrides = {k: v for k, v in (("host", args.host), ("port", args.port), ("metrics_port", args.metrics_port),
                                        ("drain_timeout_s", args.drain_timeout)) if v is not None}
        if overrides:
            config = dataclasses.replace(config, router=dataclasses.replace(config.router, **overrides))
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
    return config


def run(args: argparse.Namespace) -> int:
    import logging

    from router.serve import StartCancelled, StartError, start_router

    config = build_config(args)
    logging.basicConfig(level=logging.WARNING, format="[kvwire] %(levelname)s %(message)s")

    def progress(msg: str) -> None:
        print(f"[kvwire] {msg}", file=sys.stderr, flush=True)

    stop = threading.Event()
    running = []    # the router once started: a signal during its drain ends the drain

    def on_signal(*_) -> None:
        if stop.is_set() and running:
            running[0].hurry()
        stop.set()

    def handle_signals() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):    # SIGHUP: its terminal closed
            signal.signal(sig, on_signal)

    handle_signals()
    try:
        # ray.init puts its own SIGTERM handler on top (it logs, calls ours, then kills the process about
        # 3 s later): k8s and `docker stop` send SIGTERM, and the drain must run, so ours go back on top
        router = start_router(config, ray_address=args.address, progress=progress, cancel=stop,
                              after_ray=handle_signals)
    except (OSError, StartError) as exc:
        raise UsageError(f"cannot start: {exc}") from exc
    except StartCancelled:
        _say("[kvwire] stopped before serving")
        return 130
    running.append(router)
    try:
        print(f"[kvwire] serving on {router.target} (gRPC kvwire.v1.Router, health, reflection)", flush=True)
        if router.metrics_port:
            print(f"[kvwire] metrics on http://{config.router.host}:{router.metrics_port}/metrics", flush=True)
        for pc in config.pools:
            default = " (default)" if pc.name == config.default_pool else ""
            print(f"[kvwire] pool {pc.name}{default}: model {pc.model}, KV format {pc.kv_format}, "
                  f"{pc.prefill_workers} prefill + {pc.decode_workers} decode workers", flush=True)
        print("[kvwire] Ctrl-C to stop", flush=True)
        while not stop.wait(1.0):
            if router.wait(0):
                print("[kvwire] the router stopped unexpectedly", file=sys.stderr)
                return 1
    finally:
        _say("[kvwire] stopping")
        router.stop()
        _say("[kvwire] stopped")
    return 0


def _say(line: str) -> None:
    """A shutdown message; after SIGHUP the terminal may be gone, which must not stop the clean-up."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass
