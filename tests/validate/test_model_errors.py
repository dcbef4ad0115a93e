"""A --model that is missing or unreadable is one line and exit 2 under `kvwire validate`, with the
message `kvwire formats` gives for it (both read it through kvwire.commands.model_args)."""
import json

import pytest

from kvwire.cli import main


def _no_format_dir(tmp_path):
    path = tmp_path / "empty-dir"      # exists, but is neither a .gguf nor a Hugging Face directory
    path.mkdir()
    return path


def _bad_gguf(tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"not gguf!")
    return path


def _incomplete_hf(tmp_path):
    path = tmp_path / "hf"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


@pytest.mark.parametrize("make", [_no_format_dir, _bad_gguf, _incomplete_hf, lambda p: p / "missing"])
@pytest.mark.parametrize("backend", [[], ["--backend", "router", "--target", "127.0.0.1:9"]])
def test_bad_model_is_one_line_like_formats(tmp_path, capsys, make, backend):
    model = str(make(tmp_path))
    assert main(["formats", "--model", model]) == 2
    expected = capsys.readouterr().err.removeprefix("kvwire formats: ")
    code = main(["validate", "--model", model, *backend, "--no-progress", "--out", str(tmp_path / "v")])
    err = capsys.readouterr().err
    assert code == 2
    assert err == "kvwire validate: " + expected and err.count("\n") == 1


def test_python_m_entry_point_says_the_same(tmp_path, capsys):
    from kvwire.validate.cli import main as module_main

    model = str(_no_format_dir(tmp_path))
    assert module_main(["--model", model, "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvwire validate: error: cannot tell how to load") and err.count("\n") == 1
