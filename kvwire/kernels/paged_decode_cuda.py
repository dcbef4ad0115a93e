"""The CUDA (NVRTC) split kernel of paged decode attention, for FP8 and NVFP4 pages.

``cuda/paged_decode_split.cu`` computes the same per-split partials as the Triton split kernel in
``paged_decode.py`` (whose reduce kernel then adds the bf16 tail and merges the splits), but with
the GQA group on the N side of ``mma.m16n8k16`` and each page read by one warp straight into
fragment registers: no 16-row query padding, no shared-memory round trip, and per element only
the hardware E4M3x2 -> f16x2 conversion (plus bit placement and block scales for NVFP4). Why the
Triton kernel could not get there is in docs/benchmarks.md.

With ``FUSED=1`` (the tuning below) the kernel also attends the bf16 tail and merges the splits
itself (the last block of each sequence and KV head, ``cuda/decode_merge.cuh``), so a decode step
is one launch; ``decode`` falls back to partials + the Triton reduce where that does not fit.

Scope (``supports``): both K and V FP8 or NVFP4 (any FP8 granularity), page size 16, head_dim 64 or
128, up to 8 query heads per KV head, q in bf16 or fp32, a GPU with E4M3 conversions (sm_89+).
Everything else, and CPU/interpreter runs, uses the Triton kernel or the torch reference.
"""
from __future__ import annotations

import ctypes

import torch

from kvwire.formats import ElementType, PageFormat
from kvwire.kernels._common import elem_code, gran_code
from kvwire.kernels.nvrtc import CudaKernel, NvrtcUnavailableError, choose, load_kernel

SOURCE = "paged_decode_split.cu"
KERNEL = "kvwire_decode_split"
NUM_WARPS = 4
MIN_PAGES_PER_WARP = 8
# Compile-time tuning of the kernel (see the .cu source), measured on the H200 (2026-12-03,
# docs/benchmarks.md "Tuning" and "Per-page trims"):
# - DEPTH = pages held in registers per warp (the one attended + those in flight). 1: no register
#   ring (the next page id is still read a step ahead); resident warps matter more than a ring.
# - MINB = minimum resident blocks per SM for __launch_bounds__ (5: at most 96 registers).
# - PREF = pages beyond those that are prefetched into L2 (0: measured no help).
# - LAZYMAX = how far (log2 units) a score may pass the running max before the warp rescales
#   (0 keeps the exact max; 5 measured 1-4% faster).
# - FUSED = the last block of each (sequence, KV head) attends the tail and merges the splits
#   (one launch per step instead of two; 0 leaves that to the Triton reduce kernel).
# - QSMEM = q's MMA fragments in shared memory. At 96 registers that is what lets every page load
#   issue before the page's first MMA (one memory round trip per page instead of two): at 32x32k
#   nvfp4 0.438 -> 0.400 ms, fp8-token/nvfp4 0.464 -> 0.439, fp8-token 0.556 -> 0.545, fp8-tensor
#   0.513 -> 0.503 (against q in registers at 4 blocks/SM, 5 for NVFP4).
DEFAULT_TUNING: dict[str, int] = {"DEPTH": 1, "MINB": 5, "PREF": 0, "LAZYMAX": 5, "QSMEM": 1, "FUSED": 1}
# Per (key, value) element type overrides of the defaults (none measured better today).
FORMAT_TUNING: dict[tuple[ElementType, ElementType], dict[str, int]] = {}
# Overrides on top of both, for benchmarks, sweeps and tests of other variants.
TUNING: dict[str, int] = {}


def supports(page_format: PageFormat, num_q_heads: int, q: torch.Tensor) -> bool:
    """Whether the CUDA split kernel covers this format, shape and device."""
    f = page_format
    compact = (ElementType.FP8, ElementType.NVFP4)
    if not q.is_cuda or f.kv.key.element not in compact or f.kv.value.element not in compact:
        return False
    g = num_q_heads // f.num_kv_heads
    if f.page_size != 16 or f.head_dim not in (64, 128) or not 1 <= g <= 8:
        return False
    if q.dtype not in (torch.bfloat16, torch.float32) or q.stride(-1) != 1:
        return False
    return torch.cuda.get_device_capability(q.device) >= (8, 9)


