"""The test harness's Ray start retries only Ray's own start-up timeout, once. A fake ``ray``
stands in: a raylet that misses its 30 s registration window cannot be caused on demand."""
from __future__ import annotations

import pytest

from tests.local_ray import _init_with_retry


class FakeRay:
    def __init__(self, errors: list[Exception]):
        self.errors = errors
        self.calls: list[str] = []

    def init(self, **kwargs) -> None:
        self.calls.append("init")
        if self.errors:
            raise self.errors.pop(0)

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def test_a_startup_timeout_is_retried_once_after_a_shutdown():
    ray = FakeRay([Exception("The current node timed out during startup. This could happen ...")])
    _init_with_retry(ray, 2, 100)
    assert ray.calls == ["init", "shutdown", "init"]


def test_a_second_startup_timeout_is_raised():
    ray = FakeRay([Exception("timed out during startup")] * 2)
    with pytest.raises(Exception, match="timed out during startup"):
        _init_with_retry(ray, 2, 100)
    assert ray.calls == ["init", "shutdown", "init"]


def test_any_other_start_error_is_raised_at_once():
    ray = FakeRay([ValueError("bad object_store_memory")])
    with pytest.raises(ValueError, match="bad object_store_memory"):
        _init_with_retry(ray, 2, 100)
    assert ray.calls == ["init"]
