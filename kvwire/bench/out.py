"""The benchmarks' ``--out`` JSON file: checked before anything is measured, written after.

A benchmark can run for minutes (or start a Ray cluster and load models) before it has a result to
write; a path that cannot take the file must fail at once, in one line, not lose the result to a
traceback at the end.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvwire.errors import UsageError
from kvwire.out_dir import check_writable_dir


def add_out_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None, metavar="FILE",
                        help="write the JSON result to this file (its directory is created; checked before "
                             "the run)")


def check_out(out: str | Path | None) -> Path | None:
    """``out`` as a Path once its directory exists and takes a new file there; None when not given.

    The directory gets a scratch file, not just an ``os.access`` check: root passes those even on a
    read-only filesystem. An existing file is opened for appending (its contents untouched).
    """
    if out is None or str(out) == "":
        return None
    path = Path(out)
    if path.is_dir():
        raise UsageError(f"--out {path}: is a directory; name a file, e.g. {path / 'result.json'}")
    check_writable_dir(path.parent, f"--out {path}", "its directory")
    if path.exists():
        try:
            with path.open("ab"):    # an existing file: appended to nothing, so its contents stay
                pass
        except OSError as exc:
            raise UsageError(f"--out {path}: cannot write a file there ({exc.strerror}); choose another --out") \
                from exc
    return path


def write_out(path: Path, result: dict) -> None:
    """Write the result; a failure now (the disk filled, the directory went away) is still one line."""
    try:
        path.write_text(json.dumps(result, indent=2))
    except OSError as exc:
        raise UsageError(f"--out {path}: cannot write the result ({exc.strerror})") from exc
