"""What one validation sweep measures: formats x context lengths x seeds, and how.

Frozen so a sweep's identity can be written into its results file and checked on resume: a
resumed run with different task settings would mix incomparable cells, so it is refused.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from dataclasses import dataclass

from kvwire.formats import KVFormat, listed_formats

BASELINE = "bf16"
DEFAULT_LENGTHS = (1024, 2048, 4096, 8192)
PASSKEY_DEPTHS = (0.1, 0.5, 0.9)
# Room left at the end of the context for the question's answer (tokens).
ANSWER_ROOM = 32


class Task(enum.Enum):
    """Recall tasks drawn as curves; each cell reports an accuracy in [0, 1] for each."""

    PASSKEY = "passkey"          # a 5-digit number at 10/50/90% depth of filler
    RETRIEVAL = "retrieval"      # key -> value among many facts with near-duplicate keys
    CITATION = "citation"        # which document holds a given fact (its id)
    PREFIX = "prefix"            # warm (prefix-cache hit) answer == cold answer, token for token

    @property
    def is_recall(self) -> bool:
        """Tasks the recommendation compares against bf16 within the tolerance."""
        return self is not Task.PREFIX


class ConfigError(ValueError):
    """A sweep setting that cannot work; the message says what is allowed."""


INPROCESS = "inprocess"
ROUTED = "routed"
BACKEND_KINDS = {"inprocess": INPROCESS, "router": ROUTED, "ray": ROUTED}


def backend_kind(backend: str) -> str:
    """What a --backend measures, for the results file: the in-process engine (fidelity, cold answers
    on demand) or a router (`router` and `ray` both send every prompt through one, with the same pool
    settings, so their cells are the same measurement and may share a results file)."""
    if backend not in BACKEND_KINDS:
        raise ConfigError(f"unknown backend {backend!r}; one of {', '.join(BACKEND_KINDS)}")
    return BACKEND_KINDS[backend]


@dataclass(frozen=True)
class SweepConfig:
    formats: tuple[str, ...] = tuple(f.name for f in listed_formats())
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    samples: int = 1               # seeds per cell; each gives 3 passkey prompts and one haystack
    questions: int = 3             # retrieval and citation questions per haystack
    prefix_cold: int = 2           # questions whose cold answer is compared with the warm one
    seed: int = 0
    tolerance: float = 2.0         # percentage points below bf16 a format may fall, at every length
    probe_positions: int = 48      # text positions for KL / top-1 / attention agreement
    page_size: int = 16
    chunk_size: int = 512
    model: str = "smollm2"
    backend: str = INPROCESS       # backend_kind(): in-process cells have fidelity, routed ones do not

    def __post_init__(self) -> None:
        if self.backend not in (INPROCESS, ROUTED):
            raise ConfigError(f"backend kind must be {INPROCESS!r} or {ROUTED!r}, got {self.backend!r}")
        if not self.formats:
            raise ConfigError("give at least one KV format")
        names = []
        for name in self.formats:
            try:
                names.append(KVFormat.parse(name).name)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        if len(set(names)) != len(names):
            raise ConfigError(f"a format is listed twice: {', '.join(names)}")
        if BASELINE not in names:
            names.insert(0, BASELINE)     # every comparison is against bf16, so it always runs
        else:                             # and runs first, so fidelity references exist in order
            names.remove(BASELINE)
            names.insert(0, BASELINE)
        object.__setattr__(self, "formats", tuple(names))
        if not self.lengths or any(n < 256 for n in self.lengths):
            raise ConfigError(f"context lengths must be at least 256 tokens, got {list(self.lengths)}")
        object.__setattr__(self, "lengths", tuple(sorted(set(self.lengths))))
        for key, low in (("samples", 1), ("questions", 1), ("prefix_cold", 1), ("probe_positions", 1),
                         ("page_size", 1), ("chunk_size", 1)):
            if getattr(self, key) < low:
                raise ConfigError(f"{key} must be at least {low}, got {getattr(self, key)}")
        if self.prefix_cold > self.questions:
            raise ConfigError(f"prefix_cold ({self.prefix_cold}) cannot exceed questions ({self.questions})")
        if not 0 <= self.tolerance <= 100:
            raise ConfigError(f"tolerance is in percentage points, 0..100; got {self.tolerance}")
        if self.chunk_size % self.page_size:
            raise ConfigError(f"chunk_size ({self.chunk_size}) must be a multiple of page_size ({self.page_size})")

    def fit_lengths(self, max_context: int) -> "SweepConfig":
        """The same sweep with lengths that fit the model: too-long ones clipped to the context
        minus room for the question and answer (so 8192 on an 8k model becomes 8192 - 32)."""
        limit = max_context - ANSWER_ROOM - 64
        if limit < 256:
            raise ConfigError(f"the model's context ({max_context}) is too short to validate")
        return dataclasses.replace(self, lengths=tuple(sorted({min(n, limit) for n in self.lengths})))

    def check_min_length(self, minimum: int) -> None:
        """Refuse lengths below ``minimum`` (prompts.min_haystack_tokens: it needs the tokenizer, so the
        caller computes it) before any prompt runs, rather than failing in the haystack after the passkey
        prompts of that length have run."""
        short = [n for n in self.lengths if n < minimum]
        if short:
            q = self.questions
            fewer = "; or ask fewer --questions" if q > 1 else ""
            lengths = f"lengths {', '.join(map(str, short))} are" if len(short) > 1 else f"length {short[0]} is"
            raise ConfigError(f"context {lengths} too short for a haystack with {q} "
                              f"question{'s' if q > 1 else ''}: the smallest that works is {minimum} tokens{fewer}")

    def task_settings(self) -> dict:
        """Everything that changes a cell's result (not formats/lengths: cells are keyed by those).

        The in-process backend is left out, so that results files written before the backend kind was
        recorded (docs/validation's, all in-process) keep their fingerprint and still resume."""
        d = dataclasses.asdict(self)
        for key in ("formats", "lengths", "tolerance"):
            d.pop(key)
        if d["backend"] == INPROCESS:
            d.pop("backend")
        return d

    def changed_settings(self, recorded: dict) -> str:
        """How ``recorded`` (a results file's settings) differs from this sweep's, for the refusal."""
        mine = {"backend": INPROCESS, **self.task_settings()}
        theirs = {"backend": INPROCESS, **recorded}
        keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        return ", ".join(f"{k} {theirs.get(k)!r} there, {mine.get(k)!r} now" for k in keys)

    def fingerprint(self) -> str:
        blob = json.dumps(self.task_settings(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def cell_key(fmt: str, length: int) -> str:
    return f"{fmt}@{length}"
