"""Render the k8s/ kustomizations with the real kustomize (`kubectl kustomize`), offline.

kubectl comes from scripts/setup.sh --test (.venv/bin/kubectl, a pinned v1.35.2 unpacked from a
PyPI wheel), else from PATH. The tests fail without it on linux/x86_64, where setup installs it;
elsewhere they skip, saying why.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "k8s"


def kubectl() -> str:
    """Path of the kubectl to render with (KVWIRE_KUBECTL, the venv's, or PATH's)."""
    candidates = [os.environ.get("KVWIRE_KUBECTL"), str(Path(sys.prefix) / "bin" / "kubectl"),
                  shutil.which("kubectl")]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    reason = "no kubectl: run scripts/setup.sh --test (installs .venv/bin/kubectl on linux/x86_64)"
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        pytest.fail(reason)
    pytest.skip(f"{reason}; on {platform.system()}/{platform.machine()} put a kubectl on PATH")


def kustomizations(root: Path = K8S) -> list[Path]:
    """Every directory under root that kustomize builds on its own (Components are not)."""
    dirs = []
    for f in sorted(root.rglob("kustomization.yaml")):
        if yaml.safe_load(f.read_text()).get("kind", "Kustomization") == "Kustomization":
            dirs.append(f.parent)
    return dirs


def render(directory: Path) -> list[dict]:
    """The objects `kubectl kustomize directory` prints; a build error raises with kustomize's words."""
    out = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True,
                         timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"kustomize build {directory} failed: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@lru_cache(maxsize=None)
def render_cached(directory: str) -> tuple[dict, ...]:
    """render(), once per directory per test session (the objects must not be mutated)."""
    return tuple(render(Path(directory)))


def find(objs, kind: str, name: str | None = None) -> list[dict]:
    """Objects of a kind (and name prefix: generated ConfigMaps carry a hash suffix)."""
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"].startswith(name))]
