"""The CUDA (NVRTC) split kernel of paged decode attention, for FP8 and NVFP4 pages.

``cuda/paged_decode_split.cu`` computes the same per-split partials as the Triton split kernel in
``paged_decode.py`` (whose reduce kernel then adds the bf16 tail and merges the splits), but with
the GQA group on the N side of ``mma.m16n8k16`` and each page read by one warp straight into
fragment registers: no 16-row query padding, no shared-memory round trip, and per element only
the hardware E4M3x2 -> f16x2 conversion (plus bit placement and block scales for NVFP4). Why the
Triton kernel could not get there is in docs/benchmarks.md.

Scope (``supports``): both K and V FP8 or NVFP4 (any FP8 granularity), page size 16 (32 and 64 on the
register path: ``reads_page_size``), head_dim 64 or 128, up to 8 query heads per KV head, q in bf16
or fp32, a GPU with E4M3 conversions (sm_89+).
Everything else uses the Triton kernel or the torch reference. On the CPU under Triton's
interpreter (``TRITON_INTERPRET=1``), the "cuda" backend runs this kernel in the warp emulator
(``cuda_emulator.py``, for tests), as an sm_90 GPU of ``EMULATED_SMS`` SMs.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from kvwire.formats import ElementType, Granularity, PageFormat
from kvwire.kernels import cuda_emulator
from kvwire.kernels._common import elem_code, gran_code
from kvwire.kernels.cuda_emulator import emulated
from kvwire.kernels.nvrtc import CudaKernel, NvrtcUnavailableError, choose, load_kernel

SOURCE = "paged_decode_split.cu"
KERNEL = "kvwire_decode_split"
NUM_WARPS = 4
TILE = 16                 # tokens per MMA tile (P in the .cu source)
MIN_PAGES_PER_WARP = 8    # tiles, at least, that each warp of a split reads
# Compile-time tuning of the kernel (see the .cu source), measured on the H200 (2026-12-03,
# docs/benchmarks.md "Tuning" and "Per-page trims"):
# - DEPTH = pages held in registers per warp (the one attended + those in flight). 1: no register
#   ring (the next page id is still read a step ahead); resident warps matter more than a ring.
# - MINB = minimum resident blocks per SM for __launch_bounds__ (5: at most 96 registers).
# - PREF = pages beyond those that are prefetched into L2 (0: measured no help).
# - LAZYMAX = how far (log2 units) a score may pass the running max before the warp rescales
#   (0 keeps the exact max; 5 measured 1-4% faster).
# - QSMEM = q's MMA fragments in shared memory. At 96 registers that is what lets every page load
#   issue before the page's first MMA (one memory round trip per page instead of two): at 32x32k
#   nvfp4 0.438 -> 0.400 ms, fp8-token/nvfp4 0.464 -> 0.439, fp8-token 0.556 -> 0.545, fp8-tensor
#   0.513 -> 0.503 (against q in registers at 4 blocks/SM, 5 for NVFP4).
# - SCALESHFL = fp8-token pages (token scales on both K and V): each lane loads one of the page's 32
#   scales and shuffles deliver them (one load request per page instead of four, and no spill).
#   32x32k, four interleaved rounds (2026-12-04): 0.5472-0.5510 ms (one outlier 0.5756) against
#   0.5526-0.5611; about 1% (docs/bench-runs/2026-12-04-cuda-decode-scaleshfl.txt).
# - STAGES = slots of each warp's shared-memory page ring, filled by the bulk-copy engine (0: pages
#   are loaded straight into registers). sm_90+ only: kernel_for uses 0 on older GPUs.
# - WHOLEPAGE = 1: a block is NW consecutive KV heads of one sequence and split, one warp each, all
#   walking the split's pages together (each page's sections read as contiguous runs, and with
#   STAGES one bulk copy per section for the whole block); 0: a block is NW warps of one KV head
#   taking turns over the pages, merged in the block. NW is then the largest divisor of H up to
#   NW. REFILL_LAG: with STAGES, how far the block ring's slowest warp may trail (1 <= .. < STAGES).
# - EVENCOLS (default: 1 when G <= 4) = query heads in the score MMA's even columns only, so each
#   lane's softmax works on one column instead of two and P reaches the value MMA in two shuffles
#   instead of four plus two selects: NVFP4 page loop 509 -> 487 instructions (docs/benchmarks.md,
#   session 28). 0 keeps heads in columns 0..G-1 (what G > 4 needs).
# - KLINES (default 1) = FP8 keys at D = 128 with G <= 4 loaded as whole 128-byte lines (each lane
#   16 consecutive bytes), so a load asks L2 for 4 whole lines instead of 8 half lines; q's odd
#   score columns then carry each head's second half of d (decode_page_regs.cuh). 32x32k, two
#   interleaved rounds (docs/benchmarks.md, session 29): on the H200 fp8-tensor 2-4% faster and the
#   mixed formats 1-2% (H100: 1% and 0.2-1.2%); fp8-token at deep grids reads through the staged
#   ring and does not change.
# - PROBE_LOADS = 1 builds a timing probe of the memory path (no attention, meaningless output);
#   PROBE_NOCVT = 1 / 2 / 3 one of the attention without the NVFP4 keys' / values' / both's f16
#   conversion and block-scale multiply, 4 without the keys' scale multiply only (meaningless
#   output). Only sweeps set them (scripts/gpu/cuda_decode.sh VARIANTS, decode_sweep.py variants).
# (BESIDE, a layout experiment with each head's fp8 token scales right after its data, was removed
# on 2026-12-06: 1-1.5% slower on the H200 and no gain on the H100, docs/benchmarks.md.)
DEFAULT_TUNING: dict[str, int] = {"DEPTH": 1, "MINB": 5, "PREF": 0, "LAZYMAX": 5, "QSMEM": 1, "SCALESHFL": 1,
                                  "STAGES": 0, "WHOLEPAGE": 0, "KLINES": 1}
# Per (key, value) element type overrides of the defaults (none measured better today).
FORMAT_TUNING: dict[tuple[ElementType, ElementType], dict[str, int]] = {}
# Overrides on top of both, for benchmarks, sweeps and tests of other variants.
TUNING: dict[str, int] = {}


def supports(page_format: PageFormat, num_q_heads: int, q: torch.Tensor) -> bool:
    """Whether the CUDA split kernel covers this format, shape and device."""
    f = page_format
    compact = (ElementType.FP8, ElementType.NVFP4)
    if not (q.is_cuda or emulated(q.device)) or f.kv.key.element not in compact or f.kv.value.element not in compact:
        return False
    g = num_q_heads // f.num_kv_heads
    if not reads_page_size(f) or f.head_dim not in (64, 128) or not 1 <= g <= 8:
        return False
    if q.dtype not in (torch.bfloat16, torch.float32) or q.stride(-1) != 1:
        return False
    return emulated(q.device) or torch.cuda.get_device_capability(q.device) >= (8, 9)


def reads_page_size(page_format: PageFormat) -> bool:
    """Whether the kernel reads this format's page size: one MMA tile of 16 tokens, or, on the
    register path (no STAGES, WHOLEPAGE or PREF), 2 or 4 tiles, which the block's warps share
    (PT in the .cu source: each warp reads one tile of every page it visits)."""
    tiles, rest = divmod(page_format.page_size, TILE)
    if rest or tiles not in (1, 2, 4) or NUM_WARPS % tiles:
        return False
    t = tuning_for(page_format)
    return tiles == 1 or not (t["STAGES"] or t["WHOLEPAGE"] or t["PREF"])


def _capability(device: torch.device) -> tuple[int, int]:
    return (9, 0) if emulated(device) else torch.cuda.get_device_capability(device)


def _sms(device: torch.device) -> int:
    if emulated(device):
        return cuda_emulator.EMULATED_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def tuning_for(page_format: PageFormat) -> dict[str, int]:
    """The compile-time tuning of this format's kernel: defaults, per-format entries, overrides."""
    kv = page_format.kv
    return {**DEFAULT_TUNING, **FORMAT_TUNING.get((kv.key.element, kv.value.element), {}), **TUNING}


