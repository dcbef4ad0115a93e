"""`kvwire validate`: the recall sweep (kvwire.validate), the same flags as `python -m kvwire.validate`."""
from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    from kvwire.validate.cli import DESCRIPTION, add_arguments

    p = sub.add_parser("validate", help="recall curves of every KV format vs bf16, and a recommendation",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The sweep's own mistakes become usage errors; Ctrl-C is answered here, before `kvwire`'s generic
    "interrupted", to say that the finished cells are kept."""
    from kvwire.errors import UsageError
    from kvwire.validate.backends import BackendError
    from kvwire.validate.cli import INTERRUPTED
    from kvwire.validate.cli import run as run_validate
    from kvwire.validate.config import ConfigError

    try:
        return run_validate(args)
    except (ConfigError, BackendError) as exc:
        raise UsageError(str(exc)) from exc
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 130
