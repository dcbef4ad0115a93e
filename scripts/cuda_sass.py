"""The NVRTC kernels' machine code on a machine without a GPU: compile for sm_90, save or compare SASS.

A refactor of kvwire/kernels/cuda that should not change the GPU code is checked by saving the SASS
of a matrix of decode and quantise configurations before it and comparing after it; a kernel
change is sized by its page loop's instruction mix. NVRTC comes from PyPI and nvdisasm/cuobjdump
from the triton wheel, so no CUDA toolkit or driver is needed:

    .venv/bin/pip install nvidia-cuda-nvrtc-cu12==12.9.86
    python scripts/cuda_sass.py save /tmp/sass-before        # 54 configurations, about 20 s
    python scripts/cuda_sass.py compare /tmp/sass-before     # lists the ones whose SASS changed
    python scripts/cuda_sass.py loop nvfp4 nvfp4 MINB=6      # registers, spills, page-loop mix
    python scripts/cuda_sass.py build --arch sm_89 --arch sm_90  # does every configuration build there?

``build`` is what CPU CI runs (tests/kernels/test_cuda_builds.py): the emulator checks what the
kernels compute, this that their PTX assembles for the GPUs they are selected on (sm_89+).
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import glob
import hashlib
import itertools
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import triton  # noqa: E402

from kvwire.kernels import nvrtc, paged_decode_cuda, quantize_cuda  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sass_loops  # noqa: E402

TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
ELEMENTS = {"fp8-token": (1, 1), "fp8-page": (1, 2), "fp8-tensor": (1, 3), "nvfp4": (2, 0)}
PAIRS = [("fp8-token", "fp8-token"), ("fp8-tensor", "fp8-tensor"), ("nvfp4", "nvfp4"), ("fp8-token", "nvfp4"),
         ("fp8-page", "fp8-token")]
DECODE_VARIANTS = [{}, {"STAGES": 2}, {"WHOLEPAGE": 1, "STAGES": 2}, {"WHOLEPAGE": 1}, {"QSMEM": 0, "MINB": 4},
                   {"D": 64, "G": 3}, {"PREF": 2, "DEPTH": 2}, {"QF32": 1},
                   {"G": 8},                   # 8 query heads per KV head: all score columns (EVENCOLS 0)
                   {"KLINES": 0},              # FP8 keys in fragment order (half lines), not whole lines
                   {"PT": 64}, {"PT": 32, "D": 64, "G": 3}]    # pages of 4 and 2 tiles, shared by the warps
# ELEM, GRAN, CPL, CHECK, D, H: other chunk counts, the shipped ones (FP8 4, NVFP4 8), and SmolLM2's
# heads (D 64, H 3), where NVFP4 takes 2 chunks per thread (quantize_cuda.chunks_per_thread)
QUANTIZE = [(1, 1, 2, 0, 128, 8), (1, 2, 2, 1, 128, 8), (1, 3, 2, 0, 128, 8), (2, 0, 2, 0, 128, 8),
            (2, 0, 4, 1, 128, 8), (1, 1, 4, 1, 128, 8), (2, 0, 8, 1, 128, 8), (1, 1, 4, 1, 64, 3),
            (2, 0, 2, 1, 64, 3)]


def load_nvrtc() -> None:
    """NVRTC from the nvidia-cuda-nvrtc wheel, with its builtins library loaded first."""
    libs = sorted(glob.glob(str(Path(sys.prefix) / "lib" / "python3*" / "site-packages" / "nvidia" / "cuda_nvrtc"
                                / "lib" / "libnvrtc.so.*")))
    if not libs:
        raise SystemExit("NVRTC not found: .venv/bin/pip install nvidia-cuda-nvrtc-cu12==12.9.86")
    for builtins in glob.glob(str(Path(libs[0]).parent / "libnvrtc-builtins.so.*")):
        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    nvrtc._LIBS["nvrtc"] = ctypes.CDLL(libs[0])


def cubin(source_file: str, kernel: str, defines: dict[str, int], arch: str = "sm_90") -> bytes:
    """One configuration built for ``arch`` as kvwire builds it there (no bulk-copy ring before
    sm_90, as ``paged_decode_cuda.kernel_for``); raises RuntimeError with NVRTC's log."""
    if source_file == paged_decode_cuda.SOURCE and int(arch.removeprefix("sm_").rstrip("a")) < 90:
        defines = {**defines, "STAGES": 0}
    return nvrtc.compile_cubin((nvrtc.CUDA_SOURCE_DIR / source_file).read_text(), kernel,
                               [f"-D{k}={v}" for k, v in defines.items()], arch)


