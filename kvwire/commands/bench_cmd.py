"""`kvwire bench ...`: GPU benchmarks, JSON out plus a table."""
from __future__ import annotations

import argparse

BENCHES = {
    "attention": "kvwire.bench.attention",
    "quantize": "kvwire.bench.quantize",
    "transfer": "transfer.bench_requests",
    "chunk": "kvwire.bench.chunk",
    "serve": "kvwire.bench.serve",
    "decode-step": "kvwire.bench.decode_step",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks: attention, quantize, chunk (GPU), transfer, serve, decode-step",
                       description="Benchmarks that write JSON (--out) and print a table. Ratios are "
                                   "measured in one run against the baseline each benchmark names.")
    bsub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    import importlib

    from kvwire.bench.out import add_out_argument
    for name, module in BENCHES.items():
        mod = importlib.import_module(module)
        bp = bsub.add_parser(name, help=(mod.__doc__ or name).strip().splitlines()[0],
                             description=mod.__doc__)
        add_out_argument(bp)
        mod.add_arguments(bp)
        bp.set_defaults(run=lambda args, mod=mod: _run(mod, args))


def _run(mod, args: argparse.Namespace) -> int:
    from kvwire.bench import run_and_judge
    return run_and_judge(mod, args, f"kvwire bench {args.bench}")
