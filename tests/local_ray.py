"""A Ray cluster started in the test process, bound to 127.0.0.1 (never the machine's other
address), with the environment the brief asks of tests; the tree (then the driver's own
PYTHONPATH) is on the actors' path: where ray itself comes from a PYTHONPATH entry (the GPU
machine's /tmp/site), actors given only the tree cannot import ray and never start."""
from __future__ import annotations

import contextlib
import os
import pathlib
import signal
from collections.abc import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}


def actor_pythonpath() -> str:
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


# Ray gives its raylet a fixed 30 s to register with the GCS (ray/_private/node.py). On the 2-core
# CI machine, while the previous module's cluster is still exiting, that has run out once (a
# fresh-clone CI run on dcc155a errored one module's fixture with "The current node timed out
# during startup"), so a start that times out is cleared away and tried again, once. Ray raises
# before it records the node, so ray.shutdown() cannot stop that attempt's GCS and raylet: the
# processes the attempt started (the test process's new descendants) are killed instead.
_STARTUP_TIMEOUT = "timed out during startup"


def _descendants() -> set[int]:
    """Pids of this process's descendants (from /proc; empty where there is none)."""
    parent: dict[int, int] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


def _init_with_retry(ray, num_cpus: int, object_store_mb: int, attempts: int = 2) -> None:
    for attempt in range(1, attempts + 1):
        before = _descendants()
        try:
            ray.init(address="local", num_cpus=num_cpus, _node_ip_address="127.0.0.1", include_dashboard=False,
                     log_to_driver=False, object_store_memory=object_store_mb * 1024 * 1024, configure_logging=False,
                     runtime_env={"env_vars": {"PYTHONPATH": actor_pythonpath(), **RAY_ENV}})
            return
        except Exception as e:
            if _STARTUP_TIMEOUT not in str(e) or attempt == attempts:
                raise
            ray.shutdown()
            for pid in _descendants() - before:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def local_ray(num_cpus: int, object_store_mb: int) -> Iterator:
    """``ray`` initialised for the block, shut down after it; RAY_ENV set meanwhile, then restored."""
    import ray
    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    try:
        _init_with_retry(ray, num_cpus, object_store_mb)
        yield ray
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