def tuning_for(page_format: PageFormat) -> dict[str, int]:
    """The compile-time tuning of this format's kernel: defaults, per-format entries, overrides."""
    kv = page_format.kv
    return {**DEFAULT_TUNING, **FORMAT_TUNING.get((kv.key.element, kv.value.element), {}), **TUNING}


def kernel_for(page_format: PageFormat, num_q_heads: int, q_dtype: torch.dtype,
               device: torch.device, num_warps: int = NUM_WARPS, fused: bool | None = None) -> CudaKernel:
    """The kernel for this format and shape; ``fused`` overrides the tuning's FUSED."""
    f = page_format
    tuning = tuning_for(f)
    if fused is not None:
        tuning["FUSED"] = int(fused)
    defines = {
        "H": f.num_kv_heads, "G": num_q_heads // f.num_kv_heads, "D": f.head_dim, "NW": num_warps,
        "KELEM": elem_code(f.kv.key), "KGRAN": gran_code(f.kv.key), "VELEM": elem_code(f.kv.value),
        "VGRAN": gran_code(f.kv.value), "QF32": int(q_dtype == torch.float32), **tuning,
    }
    return load_kernel(SOURCE, KERNEL, defines, device)


def select(backend: str, page_format: PageFormat, num_q_heads: int, q: torch.Tensor,
           eligible: bool) -> CudaKernel | None:
    """The CUDA kernel to run for ``backend`` ("auto", "cuda", "triton"), or None for Triton
    (``nvrtc.choose``: "cuda" raises where the kernel does not apply)."""
    f = page_format
    return choose(backend, eligible and supports(f, num_q_heads, q),
                  lambda: kernel_for(f, num_q_heads, q.dtype, q.device),
                  lambda: (f"the CUDA decode kernel does not cover format {f.name}, page size {f.page_size}, "
                           f"head_dim {f.head_dim}, {num_q_heads} query heads, q {q.dtype} on {q.device}"),
                  "paged decode")


