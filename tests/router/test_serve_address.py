"""`kvwire serve --address` joins a Ray cluster someone else started, serves on it, and on SIGHUP
(its terminal closed; Ctrl-C is tests/router/test_serve_e2e.py's) stops its own workers but leaves
that cluster running."""
from __future__ import annotations

import subprocess

import pytest

from router.client import RouterClient
from tests.ray_head import BIN, ray_head
from tests.router.conftest import kvwire_exe, serving_target, wait_until

pytestmark = pytest.mark.slow


def test_serve_joins_an_existing_cluster_and_leaves_it_running(tmp_path):
    with ray_head(num_cpus=4, dashboard=False) as head:
        proc = subprocess.Popen([kvwire_exe(), "serve", "--address", head.address, "--port", "0",
                                 "--metrics-port", "0", "--num-pages", "128"], env={**head.env, "PYTHONUNBUFFERED": "1"},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "serving on" in line or "error" in line.lower():
                break
        assert any("joining the Ray cluster at " + head.address in ln for ln in lines), lines
        target = next((t for t in map(serving_target, lines) if t), None)
        assert target, "".join(lines)
        with RouterClient(target, timeout_s=120) as client:
            done = client.complete("The capital of France is", max_tokens=3).finished
        assert done.completion_tokens == 3
        proc.send_signal(subprocess.signal.SIGHUP)
        rest, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, "".join(lines) + rest

        def status() -> str:
            out = subprocess.run([str(BIN / "ray"), "status", "--address", head.address], env=head.env,
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, "the cluster should still be up: " + out.stderr
            return out.stdout
        # Our workers are gone (the status report refreshes every few seconds); the cluster is not.
        assert wait_until(lambda: "0.0/4.0 CPU" in status(), 60, 2.0), status()
