"""A Ray cluster started in the test process, bound to 127.0.0.1 (never the machine's other
address), with the environment the brief asks of tests; the tree (then the driver's own
PYTHONPATH) is on the actors' path: where ray itself comes from a PYTHONPATH entry (the GPU
machine's /tmp/site), actors given only the tree cannot import ray and never start."""
from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}


def actor_pythonpath() -> str:
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


@contextlib.contextmanager
def local_ray(num_cpus: int, object_store_mb: int) -> Iterator:
    """``ray`` initialised for the block, shut down after it; RAY_ENV set meanwhile, then restored."""
    import ray
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    try:
        ray.init(address="local", num_cpus=num_cpus, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
                 object_store_memory=object_store_mb * 1024 * 1024, configure_logging=False,
                 runtime_env={"env_vars": {"PYTHONPATH": actor_pythonpath(), **RAY_ENV}})
        yield ray
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
