"""The CUDA (NVRTC) quantise-on-write kernel, for FP8 and NVFP4 pages from bf16 K/V.

``cuda/quantize_pages.cu`` writes the same bytes as the Triton kernel in ``quantize.py`` (both
bit-identical to ``kvwire.quant.quantize_pages``): one block per (page, KV head) tile with the
tile in registers, 16-byte loads, and an exact division by reciprocal plus one FMA correction
(exact for bf16 numerators) instead of ``div.rn`` per element. Why: the Triton kernel's NVFP4 path reached
29% of the copy bandwidth on the H200 (docs/benchmarks.md), compute-bound on IEEE divisions and
layout shuffles.

Scope (``supports``): FP8 (any granularity) or NVFP4, bf16 input whose head_dim is contiguous and
16-byte aligned, head_dim 64 or 128, a page of at least 256 elements (P * D / 8 chunks that split
into whole warps). Everything else uses the Triton kernel or the torch reference. On the CPU under
Triton's interpreter (``TRITON_INTERPRET=1``), the "cuda" backend runs this kernel in the warp
emulator (``cuda_emulator.py``, for tests).
"""
from __future__ import annotations

import ctypes

import torch

from kvwire.formats import ElementType, PageFormat
from kvwire.kernels import cuda_emulator
from kvwire.kernels._common import gran_code
from kvwire.kernels.cuda_emulator import emulated
from kvwire.kernels.nvrtc import CudaKernel, NvrtcUnavailableError, choose, load_kernel

SOURCE = "quantize_pages.cu"
KERNEL = "kvwire_quantize_pages"
# 16-byte chunks (8 elements) of the [P, D] tile per thread, per element type; others where the
# tile does not split into whole warps that way (NVFP4 needs an even count: a thread owns whole
# 16-element blocks). Chosen on the H200 (docs/benchmarks.md).
CHUNKS_PER_THREAD = {ElementType.FP8: 4, ElementType.NVFP4: 8}
# FMA correction steps of the exact division (cuda/exact_division.cuh): 2 is exact for any fp32
# numerator; 1 is exact for bf16 numerators (all the kernel divides: checked for all 2^30 significand
# pairs on the H200 by test_gpu_cuda_quantize.py) and measured 8% faster for NVFP4 (32.6 vs 35.3 us).
DIVISION_STEPS = 1
# Compile-time variants of the NVFP4 path (quantize_pages.cu says what they do). Measured on the
# H200 at 32k tokens, two interleaved rounds (2026-12-04, docs/benchmarks.md): clamped 31.8-32.3 us,
# NOCLAMP 30.6-30.8, AMAX2 29.6, both 29.3 us (69.0% of the copy rate); EXPHI (the exponent by a
# multiply-high) 30.5 us, dropped. 2026-12-05: HFAST (the grid with the KV head fastest) and E2M1MIN
# (the E2M1 code by three FMAs and a min): NVFP4 28.6-28.9 us against 29.3-29.7 (H200), most of it
# HFAST, which also makes the FP8 kernels 1-3% faster; E2M1MIN alone is within the spread.
# LDL1 (input loads allocated in L1), two interleaved rounds at 32k tokens on an H100: NVFP4 33.8 ->
# 32.7-32.8 us (2026-12-05), fp8-tensor 37.4 -> 36.5-36.7, fp8-page 38.3-38.5 -> 37.0-37.4,
# fp8-token 39.1 -> 37.5-37.6 (2026-12-06); not yet timed on the H200.
DEFAULT_TUNING: dict[str, int] = {"NOCLAMP": 1, "AMAX2": 1, "HFAST": 1, "E2M1MIN": 1, "LDL1": 1}
# Overrides on top of the defaults, for benchmarks, sweeps and tests of other variants.
TUNING: dict[str, int] = {}


def supports(page_format: PageFormat, part: int, x: torch.Tensor, storage: torch.Tensor) -> bool:
    """Whether the CUDA kernel covers this part's format, this input and this device."""
    f = page_format
    fmt = f.part_format(part)
    if not (x.is_cuda or emulated(x.device)) or x.dtype != torch.bfloat16:
        return False
    if fmt.element not in (ElementType.FP8, ElementType.NVFP4):
        return False
    if f.head_dim not in (64, 128) or chunks_per_thread(f, part) is None:
        return False
    if x.stride(3) != 1 or any(s % 8 for s in x.stride()[:3]) or x.data_ptr() % 16 or storage.data_ptr() % 16:
        return False
    return emulated(x.device) or torch.cuda.get_device_capability(x.device) >= (8, 9)


