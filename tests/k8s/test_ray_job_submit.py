"""The guide's `ray job submit` command (docs/deploy.md), run as written against a Ray head that
this test starts on 127.0.0.1 (only the dashboard address is swapped for the local one). The
same test GETs the health paths the manifests' readiness probes use, on that head.

The head comes from tests/ray_head.py (started as a user would, cleaned up without `ray stop`).
"""
from __future__ import annotations

import re
import shlex
import subprocess
import urllib.request

import pytest

from tests.k8s.render import K8S, ROOT, find, render_cached
from tests.ray_head import BIN, SUBMITTED, job_outcome, plain, ray_head, submit_job

GUIDE = ROOT / "docs" / "deploy.md"
MARK = "<!-- tests/k8s/test_ray_job_submit.py runs the next command"


def guide_command() -> list[str]:
    """The command in the fenced block right after the marker in docs/deploy.md."""
    text = GUIDE.read_text()
    m = re.search(re.escape(MARK) + r".*?-->\s*```sh\n(.*?)```", text, re.S)
    assert m, f"docs/deploy.md lost the block marked {MARK!r}"
    return shlex.split(m.group(1).replace("\\\n", " "))


@pytest.fixture()
def ray_head_fixture():
    """(dashboard URL, dashboard agent port, env) of a Ray head bound to 127.0.0.1, stopped after."""
    with ray_head(num_cpus=1, dashboard=True) as head:
        yield head.dashboard_url, head.agent_port, head.env


def test_guide_ray_job_submit_runs_on_a_local_head(ray_head_fixture) -> None:
    url, agent, env = ray_head_fixture
    argv = guide_command()
    assert argv[:3] == ["ray", "job", "submit"], argv
    assert argv[argv.index("--address") + 1] == "http://127.0.0.1:8265", "the guide's port-forwarded dashboard"
    argv[argv.index("--address") + 1] = url
    argv[0] = str(BIN / "ray")
    out = submit_job(argv, env, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "succeeded" in (out.stdout + out.stderr).lower()
    assert '"bytes_per_token"' in out.stdout, "the job's output (kvwire formats --json) is streamed back"

    # The readiness probes of the RayCluster answer on a real head: GCS via the dashboard,
    # the raylet via the dashboard agent.
    rc = find(render_cached(str(K8S / "overlays" / "small")), "RayCluster")[0]
    head_probe = rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    worker_probe = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert (head_probe["port"], worker_probe["port"]) == (8265, 52365), "Ray's default dashboard and agent ports"
    for base, path in ((url, head_probe["path"]), (f"http://127.0.0.1:{agent}", worker_probe["path"])):
        with urllib.request.urlopen(base + path, timeout=10) as r:
            assert r.status == 200 and r.read().strip() == b"success", path

    # What submit_job falls back on when `ray job submit` loses its log stream: the job's own
    # status and log, here for a job submitted without following it.
    quick = [str(BIN / "ray"), "job", "submit", "--address", url, "--no-wait", "--", "python", "-c", "print(6 * 7)"]
    sub = subprocess.run(quick, env=env, capture_output=True, text=True, timeout=120)
    job = SUBMITTED.search(plain(sub.stdout + sub.stderr))
    assert sub.returncode == 0 and job, sub.stdout[-2000:] + sub.stderr[-2000:]
    state, logs = job_outcome(str(BIN / "ray"), url, job.group(1), env, timeout=60)
    assert state == "SUCCEEDED" and "42" in logs, (state, logs[-2000:])
