"""The CUDA (NVRTC) kernels build for the GPUs they are selected on, checked without one.

The emulator (test_cuda_emulator.py) runs what the kernels compute, with its own stand-ins for the
PTX primitives, so a PTX instruction an architecture lacks, or a ring that no longer fits, would
first fail inside a GPU worker. Here every configuration of scripts/cuda_sass.py (decode formats x
tuning variants, quantise formats) goes through NVRTC and ptxas for sm_89 (Ada: no bulk-copy ring),
sm_90 (Hopper) and sm_100 (Blackwell), as kvwire builds them there; sm_86 must fail, which is why
kvwire.kernels.device_support asks for sm_89 before compact pages are placed on a GPU."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cuda_sass.py"


def nvrtc_wheel() -> bool:
    return any(Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.*"))


pytestmark = pytest.mark.skipif(not nvrtc_wheel(), reason="needs the nvidia-cuda-nvrtc-cu12 wheel (test extra)")


def build(*archs: str) -> subprocess.CompletedProcess:
    args = [a for arch in archs for a in ("--arch", arch)]
    return subprocess.run([sys.executable, str(SCRIPT), "build", *args], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)


def succeeded(r: subprocess.CompletedProcess) -> tuple[int, int]:
    m = re.search(r"(\d+) of (\d+) builds succeeded", r.stdout)
    assert m, r.stdout[-3000:] + r.stderr[-2000:]
    return int(m.group(1)), int(m.group(2))


def test_every_configuration_builds_for_ada_hopper_and_blackwell():
    r = build("sm_89", "sm_90", "sm_100")
    ok, total = succeeded(r)
    assert r.returncode == 0 and ok == total >= 80, r.stdout[-3000:]


def test_ampere_cannot_build_them():
    r = build("sm_86")
    assert r.returncode == 1 and succeeded(r)[0] == 0
    assert "requires .target sm_89" in r.stdout


@pytest.mark.parametrize("probe", ["PROBE_LOADS=1", "PROBE_NOCVT=1", "PROBE_NOCVT=2", "PROBE_NOCVT=3", "PROBE_NOCVT=4"])
def test_the_timing_probes_build(probe):
    """The sweeps' timing probes (scripts/gpu/decode_sweep.py variants) are not in the matrix above;
    they still have to compile for sm_90, NVFP4 keys and values."""
    r = subprocess.run([sys.executable, str(SCRIPT), "loop", "nvfp4", "nvfp4", probe], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0 and "page loop:" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
