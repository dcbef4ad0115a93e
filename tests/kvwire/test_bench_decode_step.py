"""`kvwire bench decode-step` on the CPU: the eager path of each format runs through the CLI and
writes its JSON; a GPU table shows the graphs column; bad sizes are refused."""
import json

import pytest

from kvwire.bench.decode_step import format_table
from kvwire.cli import main
from kvwire.errors import UsageError


def test_cpu_run_writes_json(tmp_path, capsys):
    out = tmp_path / "step.json"
    rc = main(["bench", "decode-step", "--device", "cpu", "--formats", "bf16,fp8-token/nvfp4", "--batch", "2",
               "--context", "48", "--steps", "2", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and [r["format"] for r in result["rows"]] == ["bf16", "fp8-token/nvfp4"]
    assert all(r["eager_ms"] > 0 and "graphs_ms" not in r for r in result["rows"])
    assert "| fp8-token/nvfp4 |" in capsys.readouterr().out


def test_table_with_graphs():
    result = {"device": "NVIDIA H200", "model_shape": "smollm2-135m", "batch": 16, "context": 2048, "steps": 20,
              "rows": [{"format": "nvfp4", "eager_ms": 30.75, "graphs_ms": 3.32, "graphs_speedup": 30.75 / 3.32}]}
    assert "| nvfp4 | 30.75 | 3.32 | 9.3x |" in format_table(result)


def test_context_too_short_is_refused():
    from argparse import Namespace

    from kvwire.bench.decode_step import run
    with pytest.raises(UsageError, match="too short"):
        run(Namespace(model_shape="smollm2-135m", formats="bf16", batch=16, context=20, steps=20, device="cpu"))


def test_unknown_model_shape_is_one_line_exit_2(capsys):
    assert main(["bench", "decode-step", "--device", "cpu", "--model-shape", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvwire bench: error: unknown --model-shape 'nope'") and "smollm2-135m" in err, err
    assert len(err.splitlines()) == 1, err


def test_context_past_the_models_maximum_is_refused_before_it_loads(capsys, monkeypatch):
    """It used to prefill for about 50 s, then fail in RoPE (IndexError: index 8448 is out of bounds)."""
    import kvwire.model.registry

    def no_load(*args, **kw):
        raise AssertionError("the model loaded before --context was checked")

    monkeypatch.setattr(kvwire.model.registry, "load_model", no_load)
    assert main(["bench", "decode-step", "--device", "cpu", "--batch", "2", "--context", "9000", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "kvwire bench: error: --context 9000 is longer than smollm2-135m's maximum context (8192 tokens)"


def test_unknown_format_is_refused_before_the_model_loads(capsys, monkeypatch):
    import kvwire.model.registry

    monkeypatch.setattr(kvwire.model.registry, "load_model", lambda *a, **kw: pytest.fail("loaded the model"))
    assert main(["bench", "decode-step", "--device", "cpu", "--formats", "bf16,fp4", "--context", "48",
                 "--batch", "2", "--steps", "2"]) == 2
    assert "unknown KV format 'fp4'" in capsys.readouterr().err
