"""Shared fixtures. The real SmolLM2 model takes seconds to load, so it is loaded once per session;
a real local Ray cluster on 127.0.0.1 starts once per test module that asks for it."""

from __future__ import annotations

import os

import pytest

from tests.local_ray import local_ray


@pytest.fixture(scope="session")
def smollm2():
    """(LlamaModel, Tokenizer) for the packaged SmolLM2-135M-Instruct GGUF, float32 on the CPU."""
    from kvwire.model import load_model

    return load_model("smollm2", dtype=None, device="cpu")


@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("ray")
    with local_ray(num_cpus=8, object_store_mb=200) as ray:
        yield ray


# The suite leaves native libraries loaded in this process (NIXL/UCX agents, gRPC, the Ray
# driver); one fresh-clone CI run, with every test passed, segfaulted afterwards while the
# interpreter tore them down, which turned a green run red. The result is known once pytest has
# unconfigured, so end the process there with pytest's own exit status and skip that teardown.
_exit_status: list[int] = []


def pytest_sessionfinish(session, exitstatus):
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    if _exit_status and not hasattr(config, "workerinput"):    # pytest-xdist workers exit their own way
        import sys
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])
