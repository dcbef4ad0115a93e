"""The sweep through the serving stack, as CI runs it: a small sweep (bf16 and NVFP4, two short
lengths) through `kvwire serve` (two pools, Ray actors, NIXL) and as a `ray job submit` against
a Ray head this test starts on 127.0.0.1. Both must leave the JSON, the PNG and the report, and
give the answers the in-process engine gives, token for token."""
import json
import subprocess
import sys

import pytest

from tests.ray_head import BIN, ray_head, submit_job
from tests.router.conftest import ROOT, start_serve
from tests.validate.conftest import TINY_SWEEP

pytestmark = pytest.mark.slow

SWEEP = TINY_SWEEP
POOLS = """
[[pools]]
name = "v-bf16"
kv_format = "bf16"
num_pages = 256
max_batch = 4

[[pools]]
name = "v-nvfp4"
kv_format = "nvfp4"
num_pages = 256
max_batch = 4
"""


@pytest.fixture(scope="module")
def inprocess(tiny_sweep):
    return json.loads((tiny_sweep / "results.json").read_text())


def answers(data: dict) -> dict:
    return {k: [(it["task"], it["text"]) for it in c["items"]] for k, c in data["cells"].items()}


def check_outputs(out, inprocess: dict) -> dict:
    data = json.loads((out / "results.json").read_text())
    assert set(data["cells"]) == set(inprocess["cells"])
    assert (out / "recall.png").read_bytes()[:4] == b"\x89PNG"
    assert "## Recommendation" in (out / "report.md").read_text()
    assert answers(data) == answers(inprocess), "the serving stack answers as the in-process engine does"
    for key, cell in data["cells"].items():
        assert cell["fidelity"] is None, "no model internals through the router"
        assert cell["counts"]["prefix"] == [1, 1] and cell["prefix"]["first_ask_cold"], key
        assert cell["prefix"]["reuse_rate"] > 0.9, (key, cell["prefix"])
    assert data["recommendation"] is not None
    return data


def test_sweep_through_kvwire_serve(tmp_path, inprocess):
    served = start_serve(POOLS, tmp_path)
    try:
        out = tmp_path / "routed"
        run = subprocess.run([sys.executable, "-m", "kvwire.validate", "--backend", "router", "--target",
                              served.target, *SWEEP, "--out", str(out)], cwd=ROOT, capture_output=True,
                             text=True, timeout=600)
    finally:
        served.stop()
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert f"plots: {out / 'recall.png'}\n" in run.stdout, "no fidelity plot through a router, so none named"
    data = check_outputs(out, inprocess)
    assert "router at 127.0.0.1" in data["meta"]["backend"]


def test_sweep_as_ray_job(tmp_path, inprocess):
    out = tmp_path / "job"
    with ray_head(num_cpus=4, dashboard=True) as head:
        submit = [str(BIN / "ray"), "job", "submit", "--address", head.dashboard_url, "--working-dir", "."]
        run = submit_job(submit + ["--", "python", "-m", "kvwire.validate", "--backend", "ray", *SWEEP,
                                   "--out", str(out), "--print-report"], head.env, timeout=900, cwd=ROOT)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "recommendation:" in run.stdout and "## Recommendation" in run.stdout, "report in the job log"
        # The working dir is uploaded without what .gitignore names (the venv above all).
        probe = submit_job(submit + ["--", "python", "-c",
                                     "import os; print('venv-uploaded', os.path.isdir('.venv'), "
                                     "os.path.isfile('kvwire/validate/cli.py'))"], head.env, timeout=300, cwd=ROOT)
        assert "venv-uploaded False True" in probe.stdout, probe.stdout[-2000:] + probe.stderr[-2000:]
    data = check_outputs(out, inprocess)
    assert "Ray pools" in data["meta"]["backend"]