def kernel_for(page_format: PageFormat, num_q_heads: int, q_dtype: torch.dtype,
               device: torch.device, overrides: dict[str, int] | None = None) -> CudaKernel:
    """The split kernel compiled with ``tuning_for`` plus ``overrides`` (STAGES is 0 before sm_90)."""
    f = page_format
    defines = {
        "H": f.num_kv_heads, "G": num_q_heads // f.num_kv_heads, "D": f.head_dim, "NW": NUM_WARPS,
        "KELEM": elem_code(f.kv.key), "KGRAN": gran_code(f.kv.key), "VELEM": elem_code(f.kv.value),
        "VGRAN": gran_code(f.kv.value), "QF32": int(q_dtype == torch.float32), "PT": f.page_size, **tuning_for(f),
        **(overrides or {}),
    }
    if _capability(device) < (9, 0):
        defines["STAGES"] = 0                      # the bulk-copy engine is sm_90+
    if defines["WHOLEPAGE"]:
        defines["NW"] = heads_per_block(f.num_kv_heads, defines["NW"])
    if emulated(device):
        return cuda_emulator.load_emulated(SOURCE, KERNEL, defines)
    return load_kernel(SOURCE, KERNEL, defines, device)


def heads_per_block(kv_heads: int, most: int) -> int:
    """The KV heads of one WHOLEPAGE block: the largest divisor of ``kv_heads`` up to ``most``."""
    return max(n for n in range(1, min(most, kv_heads) + 1) if kv_heads % n == 0)


