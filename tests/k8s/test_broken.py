"""The checks catch mistakes: a copy of k8s/ is broken one way at a time, rendered with the real
kustomize, and the schema validation or the config cross-check must reject it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.k8s.render import K8S, find, render
from tests.k8s.schemas import K8S_VERSIONS, validate_object


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A private copy of k8s/ to break."""
    shutil.copytree(K8S, tmp_path / "k8s")
    return tmp_path / "k8s"


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def schema_errors(directory: Path) -> list[str]:
    return [e for o in render(directory) for e in validate_object(o, K8S_VERSIONS[-1])]


def test_the_unbroken_copy_passes(tree: Path) -> None:
    assert schema_errors(tree / "overlays" / "small") == []


@pytest.mark.parametrize("file, old, new, expect", [
    # a misspelt field in the RayCluster (KubeRay CRD schema)
    ("base/raycluster.yaml", "    minReplicas: 1\n    maxReplicas: 1\n    rayStartParams:\n      resources: '\"{\\\"kvwire_prefill",
     "    minReplica: 1\n    maxReplicas: 1\n    rayStartParams:\n      resources: '\"{\\\"kvwire_prefill", "minReplica"),
    # a misspelt field inside the RayCluster's pod template (the CRD's embedded PodSpec)
    ("base/raycluster.yaml", "        tolerations:", "        toleration:", "toleration"),
    # a wrong type in the router Deployment (Kubernetes schema)
    ("base/router.yaml", "  replicas: 1\n", "  replicas: one\n", "replicas"),
    # a misspelt gRPC probe field
    ("base/router.yaml", "grpc: {port: 50051, service: kvwire.v1.Router}", "grpc: {port: 50051, sevice: kvwire.v1.Router}", "sevice"),
    # a wrong field in a RayJob
    ("experiments/rayjob-bench.yaml", "  entrypointNumGpus: 1", "  entrypointGpus: 1", "entrypointGpus"),
])
def test_schema_catches_a_broken_manifest(tree: Path, file: str, old: str, new: str, expect: str) -> None:
    edit(tree / file, old, new)
    directory = tree / ("experiments" if file.startswith("experiments") else "overlays/small")
    errors = schema_errors(directory)
    assert any(expect in e for e in errors), errors


def test_config_check_catches_a_bad_pool_key(tree: Path) -> None:
    from router.config import ConfigError, parse_config

    edit(tree / "base" / "pools.yaml", "  prefill_workers: 1\n", "  prefil_workers: 1\n")
    objs = render(tree / "overlays" / "small")
    assert schema_errors(tree / "overlays" / "small") == [], "a ConfigMap's data is free text to Kubernetes"
    data = yaml.safe_load(find(objs, "ConfigMap", "kvwire-pools")[0]["data"]["pools.yaml"])
    with pytest.raises(ConfigError, match="prefil_workers"):
        parse_config(data)


def test_crosscheck_catches_a_pool_that_does_not_fit(tree: Path) -> None:
    """More decode workers than the decode group has GPUs: the fit check fails."""
    from tests.k8s.test_crosscheck import test_pool_config_parses_and_fits_the_worker_groups as fit_check

    edit(tree / "base" / "pools.yaml", "  decode_workers: 1\n", "  decode_workers: 2\n")
    with pytest.raises(AssertionError, match="decode: pools need 2"):
        fit_check(tree / "overlays" / "small")


def test_a_broken_patch_fails_the_build(tree: Path) -> None:
    """The overlays' JSON patches guard the worker group order with `test` ops."""
    edit(tree / "base" / "raycluster.yaml", "  - groupName: prefill", "  - groupName: prefill-gpus")
    with pytest.raises(RuntimeError, match="kustomize build"):
        render(tree / "overlays" / "small")
