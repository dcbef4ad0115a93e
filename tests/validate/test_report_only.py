"""`--report-only` redraws measured results; a results file with no cells has none, so it says so in one
line and exits 2 instead of writing a report whose "recommendation: none" reads like a verdict."""
import json

import pytest

from kvwire.cli import main
from kvwire.validate.config import SweepConfig
from kvwire.validate.results import ResultStore


def _empty_results(out):
    """What a sweep stopped before its first cell finished leaves: settings, one format's size, no cells."""
    store = ResultStore.start(out / "results.json", SweepConfig(formats=("nvfp4",), lengths=(1024,)),
                              {"model": "test"}, None)
    store.set_format("bf16", 100.0, 100.0)


def test_report_only_without_cells_is_an_error(tmp_path, capsys):
    _empty_results(tmp_path)
    assert main(["validate", "--report-only", "--out", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "has no finished cells" in captured.err, captured.err
    assert not (tmp_path / "report.md").exists() and not (tmp_path / "recall.png").exists()


@pytest.mark.parametrize("text", ['{"schema": 1}', '{"schema": 1, "cells": {}}'])
def test_a_results_file_missing_its_sections_is_one_line(tmp_path, capsys, text):
    (tmp_path / "results.json").write_text(text)
    assert main(["validate", "--report-only", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lacks" in err and "sweep" in err, err


def test_report_only_with_some_cells_reports_unknown_sizes_as_unknown(tmp_path, capsys):
    _empty_results(tmp_path)
    data = json.loads((tmp_path / "results.json").read_text())
    counts = {"passkey": [3, 3], "retrieval": [3, 3], "citation": [3, 3], "prefix": [2, 2]}
    data["cells"]["bf16@1024"] = {"format": "bf16", "length": 1024, "seconds": 1.0, "counts": counts,
                                  "accuracy": {k: 1.0 for k in counts}, "prefix": {"reuse_rate": 1.0},
                                  "fidelity": None, "items": []}
    (tmp_path / "results.json").write_text(json.dumps(data))
    assert main(["validate", "--report-only", "--out", str(tmp_path)]) == 0
    assert "recommendation:" in capsys.readouterr().out
    report = (tmp_path / "report.md").read_text()
    assert "| `nvfp4` | ? | no |" in report and "nan" not in report, "nvfp4 never ran: its size is unknown"
