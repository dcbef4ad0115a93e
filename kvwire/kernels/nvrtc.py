"""Compile CUDA C++ kernels at run time with NVRTC and launch them on torch's current stream.

Why NVRTC and not ``torch.utils.cpp_extension``: the serving images (and the lent H200) carry
PyTorch's CUDA runtime libraries, NVRTC included, but no ``nvcc`` or CUDA toolkit headers. The
kernels here therefore use no headers at all (inline PTX for tensor cores, conversions and warp
shuffles), and this module talks to ``libnvrtc`` and the driver (``libcuda``) through ctypes.
Compiled modules are cached per (source, options, device) for the life of the process.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

CUDA_SOURCE_DIR = Path(__file__).parent / "cuda"


class NvrtcUnavailableError(RuntimeError):
    """No usable NVRTC library or CUDA driver here (the caller falls back to Triton)."""


_LIBS: dict[str, ctypes.CDLL] = {}


def _load_nvrtc() -> ctypes.CDLL:
    if "nvrtc" in _LIBS:
        return _LIBS["nvrtc"]
    major = int(str(torch.version.cuda or "0").split(".")[0])
    names = [f"libnvrtc.so.{major}", "libnvrtc.so"]
    site = [p for p in sys.path if p.endswith("site-packages")]
    for root in site:
        names += sorted(glob.glob(os.path.join(root, "nvidia", "**", "libnvrtc.so*"), recursive=True))
    errors = []
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            errors.append(f"{name}: {e}")
            continue
        _LIBS["nvrtc"] = lib
        return lib
    raise NvrtcUnavailableError("cannot load NVRTC (tried " + "; ".join(errors[:4]) + ")")


def _load_cuda() -> ctypes.CDLL:
    if "cuda" not in _LIBS:
        try:
            _LIBS["cuda"] = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise NvrtcUnavailableError(f"cannot load the CUDA driver: {e}") from e
    return _LIBS["cuda"]


def _check_nvrtc(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"NVRTC {what} failed: {lib.nvrtcGetErrorString(code).decode()}")


def _check_cu(code: int, what: str) -> None:
    if code != 0:
        lib = _load_cuda()
        msg = ctypes.c_char_p()
        lib.cuGetErrorString(code, ctypes.byref(msg))
        raise RuntimeError(f"CUDA driver {what} failed ({code}): {(msg.value or b'?').decode()}")


def shared_headers() -> dict[str, str]:
    """The ``*.cuh`` files of ``cuda/`` by name: what the kernels may ``#include "..."``."""
    return {p.name: p.read_text() for p in sorted(CUDA_SOURCE_DIR.glob("*.cuh"))}


def compile_cubin(source: str, name: str, options: list[str], arch: str,
                  headers: dict[str, str] | None = None) -> bytes:
    """CUDA C++ ``source`` -> a cubin for ``arch`` (e.g. "sm_90"); raises with NVRTC's log.

    ``headers`` (default: ``shared_headers()``) are the only files ``#include`` can name.
    """
    lib = _load_nvrtc()
    hdrs = shared_headers() if headers is None else headers
    texts = (ctypes.c_char_p * max(1, len(hdrs)))(*[t.encode() for t in hdrs.values()])
    names = (ctypes.c_char_p * max(1, len(hdrs)))(*[n.encode() for n in hdrs])
    prog = ctypes.c_void_p()
    _check_nvrtc(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(),
                                             len(hdrs), texts, names), "create")
    opts = [f"--gpu-architecture={arch}", "-std=c++17", *options]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    try:
        res = lib.nvrtcCompileProgram(prog, len(opts), arr)
        if res != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC could not compile {name} ({' '.join(options)}):\n{log.value.decode()}")
        size = ctypes.c_size_t()
        _check_nvrtc(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "cubin size")
        buf = ctypes.create_string_buffer(size.value)
        _check_nvrtc(lib, lib.nvrtcGetCUBIN(prog, buf), "cubin")
        return buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