def grid(kernel: CudaKernel, splits: int, batch: int, kv_heads: int) -> tuple[int, int, int]:
    """The launch grid: (splits, one row per KV head, or WHOLEPAGE: per block of NW heads)."""
    per_block = kernel.defines["NW"] if kernel.defines.get("WHOLEPAGE") else 1
    return (splits, batch * kv_heads // per_block, 1)


# Deep grids take the shared-memory page ring (STAGES=DEEP_GRID_STAGES) for fp8-token pages (token
# scales on K and V): measured on the H200 (2026-12-04, docs/benchmarks.md "Staged pages"), 1-3%
# faster at 64x8k, 32x32k and 16x128k (about 7 waves of blocks), but 2% slower at 8x32k (4 waves)
# and 10% at 1x32k (under one wave), where the ring's start-up is not amortised; slower for the
# other formats at every shape measured.
DEEP_GRID_STAGES = 2
DEEP_GRID_WAVES = 6


def deep_grid_stages(page_format: PageFormat) -> int:
    """Ring slots for this format's deep grids (0: none), unless TUNING sets STAGES itself or the
    tuning uses whole-page blocks (the per-warp ring is what was measured)."""
    kv = page_format.kv
    token_fp8 = all(t.element is ElementType.FP8 and t.granularity is Granularity.TOKEN for t in (kv.key, kv.value))
    per_warp = not tuning_for(page_format)["WHOLEPAGE"]
    one_tile = page_format.page_size == TILE          # the rings hold pages of one tile
    return DEEP_GRID_STAGES if token_fp8 and per_warp and one_tile and "STAGES" not in TUNING else 0


@dataclass(frozen=True)
class DecodeKernels:
    """One format's split kernels: ``regular`` (tuning_for), and ``deep_grid`` (the staged ring,
    or None) for launches of at least ``deep_grid_blocks`` blocks of its own. Both are compiled
    when selected, so that a launch never compiles (which CUDA-graph capture would not allow)."""

    regular: CudaKernel
    deep_grid: CudaKernel | None = None
    deep_grid_blocks: int = 0

    def for_launch(self, splits: int, batch: int, kv_heads: int) -> CudaKernel:
        if self.deep_grid is not None:
            g = grid(self.deep_grid, splits, batch, kv_heads)
            if g[0] * g[1] >= self.deep_grid_blocks:
                return self.deep_grid
        return self.regular


def kernels_for(page_format: PageFormat, num_q_heads: int, q_dtype: torch.dtype,
                device: torch.device) -> DecodeKernels:
    """The regular kernel and, where ``deep_grid_stages`` names a ring (on sm_90+), the staged one
    with the grid size from which it runs: DEEP_GRID_WAVES full waves of the GPU."""
    regular = kernel_for(page_format, num_q_heads, q_dtype, device)
    stages = deep_grid_stages(page_format)
    deep = kernel_for(page_format, num_q_heads, q_dtype, device, {"STAGES": stages}) if stages else None
    if deep is None or not deep.defines["STAGES"]:
        return DecodeKernels(regular)
    sms = _sms(device)
    return DecodeKernels(regular, deep, DEEP_GRID_WAVES * sms * max(1, deep.blocks_per_sm(32 * deep.defines["NW"])))


def select(backend: str, page_format: PageFormat, num_q_heads: int, q: torch.Tensor,
           eligible: bool) -> DecodeKernels | None:
    """The CUDA kernels to run for ``backend`` ("auto", "cuda", "triton"), or None for Triton
    (``nvrtc.choose``: "cuda" raises where the kernel does not apply)."""
    f = page_format
    return choose(backend, eligible and supports(f, num_q_heads, q),
                  lambda: kernels_for(f, num_q_heads, q.dtype, q.device),
                  lambda: (f"the CUDA decode kernel does not cover format {f.name}, page size {f.page_size}, "
                           f"head_dim {f.head_dim}, {num_q_heads} query heads, q {q.dtype} on {q.device}"),
                  "paged decode")


# Programmatic dependent launch of the Triton reduce kernel after this one (sm_90+): the split
# kernel's blocks signal at their start (griddepcontrol.launch_dependents), so the reduce kernel is
# launched while the last wave of split blocks runs, reads q and the tail, and waits
# (griddepcontrol.wait) only before the partials. A step is ~25 us at 1x32k, and this takes the
# second launch's latency off its critical path. False: plain stream order.
DEPENDENT_LAUNCH = True


def dependent_launch(device: torch.device) -> bool:
    """Whether the reduce kernel is launched as a programmatic dependent on ``device``."""
    return DEPENDENT_LAUNCH and not emulated(device) and _capability(device) >= (9, 0)


def default_splits(kernel: CudaKernel, batch: int, kv_heads: int, max_pages: int, device: torch.device) -> int:
    """Split count: the fewest splits whose blocks fill whole waves of the GPU best.

    A wave is (SMs x resident blocks per SM) blocks. Too few blocks leave SMs idle and a last,
    partial wave idles most of them, so pick s (at least MIN_PAGES_PER_WARP pages per warp) that
    maximises blocks / (waves x wave size); ties go to fewer splits (fewer partials to merge).
    """
    sms = _sms(device)
    num_warps = kernel.defines["NW"]
    wave = sms * max(1, kernel.blocks_per_sm(32 * num_warps))
    rows = grid(kernel, 1, batch, kv_heads)[1]
    tiles = kernel.defines.get("PT", TILE) // TILE                            # a warp reads one tile of a page
    warps_per_split = 1 if kernel.defines.get("WHOLEPAGE") else num_warps // tiles    # ... sharing a split's pages
    cap = max(1, -(-max_pages // (warps_per_split * MIN_PAGES_PER_WARP)))
    best, best_eff = 1, 0.0
    for s in range(1, cap + 1):
        blocks = rows * s
        eff = blocks / (-(-blocks // wave) * wave)
        if eff > best_eff + 0.02:
            best, best_eff = s, eff
    return best


def split_partials(kernels: DecodeKernels, q: torch.Tensor, storage: torch.Tensor, page_format: PageFormat, layer: int,
                   page_table: torch.Tensor, num_pages: torch.Tensor, static: torch.Tensor,
                   part_acc: torch.Tensor, part_m: torch.Tensor, part_l: torch.Tensor, splits: int,
                   qk_scale: float, offsets: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    """Fill the partials [B*H*splits*G, D] / [B*H*splits*G] exactly as the Triton split kernel does."""
    f = page_format
    bsz = q.shape[0]
    if page_table.dtype != torch.int32 or num_pages.dtype != torch.int32:
        raise ValueError("page_table and num_pages must be int32 for the CUDA kernel")
    if storage.data_ptr() % 16:
        raise ValueError("the CUDA decode kernel reads pages with 16-byte loads; page storage must be 16-byte "
                         f"aligned (data_ptr % 16 = {storage.data_ptr() % 16})")
    if f.page_bytes >= 2**32:
        raise ValueError(f"the CUDA kernel addresses pages with 32-bit sizes; {f.name} pages are {f.page_bytes} bytes")
    i64, i32, ptr = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    kd, vd = offsets
    kern = kernels.for_launch(splits, bsz, f.num_kv_heads)
    args = [ptr(q.data_ptr()), i64(q.stride(0)), i64(q.stride(1)),
            ptr(storage.data_ptr()), i64(f.page_bytes),
            ptr(page_table.data_ptr()), i64(page_table.stride(0)), ptr(num_pages.data_ptr()),
            ptr(static.data_ptr()), i32(layer),
            ptr(part_acc.data_ptr()), ptr(part_m.data_ptr()), ptr(part_l.data_ptr()),
            i32(splits), ctypes.c_float(qk_scale),
            *[i64(o) for o in kd], *[i64(o) for o in vd]]
    kern.launch(grid(kern, splits, bsz, f.num_kv_heads), (32 * kern.defines["NW"], 1, 1), args)


__all__ = ["DecodeKernels", "NvrtcUnavailableError", "deep_grid_stages", "default_splits", "dependent_launch", "grid",
           "heads_per_block", "kernel_for", "kernels_for", "reads_page_size", "select", "split_partials",
           "supports", "tuning_for"]
