"""A directory that a command's output must go to, checked before the command's work starts.

Benchmarks and sweeps run for minutes before they have anything to write; a path that cannot take a
file there must fail at once, in one line, not lose the result to a traceback at the end.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from kvwire.errors import UsageError


def check_writable_dir(directory: Path, flag: str, what: str = "the directory") -> None:
    """Create ``directory`` and write a scratch file there, or UsageError naming ``flag``. A scratch file,
    not an ``os.access`` check: root passes those even on a read-only filesystem."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise UsageError(f"{flag}: {exc.filename} is a file, not a directory; choose another --out") from exc
    except OSError as exc:
        raise UsageError(f"{flag}: cannot create {what} ({exc.strerror}: {exc.filename}); "
                         "choose another --out") from exc
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise UsageError(f"{flag}: cannot write a file there ({exc.strerror}); choose another --out") from exc