@dataclass
class CudaKernel:
    """A loaded ``extern "C"`` kernel; ``launch`` takes ctypes-typed arguments."""

    function: ctypes.c_void_p
    module: ctypes.c_void_p
    num_regs: int
    defines: dict = field(default_factory=dict)       # the -D macros it was compiled with
    _occupancy: dict = field(default_factory=dict)

    def blocks_per_sm(self, block_threads: int, shared_bytes: int = 0) -> int:
        """How many blocks of ``block_threads`` fit on one SM at once (registers, shared memory)."""
        key = (block_threads, shared_bytes)
        if key in self._occupancy:
            return self._occupancy[key]
        n = ctypes.c_int()
        _check_cu(_load_cuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(n), self.function, block_threads, ctypes.c_size_t(shared_bytes)), "occupancy")
        self._occupancy[key] = n.value
        return n.value

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: list,
               shared_bytes: int = 0) -> None:
        lib = _load_cuda()
        ptrs = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _check_cu(lib.cuLaunchKernel(self.function, *grid, *block, shared_bytes, stream, ptrs, None), "launch")


_CACHE: dict[tuple, CudaKernel] = {}


@functools.lru_cache(maxsize=None)
def _source_text(source_file: str) -> str:
    return (CUDA_SOURCE_DIR / source_file).read_text()


def load_kernel(source_file: str, kernel: str, defines: dict[str, int], device: torch.device) -> CudaKernel:
    """Compile (once per process) ``cuda/<source_file>`` with ``-D`` ``defines`` for ``device``."""
    return load_source(_source_text(source_file), kernel, defines, device)


def load_source(source: str, kernel: str, defines: dict[str, int], device: torch.device) -> CudaKernel:
    """Compile (once per process per source text) CUDA C++ ``source`` and load ``kernel`` from it."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = (source, kernel, tuple(sorted(defines.items())), idx)
    if key in _CACHE:
        return _CACHE[key]
    major, minor = torch.cuda.get_device_capability(idx)
    cubin = compile_cubin(source, kernel, [f"-D{k}={v}" for k, v in defines.items()], f"sm_{major}{minor}")
    lib = _load_cuda()
    with torch.cuda.device(idx):
        torch.cuda.current_stream().synchronize()          # makes torch's primary context current
        module = ctypes.c_void_p()
        _check_cu(lib.cuModuleLoadData(ctypes.byref(module), cubin), "module load")
        fn = ctypes.c_void_p()
        _check_cu(lib.cuModuleGetFunction(ctypes.byref(fn), module, kernel.encode()), "get function")
    regs = ctypes.c_int()
    _check_cu(lib.cuFuncGetAttribute(ctypes.byref(regs), 4, fn), "attribute")   # 4 = NUM_REGS
    _CACHE[key] = CudaKernel(fn, module, regs.value, dict(defines))
    return _CACHE[key]


# Why "auto" stopped trying CUDA kernels in this process (NVRTC or the driver would not load).
UNAVAILABLE: list[str] = []


def choose(backend: str, applies: bool, build: Callable[[], CudaKernel], not_covered: Callable[[], str],
           what: str) -> CudaKernel | None:
    """The CUDA kernel for ``backend`` ("auto", "cuda", "triton"), or None for the Triton kernel.

    "cuda" raises ``ValueError(not_covered())`` where the kernel does not apply; "auto" builds it
    where it applies and NVRTC loads. Once NVRTC has failed, "auto" warns once (naming ``what``)
    and stays on Triton for the rest of the process, for every kernel.
    """
    if backend == "triton":
        return None
    if backend == "cuda":
        if not applies:
            raise ValueError(not_covered())
        return build()
    if not applies or UNAVAILABLE:
        return None
    try:
        return build()
    except NvrtcUnavailableError as e:
        UNAVAILABLE.append(str(e))
        warnings.warn(f"{what} falls back to Triton: {e}", RuntimeWarning, stacklevel=4)
        return None