def default_splits(kernel: CudaKernel, batch: int, kv_heads: int, max_pages: int, device: torch.device,
                   num_warps: int = NUM_WARPS) -> int:
    """Split count: the fewest splits whose blocks fill whole waves of the GPU best.

    A wave is (SMs x resident blocks per SM) blocks. Too few blocks leave SMs idle and a last,
    partial wave idles most of them, so pick s (at least MIN_PAGES_PER_WARP pages per warp) that
    maximises blocks / (waves x wave size); ties go to fewer splits (fewer partials to merge).
    """
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    wave = sms * max(1, kernel.blocks_per_sm(32 * num_warps))
    rows = batch * kv_heads
    cap = max(1, -(-max_pages // (num_warps * MIN_PAGES_PER_WARP)))
    best, best_eff = 1, 0.0
    for s in range(1, cap + 1):
        blocks = rows * s
        eff = blocks / (-(-blocks // wave) * wave)
        if eff > best_eff + 0.02:
            best, best_eff = s, eff
    return best


def fusable(page_format: PageFormat, num_q_heads: int, splits: int, q: torch.Tensor, out: torch.Tensor,
            tail: torch.Tensor, num_warps: int = NUM_WARPS) -> bool:
    """Whether the fused merge applies: the tuning asks for it, the split weights fit the block's
    shared scratch (num_warps * 8 * (D + 1) floats), out is q's dtype, rows contiguous."""
    g = num_q_heads // page_format.num_kv_heads
    return (bool(tuning_for(page_format).get("FUSED", 0)) and splits * g <= num_warps * 8 * (page_format.head_dim + 1)
            and out.dtype == q.dtype and out.stride(-1) == 1 and tail.stride(-1) == 1)


# Completion counters of the fused merge, per (device, stream): zero between launches (the last
# block of each row resets its entry), so one buffer serves every launch queued on one stream.
_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}


def completion_counters(device: torch.device, rows: int) -> torch.Tensor:
    """A zeroed int32 buffer of at least ``rows`` entries for launches on the current stream.

    During CUDA graph capture a buffer not already cached is allocated (and zeroed) inside the
    graph and not cached: an eager launch must never see counters the graph has not yet zeroed."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(idx)
    key = (idx, stream.cuda_stream)
    buf = _COUNTERS.get(key)
    if buf is not None and buf.numel() >= rows:
        return buf
    buf = torch.zeros(max(rows, 2 * (buf.numel() if buf is not None else 0), 256), dtype=torch.int32, device=device)
    if not torch.cuda.is_current_stream_capturing():
        _COUNTERS[key] = buf
    return buf


def decode(kern: CudaKernel, q: torch.Tensor, storage: torch.Tensor, page_format: PageFormat, layer: int,
           page_table: torch.Tensor, num_pages: torch.Tensor, static: torch.Tensor,
           parts: tuple[torch.Tensor, torch.Tensor, torch.Tensor], splits: int, qk_scale: float,
           offsets: tuple[tuple[int, ...], tuple[int, ...]], tail: torch.Tensor, tail_slot: torch.Tensor,
           tail_len: torch.Tensor, out: torch.Tensor, num_warps: int = NUM_WARPS) -> bool:
    """Launch the split kernel. Returns True when it also wrote ``out`` (fused merge); False when it
    only filled the partials [B*H*splits*G, D] / [B*H*splits*G] (as the Triton split kernel does)
    and the caller still runs the reduce. ``kern`` is ``select``'s kernel (tuned FUSED)."""
    f = page_format
    bsz = q.shape[0]
    if page_table.dtype != torch.int32 or num_pages.dtype != torch.int32:
        raise ValueError("page_table and num_pages must be int32 for the CUDA kernel")
    if tail_slot.dtype != torch.int32 or tail_len.dtype != torch.int32:
        raise ValueError("tail_slot and tail_len must be int32 for the CUDA kernel")
    if f.page_bytes >= 2**32:
        raise ValueError(f"the CUDA kernel addresses pages with 32-bit sizes; {f.name} pages are {f.page_bytes} bytes")
    hq = q.shape[1]
    fused = fusable(f, hq, splits, q, out, tail, num_warps)
    if not fused and tuning_for(f).get("FUSED", 0):
        kern = kernel_for(f, hq, q.dtype, q.device, num_warps, fused=False)
    rows = bsz * f.num_kv_heads
    counters = completion_counters(q.device, rows) if fused else num_pages
    part_acc, part_m, part_l = parts
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    kd, vd = offsets
    tail16 = tail.view(torch.int16)
    args = [ptr(q.data_ptr()), i64(q.stride(0)), i64(q.stride(1)),
            ptr(storage.data_ptr()), i64(f.page_bytes),
            ptr(page_table.data_ptr()), i64(page_table.stride(0)), ptr(num_pages.data_ptr()),
            ptr(static.data_ptr()), i32(layer),
            ptr(part_acc.data_ptr()), ptr(part_m.data_ptr()), ptr(part_l.data_ptr()),
            i32(splits), ctypes.c_float(qk_scale),
            *[i64(o) for o in kd], *[i64(o) for o in vd],
            ptr(tail16.data_ptr()), *[i64(x) for x in tail16.stride()[:5]],
            ptr(tail_slot.data_ptr()), ptr(tail_len.data_ptr()),
            ptr(out.data_ptr()), i64(out.stride(0)), i64(out.stride(1)), ptr(counters.data_ptr())]
    kern.launch((splits, rows, 1), (32 * num_warps, 1, 1), args)
    return fused


__all__ = ["NvrtcUnavailableError", "completion_counters", "decode", "default_splits", "fusable", "kernel_for",
           "select", "supports", "tuning_for"]
