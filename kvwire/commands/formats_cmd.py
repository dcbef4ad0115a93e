"""`kvwire formats`: every KV format kvwire accepts, with its bytes per token for a model."""
from __future__ import annotations

import argparse
import json

from kvwire.commands.model_args import add_model_arguments, config_from_args
from kvwire.formats import PageFormat, listed_formats


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("formats", help="list KV formats and their bytes per token for the model",
                       description="List every KV page format for the loaded model: name, bytes per token "
                                   "(all layers, K and V, scales included), ratio to bf16, format hash. "
                                   "Mixed formats are KEYS/VALUES, e.g. fp8-token/nvfp4.")
    add_model_arguments(p)
    p.add_argument("--page-size", type=int, default=16, help="tokens per page (default 16)")
    p.add_argument("--all", action="store_true", help="list every KEYS/VALUES pair, not just the usual ones")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=run)


def format_rows(config, page_size: int, include_all_pairs: bool) -> list[dict]:
    rows = []
    for kv in listed_formats(include_all_pairs):
        pf = PageFormat(kv, page_size, config.num_layers, config.num_kv_heads, config.head_dim)
        rows.append({"name": kv.name, "keys": kv.key.name, "values": kv.value.name,
                     "bytes_per_token": pf.bytes_per_token, "ratio_to_bf16": round(pf.ratio_to_bf16, 4),
                     "page_bytes": pf.page_bytes, "hash": pf.hash})
    return rows


def run(args: argparse.Namespace) -> int:
    from kvwire.errors import UsageError

    if args.page_size < 1:      # before PageFormat refuses it with a traceback
        raise UsageError(f"--page-size must be at least 1, got {args.page_size}")
    config = config_from_args(args)
    rows = format_rows(config, args.page_size, args.all)
    if args.json:
        print(json.dumps({"model": config.name, "page_size": args.page_size, "formats": rows}, indent=2))
        return 0
    print(f"KV formats for {config.name} ({config.num_layers} layers, {config.num_kv_heads} KV heads, "
          f"head_dim {config.head_dim}), page size {args.page_size}")
    print(f"{'format':<20} {'keys':<11} {'values':<11} {'bytes/token':>12} {'vs bf16':>8}  hash")
    for r in rows:
        print(f"{r['name']:<20} {r['keys']:<11} {r['values']:<11} {r['bytes_per_token']:>12,.1f} "
              f"{r['ratio_to_bf16']:>8.3f}  {r['hash']}")
    return 0
