"""Every kustomization under k8s/ renders with kustomize and every object it renders passes the
Kubernetes (core kinds) or KubeRay v1.7.0 (ray.io kinds) schema, strictly."""
from __future__ import annotations

import pytest

from tests.k8s.render import K8S, find, kustomizations, render_cached
from tests.k8s.schemas import K8S_VERSIONS, validate_object

DIRS = kustomizations()
EXPECTED = {"base", "experiments", "overlays/small", "overlays/large", "overlays/formats",
            "overlays/multinode-rdma"}


def test_every_expected_kustomization_is_found() -> None:
    assert {str(d.relative_to(K8S)) for d in DIRS} >= EXPECTED


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("directory", DIRS, ids=lambda d: str(d.relative_to(K8S)))
def test_renders_and_validates(directory, version: str) -> None:
    objs = render_cached(str(directory))
    assert objs, f"{directory} renders nothing"
    errors = [e for o in objs for e in validate_object(o, version)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("directory", [d for d in DIRS if d.parent.name == "overlays" or d.name == "base"],
                         ids=lambda d: str(d.relative_to(K8S)))
def test_serving_kustomizations_hold_the_whole_system(directory) -> None:
    objs = render_cached(str(directory))
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == ["ConfigMap", "Deployment", "RayCluster", "Service"], kinds


def test_rayservice_schema_accepts_our_cluster_spec() -> None:
    """kvwire ships no RayService (its router is not Ray Serve), but the validator covers the
    kind: our RayCluster spec wrapped as a RayService's rayClusterConfig must pass, and a typo fail."""
    rc = find(render_cached(str(K8S / "overlays" / "small")), "RayCluster")[0]
    svc = {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": {"name": "kvwire"},
           "spec": {"rayClusterConfig": rc["spec"]}}
    assert validate_object(svc, K8S_VERSIONS[0]) == []
    svc["spec"]["rayClusterConfg"] = svc["spec"].pop("rayClusterConfig")
    assert any("rayClusterConfg" in e for e in validate_object(svc, K8S_VERSIONS[0]))


def test_placement_differs_between_nvlink_and_rdma() -> None:
    """NVLink overlays: prefill and decode pods prefer each other's node; RDMA: no affinity,
    an RDMA device and IPC_LOCK per worker."""
    nvlink = find(render_cached(str(K8S / "overlays" / "large")), "RayCluster")[0]
    rdma = find(render_cached(str(K8S / "overlays" / "multinode-rdma")), "RayCluster")[0]
    for group in nvlink["spec"]["workerGroupSpecs"]:
        terms = group["template"]["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        other = {"prefill": "decode", "decode": "prefill"}[group["groupName"]]
        assert terms[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert terms[0]["podAffinityTerm"]["labelSelector"]["matchLabels"]["kvwire.dev/role"] == other
    for group in rdma["spec"]["workerGroupSpecs"]:
        spec = group["template"]["spec"]
        assert "affinity" not in spec
        container = spec["containers"][0]
        assert any(k.startswith("rdma/") for k in container["resources"]["limits"])
        assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]