def sass(source_file: str, kernel: str, defines: dict[str, int]) -> tuple[str, str]:
    """(disassembly, resource usage) of one configuration."""
    cubin_bytes = cubin(source_file, kernel, defines)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin_bytes)
        f.flush()
        text = subprocess.run([str(TOOLS / "nvdisasm"), "-c", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([str(TOOLS / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
    return text, " ".join(re.findall(r"REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+", res))


def decode_defines(key: str, value: str, extra: dict[str, int]) -> dict[str, int]:
    (ke, kg), (ve, vg) = ELEMENTS[key], ELEMENTS[value]
    return {"H": 8, "G": 4, "D": 128, "NW": paged_decode_cuda.NUM_WARPS, "QF32": 0,
            **paged_decode_cuda.DEFAULT_TUNING, "KELEM": ke, "KGRAN": kg, "VELEM": ve, "VGRAN": vg, **extra}


def matrix() -> dict[str, tuple[str, str, dict[str, int]]]:
    """name -> (source, kernel, defines) of every configuration compared."""
    out = {}
    for (k, v), extra in itertools.product(PAIRS, DECODE_VARIANTS):
        out[f"decode {k}/{v} {json.dumps(extra, sort_keys=True)}"] = (
            paged_decode_cuda.SOURCE, paged_decode_cuda.KERNEL, decode_defines(k, v, extra))
    for elem, gran, cpl, check, d, h in QUANTIZE:
        shape = "" if (d, h) == (128, 8) else f" D={d} H={h}"
        name = f"quantize elem={elem} gran={gran} cpl={cpl} check={check}{shape}"
        out[name] = (quantize_cuda.SOURCE, quantize_cuda.KERNEL,
                     {"H": h, "P": 16, "D": d, "CPL": cpl, "ELEM": elem, "GRAN": gran, "CHECK": check, "DIVSTEPS": 1,
                      **quantize_cuda.DEFAULT_TUNING})
    return out


def digests() -> tuple[dict[str, str], dict[str, str]]:
    hashes, texts = {}, {}
    for name, (src, kern, defines) in matrix().items():
        texts[name] = sass(src, kern, defines)[0]
        hashes[name] = hashlib.sha1(texts[name].encode()).hexdigest()[:16]
    return hashes, texts


def page_loop(text: str) -> tuple[int, collections.Counter]:
    """The decode kernel's page loop, its length and instruction mix: the largest loop with
    tensor-core MMAs (for FP8 pages the partials' merge loops are longer than the page loop), or,
    in the memory-path probe, which has none, the largest loop that loads pages."""
    found = sass_loops.loops(text)

    def having(ops: set[str]) -> list[list[str]]:
        return [b for b in found if ops & set(sass_loops.opcode_mix(b))]

    body = max(having({"HMMA"}) or having({"LDG", "UBLKCP"}) or found, key=len)
    return len(body), sass_loops.opcode_mix(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("save", help="write every configuration's SASS and hashes.json into DIR").add_argument("dir")
    sub.add_parser("compare", help="recompile and list configurations whose SASS differs from DIR").add_argument("dir")
    loop = sub.add_parser("loop", help="registers, spills and the page loop's mix of one decode configuration")
    loop.add_argument("key", choices=ELEMENTS)
    loop.add_argument("value", choices=ELEMENTS)
    loop.add_argument("overrides", nargs="*", help="MACRO=VALUE, e.g. MINB=6 WHOLEPAGE=1")
    build = sub.add_parser("build", help="compile every configuration for each --arch; exit 1 if one fails")
    build.add_argument("--arch", action="append", required=True, help="e.g. sm_89 (repeatable)")
    args = ap.parse_args()
    load_nvrtc()
    if args.cmd == "build":
        failed, configs = 0, matrix()
        for arch in args.arch:
            for name, (src, kern, defines) in configs.items():
                try:
                    cubin(src, kern, defines, arch)
                except RuntimeError as e:
                    failed += 1
                    errors = [line for line in str(e).splitlines() if "error" in line]
                    print(f"{arch} {name}: does not build: {(errors or [str(e)])[0].strip()}", flush=True)
        total = len(args.arch) * len(configs)
        print(f"{total - failed} of {total} builds succeeded ({', '.join(args.arch)})")
        sys.exit(1 if failed else 0)
    if args.cmd == "loop":
        extra = {k: int(v) for k, v in (o.split("=") for o in args.overrides)}
        text, res = sass(paged_decode_cuda.SOURCE, paged_decode_cuda.KERNEL, decode_defines(args.key, args.value, extra))
        n, ops = page_loop(text)
        print(res)
        print(f"page loop: {n} instructions (rare branches included):", dict(ops.most_common(16)))
        return
    hashes, texts = digests()
    out = Path(args.dir)
    if args.cmd == "save":
        out.mkdir(parents=True, exist_ok=True)
        (out / "hashes.json").write_text(json.dumps(hashes, indent=1))
        for name, text in texts.items():
            (out / (hashlib.sha1(name.encode()).hexdigest()[:10] + ".sass")).write_text(f"// {name}\n{text}")
        print(f"{len(hashes)} configurations saved in {out}")
        return
    before = json.loads((out / "hashes.json").read_text())
    changed = [name for name in hashes if before.get(name) != hashes[name]]
    print(f"{len(hashes) - len(changed)} of {len(hashes)} configurations have identical SASS")
    for name in changed:
        print("  changed:", name, f"(before: {out / (hashlib.sha1(name.encode()).hexdigest()[:10] + '.sass')})")
    sys.exit(1 if changed else 0)


if __name__ == "__main__":
    main()
