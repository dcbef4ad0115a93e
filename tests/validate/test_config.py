"""Sweep settings: bf16 always runs first, bad settings are refused, fingerprints track results."""
import dataclasses
import json
from pathlib import Path

import pytest

from kvwire.validate.config import ConfigError, SweepConfig, backend_kind


def test_bf16_is_added_and_runs_first():
    assert SweepConfig(formats=("nvfp4",)).formats == ("bf16", "nvfp4")
    assert SweepConfig(formats=("nvfp4", "bf16", "fp8-token/nvfp4")).formats == ("bf16", "nvfp4", "fp8-token/nvfp4")


def test_default_formats_include_mixed_ones():
    f = SweepConfig().formats
    assert "fp8-token/nvfp4" in f and "fp8-tensor" in f and "fp8-page" in f and len(f) >= 7


@pytest.mark.parametrize("kwargs,match", [
    ({"formats": ("fp7",)}, "unknown KV format"),
    ({"formats": ("nvfp4", "nvfp4")}, "twice"),
    ({"lengths": (100,)}, "at least 256"),
    ({"samples": 0}, "samples"),
    ({"questions": 1, "prefix_cold": 2}, "prefix_cold"),
    ({"tolerance": -1}, "tolerance"),
    ({"chunk_size": 100}, "multiple"),
])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        SweepConfig(**kwargs)


def test_lengths_fit_the_context():
    c = SweepConfig(lengths=(1024, 4096, 8192)).fit_lengths(8192)
    assert c.lengths[:2] == (1024, 4096) and 8000 <= c.lengths[2] < 8192
    assert SweepConfig(lengths=(1024, 4096, 8192)).fit_lengths(2048).lengths == (1024, 2048 - 96)
    with pytest.raises(ConfigError):
        SweepConfig().fit_lengths(300)


def test_fingerprint_follows_task_settings_only():
    base = SweepConfig()
    assert base.fingerprint() == dataclasses.replace(base, tolerance=5.0, formats=("nvfp4",)).fingerprint()
    assert base.fingerprint() != dataclasses.replace(base, seed=1).fingerprint()
    assert base.fingerprint() != dataclasses.replace(base, questions=2, prefix_cold=1).fingerprint()


def test_backend_kind_is_a_task_setting():
    """Routed cells have no fidelity and cold answers only on first asks: they must not mix with in-process
    ones. `router` and `ray` both go through a router, so they share a kind."""
    base = SweepConfig()
    routed = dataclasses.replace(base, backend=backend_kind("router"))
    assert backend_kind("ray") == backend_kind("router") != backend_kind("inprocess")
    assert routed.fingerprint() != base.fingerprint()
    assert "backend 'inprocess' there, 'routed' now" in routed.changed_settings(base.task_settings())
    with pytest.raises(ConfigError, match="backend"):
        backend_kind("grpc")
    with pytest.raises(ConfigError, match="backend kind"):
        SweepConfig(backend="router")


def test_in_process_fingerprint_is_unchanged_for_older_results_files():
    """Results written before the backend kind was recorded (all in-process) still resume."""
    data = json.loads((Path(__file__).parents[2] / "docs/validation/cpu/results.json").read_text())
    assert SweepConfig(**data["settings"]).fingerprint() == data["fingerprint"]


def test_clipped_lengths_are_announced(capsys):
    from kvwire.validate.cli import build_parser
    from kvwire.validate.main import sweep_config

    config = sweep_config(build_parser().parse_args(["--lengths", "1024,16384"]), 8192)
    assert config.lengths[0] == 1024 and config.lengths[1] < 8192
    err = capsys.readouterr().err
    assert "lengths 16384 clipped to" in err and "context is 8192" in err
    sweep_config(build_parser().parse_args(["--lengths", "1024,2048"]), 8192)
    assert capsys.readouterr().err == ""
