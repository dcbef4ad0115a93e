"""Build a Triton kernel for a GPU this machine does not have, from a launch the launcher made.

``Recorder`` stands in for a ``@triton.jit`` kernel: indexing it with a grid and calling it
records the arguments instead of running. ``build(record, (8, 0))`` then compiles that launch for
that compute capability with Triton's own compiler and ptxas (both in the triton wheel; no GPU or
driver needed), typing each argument as a launch would: a tensor as a pointer to its dtype, an int
as i32 or i64, a float as fp32, keyword arguments as the kernel's constexprs. So a launcher that
hands a kernel something an older GPU cannot compile (an fp8e4nv pointer before sm_89) fails here,
in CPU CI, instead of inside a worker on that GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64",
           torch.int32: "i32", torch.int16: "i16", torch.uint8: "u8", torch.int8: "i8",
           torch.float8_e4m3fn: "fp8e4nv"}
LAUNCH_OPTIONS = ("num_warps", "num_stages", "launch_pdl")


@dataclass
class Launch:
    kernel: object
    args: tuple
    kwargs: dict


@dataclass
class Recorder:
    kernel: object
    launches: list[Launch] = field(default_factory=list)

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.launches.append(Launch(self.kernel, args, kwargs))
        return record


def _type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__}")


def describe(launch: Launch, capability: tuple[int, int]) -> dict:
    """What ``build`` compiles: the kernel's module and name, its signature and constexprs."""
    import inspect
    fn = launch.kernel.fn
    params = inspect.signature(fn).parameters
    constexprs = {k: v for k, v in launch.kwargs.items() if k not in LAUNCH_OPTIONS}
    values = dict(zip(params, launch.args))
    signature = {}
    for name, param in params.items():
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in values:
            signature[name] = _type(values[name])
        else:                                            # a constexpr left at its default
            signature[name], constexprs[name] = "constexpr", param.default
    return {"module": fn.__module__, "kernel": fn.__name__, "signature": signature, "constexprs": constexprs,
            "options": {k: launch.kwargs[k] for k in ("num_warps", "num_stages") if k in launch.kwargs},
            "capability": list(capability)}


# Run in a fresh interpreter: the tests run with TRITON_INTERPRET=1, under which kernels are not
# compilable JIT functions. One line of JSON per build: its shared memory, or its error.
_CHILD = """
import json, sys, importlib
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
for d in json.loads(sys.argv[1]):
    fn = getattr(importlib.import_module(d["module"]), d["kernel"])
    cc = d["capability"][0] * 10 + d["capability"][1]
    try:
        k = triton.compile(ASTSource(fn, d["signature"], d["constexprs"]), target=GPUTarget("cuda", cc, 32),
                           options=d["options"])
        print(json.dumps({"shared": k.metadata.shared}), flush=True)
    except Exception as e:
        print(json.dumps({"error": f"{type(e).__name__}: {str(e).strip().splitlines()[-1]}"}), flush=True)
"""


def build_all(launches: list[tuple[Launch, tuple[int, int]]], processes: int = 2) -> list[dict]:
    """Compile each (launch, capability) for sm_<capability>, spread over ``processes`` child
    processes (a build is single-threaded; CI has two cores); returns per build {"shared": bytes of
    shared memory} or {"error": the compiler's last line}."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH"))
                                        if p)
    todo = [describe(launch, cc) for launch, cc in launches]
    parts = [todo[i::processes] for i in range(processes) if todo[i::processes]]
    children = [subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(part)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env) for part in parts]
    done = []
    try:
        for child, part in zip(children, parts):
            out, err = child.communicate(timeout=900)
            results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            if child.returncode or len(results) != len(part):
                raise RuntimeError(f"an offline build process failed:\n{err[-2000:]}")
            done.append(results)
    finally:
        for child in children:          # a failed or timed-out build leaves no compiler behind
            if child.poll() is None:
                child.kill()
                child.communicate()
    return [done[i % len(parts)][i // len(parts)] for i in range(len(todo))]


def build(launch: Launch, capability: tuple[int, int]) -> dict:
    """``build_all`` of one launch; raises RuntimeError with the compiler's message when it does not build."""
    (res,) = build_all([(launch, capability)])
    if "error" in res:
        raise RuntimeError(f"{launch.kernel.fn.__name__} does not build for sm_{capability[0]}{capability[1]}: "
                           f"{res['error']}")
    return res
