"""Errors a user can fix by changing what they asked for; the CLI prints them in one line."""
from __future__ import annotations

from kvwire.formats import UnknownFormatError


class UsageError(ValueError):
    """Bad combination of command-line arguments."""


class ModelLoadError(RuntimeError):
    """The model could not be found or read; the message says how to get it."""


class StartError(RuntimeError):
    """The serving system cannot start as configured (a model that does not load, a CUDA device on a Ray
    cluster without GPUs): found before workers start, said in one line."""


class NoGpuError(RuntimeError):
    """A GPU-only command (the kernel benchmarks) ran where torch sees no CUDA device."""


def _user_errors() -> tuple[type[BaseException], ...]:
    from kvwire.engine import InvalidRequestError
    from kvwire.page_pool import OutOfPagesError
    return (UsageError, ModelLoadError, NoGpuError, StartError, UnknownFormatError, InvalidRequestError, OutOfPagesError,
            FileNotFoundError)


USER_ERRORS = _user_errors()
