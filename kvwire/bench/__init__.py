"""Benchmarks behind `kvwire bench ...`: each module exposes ``add_arguments(parser)``,
``run(args) -> dict`` (JSON-able) and ``format_table(result) -> str``; ``report`` and
``module_main`` are what `kvwire bench NAME` and `python -m kvwire.bench.NAME` do with them."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import ModuleType


def report(mod: ModuleType, args: argparse.Namespace) -> dict:
    """Run a benchmark module, print its table, and write its JSON to ``args.out`` if given."""
    result = mod.run(args)
    print(mod.format_table(result))
    out = getattr(args, "out", None)
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))
        print(f"wrote {path}")
    return result


def module_main(mod: ModuleType, argv: list[str] | None = None) -> None:
    """``python -m kvwire.bench.NAME``: the module's own arguments, then ``report``."""
    parser = argparse.ArgumentParser(description=(mod.__doc__ or mod.__name__).strip().splitlines()[0])
    mod.add_arguments(parser)
    report(mod, parser.parse_args(argv))
