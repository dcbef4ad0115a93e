"""The Dockerfile builds the image the manifests name, through the install script CI runs.

No container engine runs here, so the image is checked by what it says: its only Python install
step is scripts/setup.sh (the one .ci/run -> scripts/test.sh runs, with pyproject's pins), its
base Python satisfies requires-python, its label carries the version the manifests' tag uses, and
.dockerignore keeps what setup.sh needs in the build context."""
from __future__ import annotations

import fnmatch
import re
import tomllib

from tests.k8s.render import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_python_is_installed_only_through_setup_sh() -> None:
    runs = [args for op, args in instructions() if op == "RUN"]
    setup = [r for r in runs if "scripts/setup.sh" in r]
    assert len(setup) == 1, "one RUN installs kvwire, through scripts/setup.sh"
    assert "--test" not in setup[0], "the runtime image has no test dependencies"
    for r in runs:
        assert not re.search(r"\bpip3? install|-m pip|\buv (pip|add|sync)|conda install", r), f"Python installed outside setup.sh: {r}"


def test_ci_runs_the_same_script() -> None:
    assert "scripts/test.sh" in (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^scripts/setup\.sh --test$", (ROOT / "scripts" / "test.sh").read_text(), re.M)


def test_base_python_and_label_match_pyproject() -> None:
    base = next(args for op, args in instructions() if op == "FROM")
    m = re.fullmatch(r"python:(\d+)\.(\d+)[-\w.]*", base)
    assert m, f"base image {base}: expected an official python:X.Y image"
    need = re.fullmatch(r">=(\d+)\.(\d+)", project()["requires-python"])
    assert (int(m[1]), int(m[2])) >= (int(need[1]), int(need[2]))
    labels = " ".join(args for op, args in instructions() if op == "LABEL")
    assert f'org.opencontainers.image.version="{project()["version"]}"' in labels
    assert f"docker build -t kvwire/kvwire:{project()['version']} ." in DOCKERFILE.read_text()


def test_the_build_context_keeps_what_setup_needs() -> None:
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    packages = ["kvwire", "prefill", "decode", "transfer", "router"]
    needed = ["pyproject.toml", "README.md", "scripts/setup.sh"] + [f"{p}/__init__.py" for p in packages]
    for path in needed:
        assert (ROOT / path).exists(), path
        for pat in patterns:
            parts = path.split("/")
            hit = any(fnmatch.fnmatch("/".join(parts[:i]), pat.lstrip("/")) for i in range(1, len(parts) + 1))
            assert not hit, f".dockerignore pattern {pat!r} drops {path}"
