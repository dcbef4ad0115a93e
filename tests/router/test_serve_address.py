"""`kvwire serve --address` joins a Ray cluster someone else started, serves on it, and on SIGHUP
(its terminal closed; Ctrl-C is tests/router/test_serve_e2e.py's) stops its own workers but leaves
that cluster running."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

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


def test_serve_without_address_starts_its_own_ray_beside_a_running_cluster(tmp_path):
    """Without --address, serve must not join (or trip over) a cluster `ray start` left running.

    Ray finds such a cluster through ``$TMPDIR/ray/ray_current_cluster``, which `ray start` writes
    in its temp dir; this head has a private one, so the test writes that file where a serve with
    its own short TMPDIR looks (short: Ray's socket paths live under it)."""
    with ray_head(num_cpus=2, dashboard=False) as head:
        tmpdir = Path(tempfile.mkdtemp(prefix="kvt"))
        (tmpdir / "ray").mkdir()
        (tmpdir / "ray" / "ray_current_cluster").write_text(head.address)
        env = {k: v for k, v in head.env.items() if k != "RAY_ADDRESS"}
        proc = subprocess.Popen([kvwire_exe(), "serve", "--port", "0", "--metrics-port", "0", "--num-pages", "128"],
                                env={**env, "TMPDIR": str(tmpdir), "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "serving on" in line or "error" in line.lower():
                break
        target = next((t for t in map(serving_target, lines) if t), None)
        assert target, "".join(lines)
        with RouterClient(target, timeout_s=120) as client:
            assert client.complete("The capital of France is", max_tokens=2).finished.completion_tokens == 2
        proc.send_signal(subprocess.signal.SIGINT)
        rest, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, "".join(lines) + rest
        out = subprocess.run([str(BIN / "ray"), "status", "--address", head.address], env=head.env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, "the other cluster should still be up: " + out.stderr
        shutil.rmtree(tmpdir, ignore_errors=True)
