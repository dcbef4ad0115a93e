"""The test harness's Ray start retries only Ray's own start-up timeout, once, after killing what
the failed attempt started. A fake ``ray`` stands in: a raylet that misses its 30 s registration
window cannot be caused on demand."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.local_ray import _init_with_retry


class FakeRay:
    def __init__(self, errors: list[Exception]):
        self.errors = errors
        self.calls: list[str] = []
        self.started: list[subprocess.Popen] = []

    def init(self, **kwargs) -> None:
        """Like Ray, start processes (a GCS, a raylet) before finding out the start failed."""
        self.calls.append("init")
        self.started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
        if self.errors:
            raise self.errors.pop(0)

    def shutdown(self) -> None:
        self.calls.append("shutdown")


@pytest.fixture
def fake_ray():
    made: list[FakeRay] = []

    def make(errors: list[Exception]) -> FakeRay:
        made.append(FakeRay(errors))
        return made[-1]

    yield make
    for proc in (p for ray in made for p in ray.started):
        proc.kill()
        proc.wait()


def test_a_startup_timeout_is_retried_once_after_a_shutdown(fake_ray):
    ray = fake_ray([Exception("The current node timed out during startup. This could happen ...")])
    _init_with_retry(ray, 2, 100)
    assert ray.calls == ["init", "shutdown", "init"]
    failed, started = ray.started
    assert failed.wait(10) == -9, "the failed attempt's processes were left running"
    assert started.poll() is None, "the successful attempt's processes were killed"


def test_a_second_startup_timeout_is_raised(fake_ray):
    ray = fake_ray([Exception("timed out during startup")] * 2)
    with pytest.raises(Exception, match="timed out during startup"):
        _init_with_retry(ray, 2, 100)
    assert ray.calls == ["init", "shutdown", "init"]


def test_any_other_start_error_is_raised_at_once(fake_ray):
    ray = fake_ray([ValueError("bad object_store_memory")])
    with pytest.raises(ValueError, match="bad object_store_memory"):
        _init_with_retry(ray, 2, 100)
    assert ray.calls == ["init"]
