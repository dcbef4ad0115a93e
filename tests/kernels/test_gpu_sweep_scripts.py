"""The GPU sweep scripts (scripts/gpu/*_sweep.py, read_bytes.py) import what they use from kvwire and explain
themselves: they only run on a GPU machine, so without this a rename in kvwire would first show up
there, in a device call. Without CUDA they stop with a clear message before timing anything."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {"decode_sweep.py": ["variants", "32x32k", "nvfp4"], "quantize_sweep.py": ["chunks", "nvfp4", "4 8"]}


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu" / name), *args], capture_output=True,
                          text=True, env=env, timeout=120)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_names_every_kind(name):
    r = script(name, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout and all(kind in r.stdout for kind in ("variants", "GPU machine"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message")
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_without_cuda_it_says_so(name):
    r = script(name, *SCRIPTS[name])
    assert r.returncode != 0 and "needs a CUDA GPU" in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message")
@pytest.mark.parametrize("name, words, args", [("read_bytes.py", ["ncu", "DRAM"], ["1x1k", "fp8-token"]),
                                               ("reduce_parts.py", ["reduce", "split"], ["1x1k", "fp8-token"]),
                                               ("chunk_reads.py", ["walk", "PROBE_LOADS"], ["walk"])])
def test_single_purpose_scripts_explain_themselves_and_need_a_gpu(name, words, args):
    r = script(name, "--help")
    assert r.returncode == 0 and "GPU machine" in r.stdout and all(w in r.stdout for w in words), r.stderr
    r = script(name, *args)
    assert r.returncode != 0 and "needs a CUDA GPU" in r.stderr
