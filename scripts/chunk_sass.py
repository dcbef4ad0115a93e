"""Compile the chunk-attention kernel for sm_90a on a machine without a GPU and report what it costs.

Triton's compiler, ptxas and nvdisasm (all in the triton wheel) build the kernel as a launch on the
H200 would: the integer arguments that are multiples of 16 carry that divisibility and the unit
strides are constants, as Triton specialises them at launch (without that the loads come out
unvectorised and unpipelined, which a real launch never sees). Prints registers, spills and shared
memory (which decide how many programs share an SM), the main loop's instruction mix (the stored
tiles below the block's first query page), and whether the loads are asynchronous copies.

Usage (repo root, the venv of scripts/test.sh):
    python scripts/chunk_sass.py nvfp4 --rows 64 --block-n 128 --warps 4 --stages 2 [--no-fp8-dot]
"""
from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kvwire.formats import ElementType, KVFormat, PageFormat  # noqa: E402
from kvwire.kernels._common import elem_code, gran_code  # noqa: E402
from kvwire.kernels.chunk_attention import _chunk_kernel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sass_loops  # noqa: E402

POINTERS = {"q_ptr": "*bf16", "qpos_ptr": "*i64", "st8": "*u8", "stf8": "*fp8e4nv", "st16k": "*bf16",
            "st16v": "*bf16", "st32": "*fp32", "ids_ptr": "*i64", "static_ptr": "*fp32", "ko_ptr": "*i16",
            "vo_ptr": "*i16", "out_ptr": "*bf16", "part_acc_ptr": "*fp32", "part_m_ptr": "*fp32",
            "part_l_ptr": "*fp32"}
UNIT_STRIDES = ("sq_d", "sko_d", "svo_d", "so_d")
FLOATS = ("qk_scale",)
INT32 = ("n_q", "n_pages", "n_open", "open_start", "num_splits", "layer")


def compile_kernel(name: str, rows: int, block_n: int, warps: int, stages: int, fp8_dot: bool, split: bool,
                   head_dim: int = 128):
    f = PageFormat(KVFormat.parse(name), 16, 1, 8, head_dim)
    kf, vf = f.kv.key, f.kv.value
    const = dict(H=8, G=4, BLOCK_G=4, BLOCK_M=rows // 4, P=16, D=head_dim, BLOCK_D=head_dim, BN=block_n,
                 K_ELEM=elem_code(kf), K_GRAN=gran_code(kf), V_ELEM=elem_code(vf), V_GRAN=gran_code(vf),
                 HW=True, NV_ASM=True, SPLIT=split, FP8_DOT=fp8_dot, PREC="tf32",
                 **{s: 1 for s in UNIT_STRIDES})
    names = list(inspect.signature(_chunk_kernel.fn).parameters)
    sig = {}
    for p in names:
        if p in const:
            sig[p] = "constexpr"
        elif p == "stf8" and not (fp8_dot and kf.element is ElementType.FP8):
            sig[p] = "*u8"              # as the launcher passes it: an E4M3 view only for the FP8 dot
        elif p in POINTERS:
            sig[p] = POINTERS[p]
        elif p in FLOATS:
            sig[p] = "fp32"
        else:
            sig[p] = "i32" if p in INT32 else "i64"
    div16 = [i for i, p in enumerate(names) if sig[p].startswith("*") or (sig[p] == "i64" and p not in UNIT_STRIDES)]
    attrs = {(i,): [["tt.divisibility", 16]] for i in div16}
    return triton.compile(ASTSource(_chunk_kernel, sig, const, attrs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})


def main_loop_mix(sass: str) -> tuple[int, collections.Counter]:
    """The shortest loop with tensor-core instructions (the unmasked stored tiles): size and opcodes."""
    loops = [body for body in sass_loops.loops(sass) if any("GMMA" in t for t in body)]
    body = min(loops, key=len)
    return len(body), sass_loops.opcode_mix(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("format", help="KV format name, e.g. nvfp4, fp8-token/nvfp4")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--block-n", type=int, default=128)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--no-fp8-dot", action="store_true", help="FP8 keys dequantised to fp16 (fp8_dot=False)")
    ap.add_argument("--split", action="store_true", help="the split-KV variant (partials out)")
    ap.add_argument("--head-dim", type=int, default=128, help="a power of two (the launcher pads others)")
    args = ap.parse_args()
    k = compile_kernel(args.format, args.rows, args.block_n, args.warps, args.stages, not args.no_fp8_dot, args.split,
                       args.head_dim)
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        Path(ptx).write_text(k.asm["ptx"])
        report = subprocess.run([bin_dir / "ptxas", "-arch=sm_90a", "-v", ptx, "-o", cubin],
                                capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([bin_dir / "nvdisasm", "-c", cubin], capture_output=True, text=True, check=True).stdout
    regs = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    size, ops = main_loop_mix(sass)
    ttgir = k.asm["ttgir"]
    print(f"{args.format} {args.rows}x{args.block_n}x{args.warps}x{args.stages}: "
          f"{regs.group(1) if regs else '?'} registers, spills {spills.group(0) if spills else 'none'}, "
          f"shared memory {k.metadata.shared} bytes, async copies {ttgir.count('async_copy_global_to_local')}")
    print(f"main loop: {size} instructions: " + " ".join(f"{op}:{n}" for op, n in ops.most_common(20)))


if __name__ == "__main__":
    main()
