"""The sweep's bookkeeping with an oracle backend (no model): cells, counts, prefix reuse,
resume, determinism, and the files a sweep leaves (JSON, PNG, report)."""
import dataclasses
import json

import pytest

from kvwire.validate.config import ConfigError, SweepConfig
from kvwire.validate.main import finish
from kvwire.validate.results import ResultStore
from kvwire.validate.sweep import run_sweep

CONFIG = SweepConfig(formats=("bf16", "nvfp4", "fp8-token"), lengths=(512, 768), questions=2, prefix_cold=2)


def sweep(tmp_path, backend, config=CONFIG, fresh=False):
    store = ResultStore.open(tmp_path / "results.json", config, {"model": "test"}, fresh=fresh)
    run_sweep(config, backend, backend.tok, store, progress=False)
    return store.data


def test_cells_count_every_task(tmp_path, oracle):
    # nvfp4 "fails" retrieval on prompts of 600+ tokens, i.e. only in the 768 cells.
    backend = oracle({("nvfp4", "retrieval"): 600})
    data = sweep(tmp_path, backend)
    assert backend.opened == ["bf16", "nvfp4", "fp8-token"], "one format at a time, bf16 first"
    assert set(data["cells"]) == {f"{f}@{n}" for f in CONFIG.formats for n in CONFIG.lengths}
    bf = data["cells"]["bf16@768"]
    assert bf["counts"] == {"passkey": [3, 3], "retrieval": [2, 2], "citation": [2, 2], "prefix": [2, 2]}
    assert data["cells"]["nvfp4@512"]["accuracy"]["retrieval"] == 1.0
    assert data["cells"]["nvfp4@768"]["accuracy"]["retrieval"] == 0.0
    assert data["cells"]["nvfp4@768"]["accuracy"]["citation"] == 1.0
    # Warm questions found the context's pages; the first ask of each haystack was cold.
    assert bf["prefix"]["first_ask_cold"] and bf["prefix"]["reuse_rate"] == 1.0
    assert bf["prefix"]["reusable_pages"] >= 3 * (768 * 0.8 // 16)
    assert data["formats"]["nvfp4"]["ratio_to_bf16"] == 0.28
    items = [it for it in bf["items"] if it["task"] == "passkey"]
    assert [it["depth"] for it in items] == [0.9, 0.5, 0.1], "deepest first, so shallower prompts reuse pages"
    assert items[1]["reused_pages"] > 0


def test_resume_runs_only_missing_cells_and_is_deterministic(tmp_path, oracle):
    first = sweep(tmp_path, oracle())
    data = json.loads((tmp_path / "results.json").read_text())
    del data["cells"]["nvfp4@768"]
    (tmp_path / "results.json").write_text(json.dumps(data))
    backend = oracle()
    again = sweep(tmp_path, backend)
    assert backend.opened == ["nvfp4"] and backend.calls > 0
    strip = lambda cells: {k: {**c, "seconds": 0} for k, c in cells.items()}  # noqa: E731
    assert strip(again["cells"]) == strip(first["cells"])
    backend = oracle()
    sweep(tmp_path, backend)
    assert backend.calls == 0, "a finished sweep runs nothing"


def test_other_task_settings_refuse_to_resume(tmp_path, oracle):
    sweep(tmp_path, oracle())
    other = SweepConfig(formats=CONFIG.formats, lengths=CONFIG.lengths, questions=1, prefix_cold=1)
    with pytest.raises(ConfigError, match="--fresh"):
        sweep(tmp_path, oracle(), other)
    assert len(sweep(tmp_path, oracle(), other, fresh=True)["cells"]) == 6


def test_another_backend_kind_refuses_to_resume(tmp_path, oracle):
    sweep(tmp_path, oracle())
    routed = dataclasses.replace(CONFIG, backend="routed")
    with pytest.raises(ConfigError, match="backend 'inprocess' there, 'routed' now.*--fresh"):
        sweep(tmp_path, oracle(), routed)
    assert sweep(tmp_path, oracle(), routed, fresh=True)["settings"]["backend"] == "routed"


@pytest.mark.parametrize("text", ['{"schema": 1, "cells": {"bf16@5', "", "\xff\xfe"])
def test_an_unreadable_results_file_is_refused_in_one_line(tmp_path, oracle, text):
    (tmp_path / "results.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError, match="results.json is unreadable.*--fresh"):
        sweep(tmp_path, oracle())
    with pytest.raises(ConfigError, match="unreadable"):
        finish(tmp_path)
    assert len(sweep(tmp_path, oracle(), fresh=True)["cells"]) == 6


def test_outputs_and_recommendation(tmp_path, oracle):
    sweep(tmp_path, oracle({("nvfp4", "citation"): 600}))
    rec, plots = finish(tmp_path)
    assert rec["format"] == "fp8-token", "nvfp4 is cheaper but loses citation at 768"
    assert plots == [tmp_path / "recall.png"], "only the plots written are named"
    for name in ("recall.png", "report.md"):
        assert (tmp_path / name).stat().st_size > 1000
    assert (tmp_path / "recall.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "fidelity.png").exists(), "no fidelity without the in-process engine"
    report = (tmp_path / "report.md").read_text()
    assert "**recommendation: fp8-token" in report and "citation at 768 tokens: 0% vs bf16 100%" in report
    assert json.loads((tmp_path / "results.json").read_text())["recommendation"]["format"] == "fp8-token"
