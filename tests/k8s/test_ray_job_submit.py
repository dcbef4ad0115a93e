"""The guide's `ray job submit` command (docs/deploy.md), run as written against a Ray head that
this test starts on 127.0.0.1 (only the dashboard address is swapped for the local one). The
same test GETs the health paths the manifests' readiness probes use, on that head.

The head runs as `ray start --head --block` in a session of its own with a private temp dir;
cleanup signals that process group, then any process still naming the temp dir (ours alone),
and checks none is left. `ray stop` is never used: it would stop every Ray on the machine.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from tests.k8s.render import K8S, ROOT, find, render_cached

GUIDE = ROOT / "docs" / "deploy.md"
MARK = "<!-- tests/k8s/test_ray_job_submit.py runs the next command"
BIN = Path(sys.executable).parent
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def guide_command() -> list[str]:
    """The command in the fenced block right after the marker in docs/deploy.md."""
    text = GUIDE.read_text()
    m = re.search(re.escape(MARK) + r".*?-->\s*```sh\n(.*?)```", text, re.S)
    assert m, f"docs/deploy.md lost the block marked {MARK!r}"
    return shlex.split(m.group(1).replace("\\\n", " "))


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def our_pids(marker: str) -> list[int]:
    """Processes whose command line names our private temp dir."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


@pytest.fixture()
def ray_head():
    """(dashboard URL, dashboard agent port) of a Ray head bound to 127.0.0.1, stopped after."""
    if not (BIN / "ray").exists():
        pytest.fail("no ray CLI in the venv: scripts/setup.sh --test installs ray[default]")
    temp = tempfile.mkdtemp(prefix="kvk8s")
    gcs, dash, agent, client, metrics = free_ports(5)
    env = {**os.environ, **ENV, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
           f"--port={gcs}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
           f"--dashboard-port={dash}", f"--dashboard-agent-listen-port={agent}",
           f"--ray-client-server-port={client}", f"--metrics-export-port={metrics}",
           "--num-cpus=1", "--num-gpus=0", f"--temp-dir={temp}", "--disable-usage-stats"]
    head = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 45
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/gcs_healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray head did not come up (exit {head.poll()}); logs in {temp}")
            time.sleep(0.5)
        yield url, agent, env
    finally:
        try:
            os.killpg(head.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            head.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=10)
        for _ in range(20):
            left = our_pids(temp)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        assert not our_pids(temp), "Ray processes of the test's head are still running"


def test_guide_ray_job_submit_runs_on_a_local_head(ray_head) -> None:
    url, agent, env = ray_head
    argv = guide_command()
    assert argv[:3] == ["ray", "job", "submit"], argv
    assert argv[argv.index("--address") + 1] == "http://127.0.0.1:8265", "the guide's port-forwarded dashboard"
    argv[argv.index("--address") + 1] = url
    argv[0] = str(BIN / "ray")
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
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
