"""`kvwire serve` started as a user would: a subprocess on free loopback ports, one per module."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
from tests.local_ray import RAY_ENV


def serving_target(line: str) -> str | None:
    """host:port from serve's "serving on HOST:PORT ..." line (None for other lines). Tests start
    serve with --port 0 and read the port it bound: a port picked beforehand can be taken by Ray's
    workers before serve binds it."""
    return line.split("serving on ", 1)[1].split()[0] if "serving on " in line else None


def metrics_port_of(lines: list[str]) -> int:
    """The port from serve's "metrics on http://HOST:PORT/metrics" line (0 when it printed none)."""
    for line in lines:
        if "metrics on http://" in line:
            return int(line.split("metrics on http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    return 0


def kvwire_exe() -> str:
    exe = Path(sys.executable).parent / "kvwire"
    if not exe.exists():
        pytest.skip("the kvwire console script is not installed next to this Python")
    return str(exe)


@dataclass
class Served:
    proc: subprocess.Popen
    target: str
    lines: list[str]

    @property
    def metrics_port(self) -> int:
        """Serve prints its metrics line just after the 'serving on' line the start waits for."""
        wait_until(lambda: metrics_port_of(self.lines) or self.proc.poll() is not None, 10.0, 0.05)
        return metrics_port_of(self.lines)

    def stop(self, timeout_s: float = 90.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def start_serve(config_text: str, tmp: Path, timeout_s: float = 240.0) -> Served:
    """Start `kvwire serve --config` and wait for its 'serving on' line (or fail with its output).
    Both ports are the OS's pick, read back from serve's output: a port chosen here beforehand can
    be taken by Ray's workers before serve binds it (seen as Errno 98)."""
    pytest.importorskip("ray")
    cfg = tmp / "pools.toml"
    cfg.write_text(config_text)
    env = {**os.environ, **RAY_ENV, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([kvwire_exe(), "serve", "--config", str(cfg), "--port", "0",
                             "--metrics-port", "any"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip())
            target = serving_target(line)
            if target:
                ready.put(target)
        ready.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        target = ready.get(timeout=timeout_s)
    except queue.Empty:
        target = None
    served = Served(proc, target or "", lines)
    if not target:
        served.stop(10)
        pytest.fail("kvwire serve did not start:\n" + "\n".join(lines[-40:]))
    return served


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("serve")


def wait_until(predicate, timeout_s: float, every_s: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return predicate()
