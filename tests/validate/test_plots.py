"""Recall panels have fixed accuracy limits (0-100% and a small margin): formats tied at 100% must look
tied, not spread over a panel zoomed to the 0.4-point offsets that keep their lines apart."""
import matplotlib
import pytest

from kvwire.validate.plots import recall_plot

FORMATS = ["bf16", "fp8-token", "nvfp4", "fp8-token/nvfp4"]
LENGTHS = [1024, 2048]


def _results(accuracy: float) -> dict:
    """Every format at ``accuracy`` on every task and length (ties everywhere)."""
    tasks = ("passkey", "retrieval", "citation", "prefix")
    cells = {f"{f}@{n}": {"format": f, "length": n, "accuracy": {t: accuracy for t in tasks}}
             for f in FORMATS for n in LENGTHS}
    return {"sweep": {"formats": FORMATS, "lengths": LENGTHS, "tolerance": 2.0}, "cells": cells,
            "meta": {"model": "test"}}


@pytest.fixture()
def saved_ylims(monkeypatch):
    """The y-limits of each axis of every figure saved, read as it is written."""
    from matplotlib.figure import Figure

    matplotlib.use("Agg")
    seen: list[list[tuple[float, float]]] = []
    save = Figure.savefig

    def spy(fig, *args, **kwargs):
        seen.append([ax.get_ylim() for ax in fig.axes if ax.axison])
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return seen


@pytest.mark.parametrize("accuracy", [1.0, 0.0, 0.5])
def test_tied_formats_get_the_full_accuracy_range(tmp_path, saved_ylims, accuracy):
    assert recall_plot(_results(accuracy), tmp_path / "recall.png") == tmp_path / "recall.png"
    (limits,) = saved_ylims
    assert len(limits) == 4, "one panel per task"
    for low, high in limits:
        assert -5 <= low <= 0 and 100 <= high <= 105, (low, high)
        assert high - low >= 100, "the whole 0-100% range, whatever the data"
