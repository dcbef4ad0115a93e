"""The sweep on the real model in this process: fidelity probes, a tiny sweep through the CLI
with all its outputs, resume, and answers equal to plain engine runs."""
import json

import pytest

from kvwire.validate.backends import InProcessBackend
from kvwire.validate.cli import main
from kvwire.validate.probe import compare, probe_positions
from kvwire.validate.prompts import make_haystack

pytestmark = pytest.mark.slow

from tests.validate.conftest import TINY_SWEEP as ARGS


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Two torch threads on the shared 2-core machine ran these 15x slower than one."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def backend(smollm2):
    model, tok = smollm2
    return InProcessBackend(model, tok)


def _probe(backend, tok, fmt, seed="p"):
    hay = make_haystack(tok, 384, 1, seed)
    ids = tok.encode(hay.context + hay.questions[0].suffix)
    pos = probe_positions(len(tok.encode(hay.context)), 12, 16)
    backend.open_format(fmt)
    try:
        return backend.complete(fmt, ids, 2, probe=pos)[1], ids
    finally:
        backend.close_format(fmt)


def test_fidelity_probe(backend, smollm2):
    tok = smollm2[1]
    ref, _ = _probe(backend, tok, "bf16")
    same = compare(ref, _probe(backend, tok, "bf16")[0])
    assert same["kl_mean"] == 0 and same["top1_agreement"] == 1 and same["attn_top1_agreement"] == 1
    nv = compare(ref, _probe(backend, tok, "nvfp4")[0])
    assert 0 < nv["kl_mean"] < 1, nv
    assert 0.5 < nv["attn_top1_agreement"] < 1, "NVFP4 keys move some attention maxima, not most"
    assert len(nv["attn_top1_per_layer"]) == smollm2[0].config.num_layers
    fp8 = compare(ref, _probe(backend, tok, "fp8-token")[0])
    assert fp8["kl_mean"] < nv["kl_mean"], "FP8 is closer to bf16 than NVFP4"


def test_probe_refuses_a_warm_request(backend, smollm2):
    tok = smollm2[1]
    hay = make_haystack(tok, 384, 1, "w")
    ids = tok.encode(hay.context + hay.questions[0].suffix)
    pos = probe_positions(len(tok.encode(hay.context)), 4, 16)
    backend.open_format("bf16")
    try:
        backend.complete("bf16", ids, 1)
        with pytest.raises(RuntimeError, match="cold"):
            backend.complete("bf16", ids, 1, probe=pos)
    finally:
        backend.close_format("bf16")


def test_cli_sweep_outputs_and_resume(tiny_sweep, capsys):
    out = tiny_sweep
    data = json.loads((out / "results.json").read_text())
    assert set(data["cells"]) == {"bf16@320", "bf16@384", "nvfp4@320", "nvfp4@384"}
    for key, cell in data["cells"].items():
        assert cell["counts"]["passkey"][1] == 3 and cell["counts"]["retrieval"][1] == 1
        assert cell["counts"]["prefix"] == [1, 1], f"{key}: warm answer differs from cold"
        assert cell["prefix"]["first_ask_cold"] and cell["prefix"]["reuse_rate"] == 1.0
        f = cell["fidelity"]
        assert (f["kl_mean"] == 0) == key.startswith("bf16"), (key, f)
    assert data["cells"]["bf16@384"]["counts"]["passkey"][0] == 3, "bf16 finds the passkey"
    for name in ("recall.png", "fidelity.png", "report.md"):
        assert (out / name).stat().st_size > 1000, name
    before = (out / "results.json").read_text()
    capsys.readouterr()
    assert main(ARGS + ["--out", str(out)]) == 0, "resume"
    stdout = capsys.readouterr().out
    assert "recommendation:" in stdout and f"plots: {out / 'recall.png'}, {out / 'fidelity.png'}\n" in stdout
    after = json.loads((out / "results.json").read_text())
    assert after["cells"] == json.loads(before)["cells"], "a finished sweep recomputes nothing"


def test_two_worker_processes_give_the_same_cells(tiny_sweep, tmp_path):
    out = tmp_path / "jobs"
    assert main(ARGS + ["--out", str(out), "--jobs", "2"]) == 0
    a = json.loads((tiny_sweep / "results.json").read_text())["cells"]
    b = json.loads((out / "results.json").read_text())["cells"]
    assert a.keys() == b.keys()
    for key in a:
        assert a[key]["items"] == b[key]["items"], key
        assert a[key]["fidelity"]["kl_mean"] == pytest.approx(b[key]["fidelity"]["kl_mean"], rel=1e-5, abs=1e-9)


def test_cold_helper_matches_the_engine(backend, smollm2):
    """complete_cold (a fresh engine) and a first ask on the sweep's engine agree token for token."""
    tok = smollm2[1]
    hay = make_haystack(tok, 400, 1, "c")
    ids = tok.encode(hay.context + hay.questions[0].suffix)
    backend.open_format("fp8-tensor")
    try:
        first, _ = backend.complete("fp8-tensor", ids, 6)
        cold = backend.complete_cold("fp8-tensor", ids, 6)
    finally:
        backend.close_format("fp8-tensor")
    assert first.prefix_pages_reused == 0 and cold.token_ids == first.token_ids
