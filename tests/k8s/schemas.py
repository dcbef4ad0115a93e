"""Offline schema validation of rendered manifests.

Core kinds: the Kubernetes JSON schemas shipped by the kubernetes-validate package, in their
strict form (an unknown field is an error, as with `kubectl apply`'s default server-side
field validation). KubeRay kinds: the openAPIV3Schema of KubeRay v1.7.0's CRDs
(../shared/data/kuberay-v1.7.0/), made strict the way the API server's strict field validation
treats structural schemas: an object with declared properties accepts no other key unless it is
marked x-kubernetes-preserve-unknown-fields. metadata of custom resources is checked against
ObjectMeta, which the CRD schema leaves open.
"""
from __future__ import annotations

import copy
import gzip
from functools import lru_cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import referencing
import yaml
from kubernetes_validate import utils as kv_utils

ROOT = Path(__file__).resolve().parents[2]
KUBERAY_DIR = ROOT.parent / "shared" / "data" / "kuberay-v1.7.0"
KUBERAY_CRDS = {"RayCluster": "ray.io_rayclusters.yaml.gz", "RayJob": "ray.io_rayjobs.yaml.gz",
                "RayService": "ray.io_rayservices.yaml.gz"}
# The Kubernetes versions the manifests must be valid for (native gRPC probes need 1.27+).
K8S_VERSIONS = ("1.30.0", "1.35.0")


def strictify(schema: dict) -> dict:
    """A copy where every object schema with properties forbids keys it does not declare."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@lru_cache(maxsize=None)
def crd_validator(kind: str, api_version: str = "ray.io/v1") -> jsonschema.Validator:
    """A strict validator for one KubeRay kind at one served version, from the v1.7.0 CRD."""
    path = KUBERAY_DIR / KUBERAY_CRDS[kind]
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # the C loader: 1 MB CRDs in ~1 s, not ~5
    crd = yaml.load(gzip.decompress(path.read_bytes()), Loader=loader)
    group, version = api_version.split("/")
    if crd["spec"]["group"] != group:
        raise ValueError(f"{kind}: CRD group is {crd['spec']['group']}, manifest says {group}")
    by_name = {v["name"]: v for v in crd["spec"]["versions"] if v.get("served")}
    if version not in by_name:
        raise ValueError(f"{kind}: KubeRay v1.7.0 serves {sorted(by_name)}, not {version}")
    schema = strictify(by_name[version]["schema"]["openAPIV3Schema"])
    return jsonschema.Draft7Validator(schema)


@lru_cache(maxsize=None)
def k8s_definition_validator(filename: str, version: str) -> jsonschema.Validator:
    """A validator for one strict kubernetes-validate schema file (e.g. objectmeta-meta-v1.json)."""
    schema_dir = "v%s-local-strict" % version
    schema = kv_utils.schema_contents(f"kubernetes-json-schema/{schema_dir}/{filename}", version)
    defs = kv_utils.schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", version)
    registry = referencing.Resource.from_contents(defs) @ (
        referencing.Resource.from_contents(schema) @ referencing.Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _where(err: jsonschema.ValidationError) -> str:
    return "/".join(str(p) for p in err.absolute_path) or "(top)"


def validate_object(obj: dict, k8s_version: str) -> list[str]:
    """Every schema error of one manifest object, as 'Kind/name: path: message' lines."""
    kind, name = obj.get("kind", "?"), obj.get("metadata", {}).get("name", "?")
    label = f"{kind}/{name}"
    if obj.get("apiVersion", "").startswith("ray.io/"):
        if kind not in KUBERAY_CRDS:
            return [f"{label}: no KubeRay v1.7.0 CRD for kind {kind}"]
        try:
            validator = crd_validator(kind, obj["apiVersion"])
        except ValueError as exc:
            return [f"{label}: {exc}"]
        errors = [f"{label}: {_where(e)}: {e.message}" for e in validator.iter_errors(obj)]
        meta = k8s_definition_validator("objectmeta-meta-v1.json", k8s_version)
        errors += [f"{label}: metadata/{_where(e)}: {e.message}"
                   for e in meta.iter_errors(obj.get("metadata", {}))]
        return errors
    try:
        kubernetes_validate.validate(obj, k8s_version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [f"{label}: no Kubernetes {k8s_version} schema for {obj.get('apiVersion')} {kind}"]
    except kubernetes_validate.ValidationError as exc:
        return [f"{label}: {_where(exc)}: {exc.message}"]
    return []
