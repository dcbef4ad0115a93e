"""The test install is whole. Tests of NIXL, Ray, gRPC code generation, torchao, transformers, the
NVRTC builds and the CUDA emulator skip where their package or tool is missing (a developer's
partial install, or another platform); on Linux x86-64, where `scripts/setup.sh --test` installs
all of them, a missing one fails here instead, so a broken install cannot turn into a green run
with more skips."""
from __future__ import annotations

import importlib.util
import platform

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.machine() != "x86_64",
                                reason="scripts/setup.sh --test installs every test tool on linux/x86_64 only")

MODULES = ("nixl", "ray", "grpc_tools", "torchao", "transformers", "gguf", "kubernetes_validate")


@pytest.mark.parametrize("module", MODULES)
def test_the_test_extras_are_installed(module):
    assert importlib.util.find_spec(module) is not None, f"{module} is missing: run scripts/setup.sh --test"


def test_the_cuda_kernels_can_be_built_and_emulated_without_a_gpu():
    from kvwire.kernels import cuda_emulator
    from tests.kernels.test_cuda_builds import nvrtc_wheel
    assert nvrtc_wheel(), "the nvidia-cuda-nvrtc-cu12 wheel is missing: run scripts/setup.sh --test"
    assert cuda_emulator.available(), "the CUDA emulator needs g++ on the PATH"