def kernel_for(page_format: PageFormat, part: int, check_finite: bool, device: torch.device) -> CudaKernel:
    f = page_format
    fmt = f.part_format(part)
    defines = {"H": f.num_kv_heads, "P": f.page_size, "D": f.head_dim, "CPL": chunks_per_thread(f, part),
               "ELEM": 1 if fmt.element is ElementType.FP8 else 2, "GRAN": gran_code(fmt),
               "CHECK": int(check_finite), "DIVSTEPS": DIVISION_STEPS, **DEFAULT_TUNING, **TUNING}
    if emulated(device):
        return cuda_emulator.load_emulated(SOURCE, KERNEL, defines)
    return load_kernel(SOURCE, KERNEL, defines, device)


def chunks_per_thread(page_format: PageFormat, part: int) -> int | None:
    """Chunks per thread that split a page's [P, D] tile into 1..32 whole warps (None: no way)."""
    element = page_format.part_format(part).element
    chunks = page_format.page_size * page_format.head_dim // 8
    for cpl in (CHUNKS_PER_THREAD.get(element, 2), 1, 2, 4, 8):
        if element is ElementType.NVFP4 and cpl % 2:
            continue
        if chunks % cpl == 0 and (chunks // cpl) % 32 == 0 and chunks // cpl <= 1024:
            return cpl
    return None


def select(backend: str, page_format: PageFormat, part: int, x: torch.Tensor, storage: torch.Tensor,
           check_finite: bool, eligible: bool) -> CudaKernel | None:
    """The CUDA kernel to run for ``backend`` ("auto", "cuda", "triton"), or None for Triton
    (``nvrtc.choose``: "cuda" raises where the kernel does not apply)."""
    f = page_format
    return choose(backend, eligible and supports(f, part, x, storage),
                  lambda: kernel_for(f, part, check_finite, x.device),
                  lambda: (f"the CUDA quantise kernel does not cover {f.part_format(part).name} pages of "
                           f"page size {f.page_size}, head_dim {f.head_dim} from {x.dtype} "
                           f"strides {tuple(x.stride())} on {x.device}"),
                  "quantise-on-write")


def launch(kern: CudaKernel, page_format: PageFormat, part: int, x: torch.Tensor, page_ids: torch.Tensor,
           storage: torch.Tensor, offsets: tuple[int, int, int, int], static: torch.Tensor,
           flag: torch.Tensor, layers: int = 1, layer_strides: tuple[int, int, int, int] = (0, 0, 0, 0)) -> None:
    """Quantise ``x`` [n * layers, P, H, D] (bf16) into pages ``page_ids`` [n] (int64) of ``storage``:
    row i is layer i % layers of page ``page_ids[i // layers]``, whose sections lie ``layer_strides``
    bytes per layer past ``offsets``."""
    f = page_format
    if page_ids.dtype != torch.int64 or not page_ids.is_contiguous():
        raise ValueError("page_ids must be contiguous int64 for the CUDA kernel")
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    data_off, s_off, bs_off, gs_off = offsets
    threads = f.page_size * f.head_dim // (8 * kern.defines["CPL"])
    args = [ptr(x.data_ptr()), i64(x.stride(0)), i64(x.stride(1)), i64(x.stride(2)), ptr(page_ids.data_ptr()),
            ptr(storage.data_ptr()), i64(f.page_bytes), i64(data_off), i64(s_off), i64(bs_off), i64(gs_off),
            ptr(static.data_ptr()), ptr(flag.data_ptr()), ctypes.c_int32(layers), *[i64(v) for v in layer_strides]]
    grid = (x.shape[0] * f.num_kv_heads, 1, 1) if kern.defines.get("HFAST") else (x.shape[0], f.num_kv_heads, 1)
    kern.launch(grid, (threads, 1, 1), args)


__all__ = ["NvrtcUnavailableError", "kernel_for", "launch", "select", "supports"]
