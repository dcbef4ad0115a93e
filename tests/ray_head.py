"""A Ray head started as a user would (`ray start --head --block`), bound to 127.0.0.1, for tests
of the paths that join an existing cluster (`kvwire serve --address`, `ray job submit`).

The head runs in a session of its own with a private temp dir; stopping it signals that process
group, then any process still naming the temp dir (ours alone), and checks none is left.
`ray stop` is never used: it would stop every Ray on the machine.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.local_ray import RAY_ENV

BIN = Path(sys.executable).parent
ENV = {**RAY_ENV, "RAY_USAGE_STATS_ENABLED": "0"}


@dataclass(frozen=True)
class RayHead:
    address: str          # GCS host:port, for ray.init / kvwire serve --address
    dashboard_url: str    # job API (empty without the dashboard)
    agent_port: int
    env: dict


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


def _up(head: subprocess.Popen, gcs: int, url: str) -> bool:
    if url:
        try:
            with urllib.request.urlopen(f"{url}/api/gcs_healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", gcs)) == 0


@contextlib.contextmanager
def ray_head(num_cpus: int = 1, dashboard: bool = True, timeout_s: float = 60.0):
    if not (BIN / "ray").exists():
        pytest.fail("no ray CLI in the venv: scripts/setup.sh --test installs ray[default]")
    temp = tempfile.mkdtemp(prefix="kvray")
    gcs, dash, agent, client, metrics = free_ports(5)
    env = {**os.environ, **ENV, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
           f"--port={gcs}", f"--include-dashboard={'true' if dashboard else 'false'}",
           "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--dashboard-agent-listen-port={agent}",
           f"--ray-client-server-port={client}", f"--metrics-export-port={metrics}",
           f"--num-cpus={num_cpus}", "--num-gpus=0", f"--temp-dir={temp}", "--disable-usage-stats"]
    head = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{dash}" if dashboard else ""
    try:
        deadline = time.monotonic() + timeout_s
        while not _up(head, gcs, url):
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray head did not come up (exit {head.poll()}); logs in {temp}")
            time.sleep(0.5)
        yield RayHead(f"127.0.0.1:{gcs}", url, agent, env)
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


# `ray job submit` tails the job's log over a WebSocket. Ray 2.60 raises when that socket closes
# abnormally (close code 1006; ray-project/ray#57037) and the command exits 1 while the job runs on
# (seen now and then in CI). What the job did is still known: ask for its status and logs.
STREAM_LOST = re.compile(r"WebSocket.*\b1006\b", re.S)
SUBMITTED = re.compile(r"Job '([^']+)' submitted successfully")
# `ray job status` (ray/dashboard/modules/job/cli.py, _log_job_status): "Job 'ID' succeeded", "... was
# stopped", "... failed" once it has ended, else "Status for job 'ID': PENDING" (or RUNNING)
ENDED = re.compile(r"Job '[^']+' (succeeded|failed|was stopped)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")          # Ray's CLI colours its output


def plain(text: str) -> str:
    return ANSI.sub("", text)


def job_outcome(ray: str, address: str, job_id: str, env: dict, timeout: float) -> tuple[str, str]:
    """(final state, whole log) of a submitted job once it has ended, asked every second through
    ``ray job status`` ("TIMEOUT" if it is still running at ``timeout``)."""
    ask = [ray, "job", "status", "--address", address, job_id]
    deadline, state = time.monotonic() + timeout, "TIMEOUT"
    while time.monotonic() < deadline:
        r = subprocess.run(ask, env=env, capture_output=True, text=True, timeout=60)
        m = ENDED.search(plain(r.stdout + r.stderr))
        if m:
            state = {"succeeded": "SUCCEEDED", "failed": "FAILED", "was stopped": "STOPPED"}[m.group(1)]
            break
        time.sleep(1.0)
    logs = subprocess.run([ray, "job", "logs", "--address", address, job_id], env=env, capture_output=True,
                          text=True, timeout=120).stdout
    return state, logs


def submit_job(argv: list[str], env: dict, timeout: float, **kw) -> subprocess.CompletedProcess:
    """Run a `ray job submit` command line. If only its log stream was lost, wait for the job to end
    and return its whole log, with returncode 0 if it succeeded, so the caller checks the job, not
    the stream."""
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    text = plain(run.stdout + run.stderr)
    job = SUBMITTED.search(text)
    if run.returncode == 0 or not STREAM_LOST.search(text) or not job:
        return run
    state, logs = job_outcome(argv[0], argv[argv.index("--address") + 1], job.group(1), env, timeout)
    print(f"`ray job submit` lost its log stream (WebSocket 1006); the job ended {state}")
    return subprocess.CompletedProcess(argv, 0 if state == "SUCCEEDED" else 1, f"{logs}\nJob {state.lower()}\n",
                                       run.stderr)
