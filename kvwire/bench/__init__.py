"""Benchmarks behind `kvwire bench ...`: each module exposes ``add_arguments(parser)``,
``run(args) -> dict`` (JSON-able) and ``format_table(result) -> str``, and may expose
``failures(result) -> list[str]`` (why a finished run did not measure what it was asked to);
``report`` and ``module_main`` are what `kvwire bench NAME` and `python -m kvwire.bench.NAME` do
with them."""
from __future__ import annotations

import argparse
import sys
from types import ModuleType

from kvwire.bench.out import add_out_argument, check_out, write_out


def report(mod: ModuleType, args: argparse.Namespace) -> dict:
    """Check ``args.out`` (before anything is measured), run a benchmark module, write its JSON there
    (first, so that a table that cannot be drawn does not lose it), and print its table."""
    out = check_out(getattr(args, "out", None))
    result = mod.run(args)
    if out is not None:
        write_out(out, result)
    print(mod.format_table(result))
    if out is not None:
        print(f"wrote {out}")
    return result


def run_and_judge(mod: ModuleType, args: argparse.Namespace, name: str) -> int:
    """``report``, then exit status 1 (each reason on stderr) if the module's ``failures`` finds the
    run measured nothing for part of what was asked: a zero status must mean numbers were taken."""
    result = report(mod, args)
    failures = getattr(mod, "failures", lambda _: [])(result)
    for line in failures:
        print(f"{name}: {line}", file=sys.stderr)
    return 1 if failures else 0


def module_main(mod: ModuleType, argv: list[str] | None = None) -> None:
    """``python -m kvwire.bench.NAME``: the module's own arguments and --out, then what `kvwire bench`
    does (a user error is one line and exit status 2 here too)."""
    from kvwire.errors import USER_ERRORS

    parser = argparse.ArgumentParser(description=(mod.__doc__ or mod.__name__).strip().splitlines()[0])
    add_out_argument(parser)
    mod.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        code = run_and_judge(mod, args, parser.prog)
    except USER_ERRORS as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
