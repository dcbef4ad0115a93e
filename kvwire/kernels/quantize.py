"""Quantise-on-write: full pages of one layer's K or V -> compact page bytes, in one pass.

``write_pages`` reads ``x`` [n, P, H, D] once and writes each page's data and scales straight into
the pool bytes (``PagePool.storage``), bit-identical to ``kvwire.quant.quantize_pages`` followed
by storing the sections into ``PagePool.section`` views (``write_pages_reference``).

On CUDA, FP8 and NVFP4 pages from bf16 input go to the CUDA (NVRTC) kernel in
``quantize_cuda.py`` (same bytes, faster); other inputs and formats, and CPU runs under
TRITON_INTERPRET=1, use the Triton kernel here.

One program per (page, KV head): the [P, D] tile is in registers, so page/token amax, NVFP4 block
amax and global scale need no second pass. Division is IEEE-rounded (``tl.math.div_rn``) so the
scales and codes equal the torch reference's.

Usage::

    write_pages(pool.storage, pool.format, layer, part, page_ids, x, static_scale)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvwire.formats import ElementType, PageFormat
from kvwire.kernels import cuda_emulator, quantize_cuda
from kvwire.kernels._common import (
    check_storage, e4m3_decode, e4m3_encode, elem_code, gran_code, interpreting, part_layer_strides, part_offsets, pow2,
    store_sections, use_triton,
)
from kvwire.quant import NonFiniteCount, non_finite_error, quantize_pages


@triton.jit
def _load_x(ptr, mask, X_BF16: tl.constexpr):
    if X_BF16:
        raw = tl.load(ptr, mask=mask, other=0)
        return (raw.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _count_bad(x):
    """Number of NaN/inf elements of a 2-D tile (x - x is NaN exactly for them)."""
    return tl.sum(tl.sum(((x - x) != 0).to(tl.int32), axis=1), axis=0)


@triton.jit
def _quantize_kernel(x_ptr, sx_n, sx_p, sx_h, sx_d, ids_ptr, st8, st16, st32, static_ptr, flag_ptr,
                     page_bytes, data_off, s_off, bs_off, gs_off, layers, ls_data, ls_s, ls_bs, ls_gs,
                     H: tl.constexpr, HB: tl.constexpr, P: tl.constexpr, D: tl.constexpr, BLOCK_P: tl.constexpr,
                     BLOCK_D: tl.constexpr, ELEM: tl.constexpr, GRAN: tl.constexpr, X_BF16: tl.constexpr,
                     HW: tl.constexpr, HW_BS: tl.constexpr, CHECK: tl.constexpr):
    """One program per (page, block of HB heads): the [P, HB, D] tile is in registers, so page,
    token and block amax need no second pass."""
    i = tl.program_id(0)
    h0 = tl.program_id(1) * HB
    # row i of x is layer i % layers of page ids[i // layers] (write_page_layers; else layers = 1)
    page = tl.load(ids_ptr + i // layers).to(tl.int64)
    layer = (i % layers).to(tl.int64)
    base = page * page_bytes
    data_off += layer * ls_data
    s_off += layer * ls_s
    bs_off += layer * ls_bs
    gs_off += layer * ls_gs
    xb = x_ptr + i.to(tl.int64) * sx_n
    p = tl.arange(0, BLOCK_P)
    hb = tl.arange(0, HB)
    hmask = (h0 + hb) < H
    rows = ((h0 + hb)[None, :] * P + p[:, None]).to(tl.int64)                    # [BP, HB] = h*P + p
    if ELEM == 2:
        NB: tl.constexpr = D // 16
        BLOCK_NB: tl.constexpr = BLOCK_D // 16
        j = tl.arange(0, BLOCK_NB)
        k = tl.arange(0, 16)
        m3 = (p < P)[:, None, None] & hmask[None, :, None]
        m4 = m3[:, :, :, None] & (j < NB)[None, None, :, None]
        dd = (j * 16)[:, None] + k[None, :]                                      # [BNB, 16]
        offs = (p.to(tl.int64)[:, None, None, None] * sx_p + (h0 + hb).to(tl.int64)[None, :, None, None] * sx_h
                + dd.to(tl.int64)[None, None, :, :] * sx_d)
        x4 = _load_x(xb + offs, m4, X_BF16)                                     # [BP, HB, BNB, 16]
        if CHECK:
            bad = _count_bad(tl.reshape(x4, [BLOCK_P * HB, BLOCK_NB * 16]))
            if bad > 0:
                tl.atomic_add(flag_ptr, bad)
        xe, xo = tl.split(tl.reshape(x4, [BLOCK_P, HB, BLOCK_NB, 8, 2]))       # [BP, HB, BNB, 8]
        bamax = tl.maximum(tl.max(tl.abs(xe), axis=3), tl.max(tl.abs(xo), axis=3))   # [BP, HB, BNB]
        amax = tl.max(tl.max(bamax, axis=2), axis=0)                              # [HB]
        glob = tl.math.div_rn(amax, 2688.0)
        glob = tl.where(glob > 0, glob, 1.0)       # 0 when amax is 0 or underflows: see quant.scale_from_amax
        g3 = glob[None, :, None]
        bbits = e4m3_encode(tl.minimum(tl.math.div_rn(bamax, g3 * 6.0), 448.0), HW_BS)
        scale = e4m3_decode(bbits) * g3
        safe = tl.where(scale > 0, scale, 1.0)
        pos = (scale > 0)[:, :, :, None]
        ye = tl.where(pos, tl.math.div_rn(xe, safe[:, :, :, None]), xe * 0)
        yo = tl.where(pos, tl.math.div_rn(xo, safe[:, :, :, None]), xo * 0)
        byte = _e2m1_encode(ye) | (_e2m1_encode(yo) << 4)
        i8 = tl.arange(0, 8)
        dofs = (j * 8)[:, None] + i8[None, :]                                    # [BNB, 8]
        tl.store(st8 + (base + data_off + rows[:, :, None, None] * (D // 2) + dofs[None, None, :, :]),
                 byte.to(tl.uint8), mask=m3[:, :, :, None] & (j < NB)[None, None, :, None])
        tl.store(st8 + (base + bs_off + rows[:, :, None] * NB + j[None, None, :]), bbits.to(tl.uint8),
                 mask=m3 & (j < NB)[None, None, :])
        tl.store(st32 + ((base + gs_off) // 4 + h0 + hb), glob, mask=hmask)
    else:
        d = tl.arange(0, BLOCK_D)
        m = ((p < P)[:, None] & hmask[None, :])[:, :, None] & (d < D)[None, None, :]
        offs = (p.to(tl.int64)[:, None, None] * sx_p + (h0 + hb).to(tl.int64)[None, :, None] * sx_h
                + d.to(tl.int64)[None, None, :] * sx_d)
        x = _load_x(xb + offs, m, X_BF16)                                       # [BP, HB, BD]
        if CHECK:
            bad = _count_bad(tl.reshape(x, [BLOCK_P * HB, BLOCK_D]))
            if bad > 0:
                tl.atomic_add(flag_ptr, bad)
        dst = rows[:, :, None] * D + d[None, None, :]
        if ELEM == 0:
            # fp32 -> bf16, round to nearest even, on the bits (exact everywhere)
            bits = x.to(tl.int32, bitcast=True)
            r = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            tl.store(st16 + ((base + data_off) // 2 + dst), r.to(tl.int16), mask=m)
        else:
            if GRAN == 1:
                amax = tl.max(tl.abs(x), axis=2)                                   # [BP, HB]
                sc = tl.math.div_rn(amax, 448.0)
                sc = tl.where(sc > 0, sc, 1.0)
                y = tl.math.div_rn(x, sc[:, :, None])
                tl.store(st32 + ((base + s_off) // 4 + rows), sc, mask=(p < P)[:, None] & hmask[None, :])
            elif GRAN == 2:
                amax = tl.max(tl.max(tl.abs(x), axis=2), axis=0)                   # [HB]
                sc = tl.math.div_rn(amax, 448.0)
                sc = tl.where(sc > 0, sc, 1.0)
                y = tl.math.div_rn(x, sc[None, :, None])
                tl.store(st32 + ((base + s_off) // 4 + h0 + hb), sc, mask=hmask)
            else:
                sc = tl.load(static_ptr + h0 + hb, mask=hmask, other=1.0)
                y = tl.math.div_rn(x, sc[None, :, None])
            y = tl.minimum(tl.maximum(y, -448.0), 448.0)
            q = e4m3_encode(y, HW)
            tl.store(st8 + (base + data_off + dst), q.to(tl.uint8), mask=m)


@triton.jit
def _e2m1_encode(y):
    """fp32 -> E2M1 code (int32 0..15): nearest magnitude, ties to even, saturate at 6, sign kept."""
    mag = tl.minimum(tl.abs(y), 6.0)
    c = ((mag > 0.25).to(tl.int32) + (mag >= 0.75).to(tl.int32) + (mag > 1.25).to(tl.int32)
         + (mag >= 1.75).to(tl.int32) + (mag > 2.5).to(tl.int32) + (mag >= 3.5).to(tl.int32)
         + (mag > 5.0).to(tl.int32))
    sign = (y.to(tl.int32, bitcast=True) >> 28) & 8
    return c | sign


# KV heads one program quantises (a [P, heads, D] tile); from the H200 bench (kvwire bench quantize).
DEFAULT_HEADS_PER_PROGRAM = {ElementType.BF16: 1, ElementType.FP8: 2, ElementType.NVFP4: 2}


def write_pages(storage: torch.Tensor, page_format: PageFormat, layer: int, part: int,
                page_ids: torch.Tensor, x: torch.Tensor, static_scale: torch.Tensor | None = None,
                *, check_finite: bool = True, nonfinite: NonFiniteCount | None = None, backend: str = "auto",
                _hw_cast: bool | None = None, _hw_block_scale: bool = False,
                _heads_per_program: int | None = None, _layers: int = 1) -> None:
    """Quantise ``x`` [n, P, H, D] (bf16, fp16 or fp32) into pages ``page_ids`` of ``storage``.

    ``part`` 0 = K, 1 = V, each in ``page_format``'s format for it; ``static_scale`` [H] fp32 for
    fp8 ``tensor``/``head`` granularity. Non-finite input raises ``NonFiniteInputError`` (the
    count comes from the kernel itself, one device sync); the named pages then hold undefined
    bytes, which is harmless for freshly allocated pages. ``check_finite=False`` skips the check
    and the sync. ``nonfinite`` defers the check: the kernel adds its count to it and nothing
    syncs here; the caller calls ``nonfinite.raise_if_any()`` once after many writes. On CPU
    tensors without TRITON_INTERPRET=1 this runs the torch reference, which checks at once.
    ``backend``: "auto" runs the CUDA kernel (quantize_cuda.py) where it applies (FP8/NVFP4 pages
    from bf16) and NVRTC loads, else Triton; "triton" and "cuda" force one ("cuda" raises where it
    does not apply).
    """
    if backend not in ("auto", "triton", "cuda"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'cuda', got {backend!r}")
    if nonfinite is not None and not check_finite:
        raise ValueError("nonfinite collects the non-finite check's count: it needs check_finite=True")
    f = page_format
    fmt = f.part_format(part)
    check_storage(storage, f)
    if x.dim() != 4 or tuple(x.shape[1:]) != (f.page_size, f.num_kv_heads, f.head_dim):
        raise ValueError(f"expected x [pages, {f.page_size}, {f.num_kv_heads}, {f.head_dim}], got {tuple(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be bf16, fp16 or fp32, got {x.dtype}")
    page_ids = torch.as_tensor(page_ids, device=storage.device)
    if page_ids.dim() != 1 or page_ids.numel() * _layers != x.shape[0]:
        raise ValueError(f"page_ids must be [{x.shape[0] // _layers}], got {tuple(page_ids.shape)}")
    h = f.num_kv_heads
    if fmt.has_static_scales:
        if static_scale is None or tuple(static_scale.shape) != (h,):
            raise ValueError(f"{fmt.name} needs a static scale of shape [{h}]")
    if x.shape[0] == 0:
        return
    if _layers != 1 and (layer != 0 or fmt.has_static_scales or not use_triton(storage)):
        raise ValueError("a write of several layers starts at layer 0, on the GPU or in the interpreter, "
                         "with scales computed in the page (write_page_layers)")
    if not use_triton(storage):
        if backend == "cuda":
            raise ValueError(f"the CUDA quantise kernel needs CUDA tensors, got storage on {storage.device}")
        store_sections(storage, f, layer, part, page_ids,
                       quantize_pages(x.to(storage.device), fmt, static_scale))
        return
    if x.device != storage.device:
        raise ValueError(f"x is on {x.device}, storage on {storage.device}")
    hw = (not interpreting()) if _hw_cast is None else _hw_cast
    offsets = part_offsets(f, layer, part)
    strides = part_layer_strides(f, part) if _layers > 1 else (0, 0, 0, 0)
    ids = page_ids.to(torch.int64).contiguous()
    if nonfinite is not None and nonfinite.tensor.device != storage.device:
        raise ValueError(f"nonfinite counts on {nonfinite.tensor.device}, storage is on {storage.device}")
    # No launches besides the quantiser's where nothing needs them: a fill or a cast is one more
    # launch (one more CUDA-graph node) per call. Without the check the flag is never touched, and
    # without static scales the static argument is never read.
    if nonfinite is not None:
        flag = nonfinite.tensor
    elif check_finite:
        flag = torch.zeros(1, dtype=torch.int32, device=storage.device)
    else:
        flag = torch.empty(1, dtype=torch.int32, device=storage.device)
    static = (static_scale.to(device=storage.device, dtype=torch.float32).contiguous()
              if static_scale is not None and fmt.has_static_scales else flag.view(torch.float32))
    # the CUDA kernel on the GPU; on the CPU (interpreter) in the warp emulator, when asked for by name
    emulate = backend == "cuda" and cuda_emulator.emulated(storage.device)
    cuda_kernel = quantize_cuda.select(backend, f, part, x, storage, check_finite,
                                       (hw or emulate) and _heads_per_program is None and not _hw_block_scale)
    if cuda_kernel is not None:
        quantize_cuda.launch(cuda_kernel, f, part, x, ids, storage, offsets, static, flag, _layers, strides)
    else:
        _launch_triton(storage, f, fmt, x, ids, static, flag, offsets, check_finite,
                       hw, _hw_block_scale, _heads_per_program, _layers, strides)
    if check_finite and nonfinite is None:
        bad = int(flag.item())
        if bad:
            raise non_finite_error(bad)


def write_page_layers(storage: torch.Tensor, page_format: PageFormat, part: int, page_ids: torch.Tensor,
                      x: torch.Tensor, static_scales: torch.Tensor | None = None, *,
                      nonfinite: NonFiniteCount | None = None, backend: str = "auto") -> None:
    """Quantise every layer of full pages at once: ``x`` [n, layers, P, H, D] into pages ``page_ids``.

    The decode step closes pages whose K/V all layers already hold (the bf16 tails), and one launch
    for them all beats one per layer. Every layer's sections have the same shapes, and each lies a
    fixed stride from the same section of the layer before (``PageFormat.layer_stride``), so the
    kernels take the n x layers rows of ``x`` as (page, layer) pairs and offset each section by its
    stride. Formats with static scales (one per layer) take one call per layer, and so does the
    torch reference path. ``static_scales``: [layers, 2, H].
    """
    f = page_format
    layers = f.num_layers
    if x.dim() != 5 or tuple(x.shape[1:]) != (layers, f.page_size, f.num_kv_heads, f.head_dim):
        raise ValueError(f"expected x [pages, {layers}, {f.page_size}, {f.num_kv_heads}, {f.head_dim}], "
                         f"got {tuple(x.shape)}")
    if f.part_format(part).has_static_scales or not use_triton(storage):
        for layer in range(layers):
            static = static_scales[layer, part] if static_scales is not None else None
            write_pages(storage, f, layer, part, page_ids, x[:, layer], static, nonfinite=nonfinite, backend=backend)
        return
    write_pages(storage, f, 0, part, page_ids, x.reshape(-1, f.page_size, f.num_kv_heads, f.head_dim),
                nonfinite=nonfinite, backend=backend, _layers=layers)


def _launch_triton(storage, f, fmt, x, ids, static, flag, offsets, check_finite, hw, hw_block_scale,
                   heads_per_program, layers, layer_strides) -> None:
    data_off, s_off, bs_off, gs_off = offsets
    x_bf16 = x.dtype == torch.bfloat16
    xk = x.view(torch.int16) if x_bf16 else x
    st16 = storage.view(torch.int16)
    st32 = storage.view(torch.float32)
    d = f.head_dim
    block_d = pow2(d) if fmt.element is not ElementType.NVFP4 else pow2(d // 16) * 16
    block_p = pow2(f.page_size)
    h = f.num_kv_heads
    hb = heads_per_program or DEFAULT_HEADS_PER_PROGRAM.get(fmt.element, 1)
    hb = min(pow2(h), pow2(hb))
    elems = block_p * hb * block_d
    _quantize_kernel[(x.shape[0], triton.cdiv(h, hb))](
        xk, *x.stride(), ids, storage, st16, st32, static, flag,
        f.page_bytes, data_off, s_off, bs_off, gs_off, layers, *layer_strides,
        H=h, HB=hb, P=f.page_size, D=d, BLOCK_P=block_p, BLOCK_D=block_d,
        ELEM=elem_code(fmt), GRAN=gran_code(fmt), X_BF16=x_bf16, HW=hw, HW_BS=hw and hw_block_scale,
        CHECK=check_finite, num_warps=4 if elems <= 4096 else 8,
    )


# ---- torch reference -----------------------------------------------------------------------------

def write_pages_reference(storage: torch.Tensor, page_format: PageFormat, layer: int, part: int,
                          page_ids: torch.Tensor, x: torch.Tensor,
                          static_scale: torch.Tensor | None = None) -> None:
    """``kvwire.quant.quantize_pages`` + store into the section views: what ``write_pages`` must equal."""
    fmt = page_format.part_format(part)
    store_sections(storage, page_format, layer, part, torch.as_tensor(page_ids),
                   quantize_pages(x, fmt, static_scale if fmt.has_static_scales else None))


# ---- benchmark -----------------------------------------------------------------------------------

def written_bytes(page_format: PageFormat, part: int, num_pages: int) -> int:
    """Compact bytes one layer's K or V of ``num_pages`` pages occupies (data + page-resident scales)."""
    f = page_format
    fmt = f.part_format(part)
    per = 0
    for _, shape, dtype in fmt.sections(f.page_size, f.num_kv_heads, f.head_dim):
        n = {"bfloat16": 2, "uint8": 1, "float32": 4}[dtype]
        for s in shape:
            n *= s
        per += n
    return per * num_pages


def benchmark(page_format: PageFormat, num_tokens: int = 32768, part: int = 0, device: str = "cuda",
              check_finite: bool = False, warmup: int = 25, rep: int = 100) -> dict:
    """Time ``write_pages`` for ``num_tokens`` tokens of one layer's K or V (bf16 input)."""
    from triton.testing import do_bench

    f = page_format
    n = num_tokens // f.page_size
    storage = torch.zeros((n, f.page_bytes), dtype=torch.uint8, device=device)
    x = torch.randn((n, f.page_size, f.num_kv_heads, f.head_dim), device=device).to(torch.bfloat16)
    ids = torch.randperm(n, device=device)
    static = torch.full((f.num_kv_heads,), float(x.float().abs().amax()) / 448.0, device=device)
    fn = lambda: write_pages(storage, f, 0, part, ids, x, static, check_finite=check_finite)  # noqa: E731
    ms = do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    read = x.numel() * x.element_size()
    written = written_bytes(f, part, n)
    return {"format": f.part_format(part).name, "tokens": num_tokens, "ms": ms, "bytes_read": read,
            "bytes_written": written, "tb_per_s": (read + written) / ms / 1e9, "check_finite": check_finite}
