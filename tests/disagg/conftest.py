"""A real local Ray cluster on 127.0.0.1, one per test module (starting Ray costs seconds)."""
from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    ray.init(num_cpus=8, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * 1024 * 1024, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), **RAY_ENV}})
    try:
        yield ray
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
