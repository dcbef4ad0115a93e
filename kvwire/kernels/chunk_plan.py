"""Launch plan of chunk attention (``kvwire.kernels.chunk_attention``): the tile shapes on the GPU,
how many splits of the stored prefix a call takes, and when the prefix goes through
``chunk_gathered`` instead (decoded to bf16 for cuDNN's attention). Kept apart from the kernel so that the
policy (measured on the H200, docs/benchmarks.md "Chunk attention") reads in one place.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import triton
from triton.runtime.errors import OutOfResources

from kvwire.formats import ElementType, Granularity, PageFormat
from kvwire.kernels._common import interpreting, num_sms, pow2

log = logging.getLogger(__name__)

# Tiles on the GPU: (rows = queries x GQA group, keys per tile, warps, stages). H200 (docs/benchmarks.md,
# "Chunk attention"):
# - CHUNK_TILE, for bf16 pages: 128 x 128 x 8 warps was the fastest of 8 shapes at 8k/32k prefixes
#   and 64/512-query chunks on 2026-12-04 (32k + 512 nvfp4 1.50 ms against 2.76 for 64 x 32 x 4).
# - COMPACT_TILE, for FP8/NVFP4 keys and values. Each program holds 255 registers (the wgmma
#   accumulators), so a 256-thread program leaves an SM one program; a 128-thread one fits twice
#   (COMPACT_PER_SM), and two independent programs overlap one's softmax and dequantisation with the
#   other's MMAs. That needs shared memory for two, which compact tiles have since the open tokens
#   moved from fp32 to bf16 operands (nvfp4 160 -> 112 KiB). 32k + 512: nvfp4 1.43 -> 1.15-1.20 ms,
#   fp8-token/nvfp4 1.43 -> 1.07-1.09, fp8-token 1.34 -> 1.17, fp8-tensor 1.01 -> 0.90; 32k + 64
#   (8 splits both): 15-22% faster than CHUNK_TILE except fp8-tensor (7%). bf16 pages need 145 KiB
#   there and lose (0.78 -> 1.15 ms).
CHUNK_TILE = (128, 128, 8, 2)
COMPACT_TILE = (64, 128, 4, 2)
COMPACT_PER_SM = 2
INTERPRETER_TILE = (128, 64, 8, 1)      # the CPU (Triton interpreter): sizes for test speed only
# Splits of the stored prefix: only where the (query block, KV head) programs leave SMs idle (a
# short chunk after a long prefix, e.g. a question after a cached document), up to the programs an
# SM holds, each split at least MIN_SPLIT_TOKENS long. A program is compute-bound, so splitting a
# grid that already fills the GPU only adds the partials' write and merge (H200, 512-token chunk:
# 3-20% slower, docs/benchmarks.md).
MIN_SPLIT_TOKENS = 1024


# Smaller GPUs: built for sm_90 the tiles above need 112-160 KiB of shared memory (Hopper: 227 KiB per
# block), built for sm_80/sm_89 96-122 KiB (A100: 163; L4, A10, RTX 4090: 99). A launch whose tile
# does not fit steps down (``smaller_tile``) and the tile that fitted is remembered per (device,
# format, head_dim, GQA group), so later calls start there.
Tile = tuple[int, int, int, int]
_FITTED: dict[tuple, Tile] = {}


def smaller_tile(tile: Tile) -> Tile | None:
    """The next tile down when ``tile`` needs more shared memory than the GPU has: fewer pipeline
    stages, then half the keys per tile (down to 32), then half the rows (down to 16, with fewer
    warps); None below that."""
    rows, bn, warps, stages = tile
    if stages > 1:
        return rows, bn, warps, stages - 1
    if bn > 32:
        return rows, bn // 2, warps, stages
    if rows > 16:
        return rows // 2, bn, max(4, warps // 2), stages
    return None


def launch_fitting(launch: Callable[[Tile], None], tile: Tile, key: tuple, explicit: bool) -> Tile:
    """Run ``launch(tile)``; where the GPU's shared memory cannot hold the tile (Triton raises
    OutOfResources before the kernel runs, so nothing is half written), step down with
    ``smaller_tile`` and try again, and remember for ``key`` what fitted. An ``explicit`` tile (the
    caller's own choice) is not changed: its error propagates. Returns the tile that ran."""
    asked = tile
    if not explicit:
        tile = _FITTED.get((key, asked), tile)
    while True:
        try:
            launch(tile)
            return tile
        except OutOfResources as exc:
            smaller = None if explicit else smaller_tile(tile)
            if smaller is None:
                raise
            log.warning("chunk attention: tile %s (rows, keys, warps, stages) needs more %s than this GPU has "
                        "(%s); trying %s", tile, exc.name, exc, smaller)
            tile = _FITTED[(key, asked)] = smaller


def fp8_tensor_cores(device: torch.device) -> bool:
    """Whether Triton can run E4M3 x E4M3 dots here (sm_89+: Ada's mma, Hopper's wgmma)."""
    return device.type == "cuda" and not interpreting() and torch.cuda.get_device_capability(device) >= (8, 9)


def queries_per_block(rows: int, block_g: int) -> int:
    """Queries of one program: ``rows`` tile rows of (query, GQA head) pairs, at least 16 rows."""
    return max(1, rows // block_g, 16 // block_g)


def default_splits(programs: int, stored_tokens: int, device: torch.device, per_sm: int = 1) -> int:
    """Splits of the stored prefix: as many as keep programs <= ``per_sm`` x SMs, each at least
    MIN_SPLIT_TOKENS long."""
    if device.type != "cuda" or interpreting():
        return 1
    return max(1, min(per_sm * num_sms(device) // max(1, programs), stored_tokens // MIN_SPLIT_TOKENS))


def default_tile(page_format: PageFormat, device: torch.device) -> tuple[int, int, int, int]:
    """(rows, keys per tile, warps, stages) on the GPU: COMPACT_TILE for FP8/NVFP4 keys and values
    with heads of 64 or more, CHUNK_TILE otherwise (Triton 3.6 fails to lay out the 4-warp tile's
    NVFP4 dot operands for heads of 16 or 32: "Illegal shared layout", scripts/chunk_sass.py)."""
    kv = page_format.kv
    if ElementType.BF16 in (kv.key.element, kv.value.element) or device.type != "cuda" or page_format.head_dim < 64:
        return CHUNK_TILE
    return COMPACT_TILE


def planned_splits(num_queries: int, num_q_heads: int, page_format: PageFormat, stored_pages: int,
                   device: torch.device, tile: tuple[int, int, int, int] | None = None) -> int:
    """The split count ``paged_chunk_attention`` picks by default for such a call (``tile``: the
    one it runs, default ``default_tile``)."""
    tile = tile or default_tile(page_format, device)
    block_m = queries_per_block(tile[0], pow2(num_q_heads // page_format.num_kv_heads))
    programs = triton.cdiv(num_queries, block_m) * page_format.num_kv_heads
    per_sm = COMPACT_PER_SM if tile == COMPACT_TILE else 1
    return default_splits(programs, stored_pages * page_format.page_size, device, per_sm)


# When a chunk's prefix goes through chunk_gathered (decoded to bf16, then cuDNN's attention):
# measured on an H100, Hq = 32, Hkv = 8, D = 128 (docs/benchmarks.md, "Chunk attention: the gathered
# prefix" and "key runs"). It pays where cuDNN's grid, one 128-row tile of (query, head) rows per
# CTA, fills at least GATHER_MIN_WAVE of the GPU and the prefix is long enough for its one extra
# bf16 write to be repaid. 512 queries: 32k nvfp4 1.11 -> 0.56 ms, fp8-tensor 0.69 -> 0.56; 8k
# nvfp4 0.30 -> 0.19, fp8-tensor 0.193 -> 0.197 (the one loss). 1024 queries at 4k: bf16 and
# fp8-tensor lose 5-9%, so the prefix threshold is 8k.
# cuDNN does not split the keys itself: a narrower chunk fills the grid only in key runs
# (``prefix_key_splits``: the prefix cut into equal runs, each run's rows a head of their own, the
# runs' partials merged), and each run must be long enough. Runs of 8k tokens repay it for pages
# whose paged kernel is the slowest, those with an NVFP4 or a token-scaled FP8 part (256 queries
# after 16k, 2 runs: nvfp4 0.31 -> 0.24 ms, fp8-token 0.28 -> 0.25; 128 after 32k, 4 runs: nvfp4
# 0.33 -> 0.26); the others need runs of 16k (256 after 32k, 2 runs: bf16 0.46 -> 0.42,
# fp8-tensor 0.378 -> 0.373; at 8k runs they lose 6-35%). Runs of 4k lost for every format, and
# so did 64-query chunks at every prefix up to 32k. The H200 agreed (docs/benchmarks.md, "Latest:
# 2026-12-06, session 27"): 256 queries after 32k, 2 runs, 0.38-0.62 -> 0.32-0.34 ms for all five
# formats; of the cases left paged only 8k + 256 nvfp4 was faster gathered (0.168 -> 0.160 ms).
GATHER_MIN_PREFIX = 8192          # tokens
GATHER_MIN_WAVE = 0.9             # cuDNN tiles / SMs
GATHER_ROWS = 128                 # rows of one cuDNN tile
GATHER_MAX_KEY_SPLITS = 8         # the most key runs measured
GATHER_MIN_RUN = 16384            # tokens of one key run
GATHER_MIN_RUN_SLOW_PAGES = 8192  # the same where keys or values are NVFP4 or token-scaled FP8


def prefix_key_splits(num_queries: int, num_q_heads: int, prefix_tokens: int, page_format: PageFormat,
                      device: torch.device) -> int:
    """How many equal runs of keys ``chunk_gathered`` cuts the prefix into: the fewest (a power of
    two) whose cuDNN grid fills GATHER_MIN_WAVE of the SMs, within the limits above; 1 off the GPU."""
    if device.type != "cuda" or interpreting():
        return 1
    parts = (page_format.kv.key, page_format.kv.value)
    slow = any(t.element is ElementType.NVFP4 or t.granularity is Granularity.TOKEN for t in parts)
    min_run = GATHER_MIN_RUN_SLOW_PAGES if slow else GATHER_MIN_RUN
    tiles = triton.cdiv(num_queries * num_q_heads, GATHER_ROWS)
    splits = 1
    while (splits < GATHER_MAX_KEY_SPLITS and tiles * splits < GATHER_MIN_WAVE * num_sms(device)
           and prefix_tokens // (2 * splits) >= min_run):
        splits *= 2
    return splits


def gathered_prefix_pays(num_queries: int, num_q_heads: int, prefix_tokens: int, page_format: PageFormat,
                         device: torch.device) -> bool:
    """Whether a chunk's attention should take ``chunk_gathered`` rather than read its prefix
    compact: only on Hopper (where it was measured; cuDNN's fused attention elsewhere is not), with
    the grid (key runs included) and prefix of the constants above."""
    if device.type != "cuda" or interpreting() or torch.cuda.get_device_capability(device)[0] != 9:
        return False
    tiles = triton.cdiv(num_queries * num_q_heads, GATHER_ROWS)
    splits = prefix_key_splits(num_queries, num_q_heads, prefix_tokens, page_format, device)
    return prefix_tokens >= GATHER_MIN_PREFIX and tiles * splits >= GATHER_MIN_WAVE * num_sms(device)
