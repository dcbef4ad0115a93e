"""Run kvwire's CUDA kernels on the CPU, in the warp emulator (``cuda/emu/kvemu.h``), for tests.

The CUDA kernels (``cuda/*.cu``) are compiled by NVRTC for the GPU, which the CPU test machines do
not have. Like Triton's interpreter for the Triton kernels, the emulator lets the CPU suite run
them against the torch reference: each kernel is compiled with g++ from its unchanged source and
logic headers, with the inline-PTX primitives headers swapped for host twins (``cuda/emu/``), and
every CUDA thread runs as a fiber (see kvemu.h for the model and what it leaves out).

It is used where the interpreter is (``TRITON_INTERPRET=1``, CPU tensors) and a caller asks for
the CUDA backend by name; "auto" on the CPU stays on Triton. Libraries are built once per
(sources, macros) and kept in a per-user directory under the system temp dir.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kvwire.kernels._common import interpreting
from kvwire.kernels.nvrtc import CUDA_SOURCE_DIR

EMULATOR_DIR = CUDA_SOURCE_DIR / "emu"
# The GPU the emulator stands for in launch policies (SM count; blocks resident per SM come from
# the kernel's MINB): an H200's 132 SMs, so that split and grid choices match the GPU's.
EMULATED_SMS = 132
COMPILE_FLAGS = ["-std=c++20", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fno-strict-aliasing", "-w"]


class EmulatorUnavailableError(RuntimeError):
    """No C++ compiler, or a host the emulator does not support (it needs x86-64)."""


@functools.lru_cache(maxsize=None)
def _compiler_version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout


@functools.lru_cache(maxsize=None)
def compiler() -> str:
    """The g++ that builds emulated kernels; raises EmulatorUnavailableError without one."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise EmulatorUnavailableError(f"the CUDA emulator needs an x86-64 host, this is {platform.machine()}")
    cxx = shutil.which("g++")
    if cxx is None:
        raise EmulatorUnavailableError("the CUDA emulator needs g++ (not found on PATH)")
    return cxx


def emulated(device: torch.device | str) -> bool:
    """Whether CUDA kernels for ``device`` run here, emulated: CPU tensors under the interpreter."""
    return torch.device(device).type == "cpu" and interpreting()


def available() -> bool:
    try:
        compiler()
    except EmulatorUnavailableError:
        return False
    return True


@dataclass
class EmulatedKernel:
    """A kernel built for the emulator: the launch interface of ``nvrtc.CudaKernel``."""

    library: ctypes.CDLL
    name: str
    defines: dict = field(default_factory=dict)
    num_regs: int = 0

    def blocks_per_sm(self, block_threads: int, shared_bytes: int = 0) -> int:
        """Blocks one emulated SM holds: the kernel's MINB (its launch bound), else 1."""
        return max(1, int(self.defines.get("MINB", 1)))

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: list,
               shared_bytes: int = 0) -> None:
        ptrs = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
        err = ctypes.create_string_buffer(512)
        rc = self.library.kvemu_launch(*[ctypes.c_uint(v) for v in (*grid, *block)], ptrs, err, ctypes.c_size_t(512))
        if rc != 0:
            raise RuntimeError(f"emulated {self.name} {tuple(grid)} x {tuple(block)}: {err.value.decode()}")


_LOADED: dict[tuple, EmulatedKernel] = {}


@functools.lru_cache(maxsize=None)
def _shipped_sources() -> tuple[tuple[str, str], ...]:
    """The kernels' files (read once per process, as nvrtc.py reads them), with the twins in place
    of the primitives headers."""
    sources = {p.name: p.read_text() for p in sorted(CUDA_SOURCE_DIR.glob("*.cu*"))}
    twins = {p.name: p.read_text() for p in sorted(EMULATOR_DIR.glob("*"))}
    return tuple(sources.items()), tuple(twins.items())


def _build_dir() -> Path:
    d = Path(tempfile.gettempdir()) / f"kvwire-cuda-emulator-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def load_emulated(source_file: str, kernel: str, defines: dict[str, int],
                  extra_sources: dict[str, str] | None = None) -> EmulatedKernel:
    """``cuda/<source_file>``'s ``kernel`` with ``-D`` ``defines``, built for the emulator (cached).
    ``extra_sources`` (name -> text) add files beside them (a test's own kernel)."""
    loaded = (source_file, kernel, tuple(sorted(defines.items())), tuple(sorted((extra_sources or {}).items())))
    if loaded in _LOADED:
        return _LOADED[loaded]
    cxx = compiler()
    shipped, twins = _shipped_sources()
    sources = {**dict(shipped), **(extra_sources or {}), **dict(twins)}      # the twins win
    if source_file not in sources:
        raise FileNotFoundError(f"no CUDA source {source_file} in {CUDA_SOURCE_DIR}")
    launcher = (f'#include "{source_file}"\n'
                'extern "C" int kvemu_launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,'
                ' unsigned bz, void** args, char* err, size_t n) {\n'
                f'    return kvemu::launch(&{kernel}, {{gx, gy, gz}}, {{bx, by, bz}}, args, err, n);\n}}\n')
    flags = COMPILE_FLAGS + [f"-D{k}={v}" for k, v in sorted(defines.items())]
    key = (sorted(sources.items()), launcher, flags, cxx, _compiler_version(cxx))
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
    lib_path = _build_dir() / f"{kernel}-{digest}.so"
    if not lib_path.exists():
        with tempfile.TemporaryDirectory(dir=_build_dir()) as tmp:
            for name, text in sources.items():
                Path(tmp, name).write_text(text)
            Path(tmp, "launcher.cpp").write_text(launcher)
            out = Path(tmp, "kernel.so")
            res = subprocess.run([cxx, *flags, "-include", "kvemu.h", "launcher.cpp", "-o", str(out)],
                                 cwd=tmp, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"g++ could not build the emulated {kernel} "
                                   f"({' '.join(flags[len(COMPILE_FLAGS):])}):\n{res.stderr[-4000:]}")
            os.replace(out, lib_path)                # atomic: parallel test workers may build it too
    lib = ctypes.CDLL(str(lib_path))
    lib.kvemu_launch.restype = ctypes.c_int
    _LOADED[loaded] = EmulatedKernel(lib, kernel, dict(defines))
    return _LOADED[loaded]


__all__ = ["EMULATED_SMS", "EmulatedKernel", "EmulatorUnavailableError", "available", "compiler", "emulated",
           "load_emulated"]
