"""What kvwire's CUDA path needs from a GPU, checked once when a KV cache is placed on one.

The Triton kernels read and write E4M3 bytes through Triton's ``fp8e4nv`` type, whose conversions
exist from sm_89 (Ada, Hopper) on; NVFP4 pages go through E4M3 too (block scales, the unpacking).
bf16 pages need bf16 arithmetic, sm_80 (Ampere) on. Without this check an older GPU fails at the
first prefill, inside a worker, with Triton's "fp8e4nv data type is not supported on CUDA arch
< 89"; with it, the KV cache refuses the device when the worker starts, and says what would work.
"""
from __future__ import annotations

import torch

from kvwire.formats import ElementType, PageFormat

MIN_CAPABILITY_BF16 = (8, 0)        # bf16 pages: Ampere and newer
MIN_CAPABILITY_COMPACT = (8, 9)     # FP8 or NVFP4 keys or values: Ada, Hopper and newer


class UnsupportedDeviceError(RuntimeError):
    """The GPU is too old for the KV format's kernels."""


def required_capability(page_format: PageFormat) -> tuple[int, int]:
    """The lowest CUDA compute capability whose kernels can read and write ``page_format``'s pages."""
    kv = page_format.kv
    compact = any(p.element is not ElementType.BF16 for p in (kv.key, kv.value))
    return MIN_CAPABILITY_COMPACT if compact else MIN_CAPABILITY_BF16


def check_device(page_format: PageFormat, device: torch.device) -> None:
    """Raise ``UnsupportedDeviceError`` where ``device`` is a GPU too old for ``page_format``."""
    if device.type != "cuda":
        return
    have = torch.cuda.get_device_capability(device)
    need = required_capability(page_format)
    if have < need:
        gpu = torch.cuda.get_device_name(device)
        hint = ("use bf16 pages (kv format bf16), " if need == MIN_CAPABILITY_COMPACT and have >= MIN_CAPABILITY_BF16
                else "")
        raise UnsupportedDeviceError(
            f"KV format {page_format.name} on {gpu} (sm_{have[0]}{have[1]}): its kernels need sm_{need[0]}{need[1]} "
            f"or newer ({'Ada or Hopper: FP8 conversions' if need == MIN_CAPABILITY_COMPACT else 'Ampere: bf16'}); "
            f"{hint}a newer GPU, or device cpu")
