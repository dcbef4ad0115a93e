"""The results file: every finished cell, saved after each one, so a stopped sweep resumes.

A cell is one (format, context length). The file also records the sweep's task settings and
their fingerprint: resuming with different settings would mix incomparable cells, so it is
refused with a message saying how to start over.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from kvwire.validate.config import ConfigError, SweepConfig, cell_key

SCHEMA = 1
START_OVER = "pass --fresh to start over or choose another --out"
# What ResultStore.start writes before the first cell, so every file the sweep saved has them.
REQUIRED = ("settings", "sweep", "formats", "cells")


class ResultStore:
    def __init__(self, path: Path, data: dict) -> None:
        self.path = path
        self.data = data

    @classmethod
    def open(cls, path: Path, config: SweepConfig, meta: dict, fresh: bool = False) -> "ResultStore":
        """Load ``path`` to resume (same task settings required), or start an empty file."""
        return cls.start(path, config, meta, None if fresh else check_resumable(path, config))

    @classmethod
    def start(cls, path: Path, config: SweepConfig, meta: dict, resumed: dict | None) -> "ResultStore":
        """A store on ``resumed`` (what ``check_resumable`` returned), or on an empty file for None."""
        data = resumed
        if data is None:
            data = {"schema": SCHEMA, "fingerprint": config.fingerprint(), "settings": config.task_settings(),
                    "meta": meta, "formats": {}, "cells": {}}
        else:
            data["meta"] = {**data.get("meta", {}), **meta}
        data["sweep"] = {"formats": list(config.formats), "lengths": list(config.lengths),
                         "tolerance": config.tolerance}
        store = cls(path, data)
        store.save()
        return store

    def has(self, fmt: str, length: int) -> bool:
        return cell_key(fmt, length) in self.data["cells"]

    def put(self, fmt: str, length: int, cell: dict) -> None:
        self.data["cells"][cell_key(fmt, length)] = cell
        self.save()

    def set_format(self, fmt: str, bytes_per_token: float, bf16_bytes_per_token: float) -> None:
        self.data["formats"][fmt] = {"bytes_per_token": bytes_per_token,
                                     "ratio_to_bf16": round(bytes_per_token / bf16_bytes_per_token, 4)}
        self.save()

    def save(self) -> None:
        """Write atomically: a crash mid-write must not lose the cells already finished."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=False))
        os.replace(tmp, self.path)


def check_resumable(path: Path, config: SweepConfig) -> dict | None:
    """The results at ``path`` if this sweep may add to them, None if there are none; refused if they were
    made with other task settings (the backend kind included), whose cells would not compare with these."""
    if not path.exists():
        return None
    data = load_results(path)
    if data.get("fingerprint") != config.fingerprint():
        changed = config.changed_settings(data.get("settings") or {})
        raise ConfigError(f"{path} was made with other task settings ({changed or 'its fingerprint differs'}); "
                          f"{START_OVER}")
    return data


def load_results(path: Path) -> dict:
    """The results file; one a crash or an editor left half-written is refused in one line, not a traceback."""
    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is unreadable (not JSON: {exc}); {START_OVER}") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ConfigError(f"{path} is not a kvwire validate results file of schema {SCHEMA}; {START_OVER}")
    missing = [k for k in REQUIRED if not isinstance(data.get(k), dict)]
    if missing:   # a hand-made or truncated file: the report would fail on the first missing key
        raise ConfigError(f"{path} lacks {', '.join(missing)}, which every results file has; {START_OVER}")
    return data
