"""Benchmarks behind `kvwire bench ...`: each module exposes ``add_arguments(parser)``,
``run(args) -> dict`` (JSON-able) and ``format_table(result) -> str``."""
