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


def test_chunk_reads_layouts_are_the_formats_and_leave_the_format_module_as_it_was():
    """The walk's layouts: version 2's sections of each format (and the 16-byte page of version 1),
    and a head-major placement of the same per-head bytes, each head's block on 128 bytes."""
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    try:
        import chunk_reads
    finally:
        sys.path.pop(0)
    from kvwire import formats

    for name in ("fp8-token", "fp8-token/nvfp4", "fp8-tensor/nvfp4", "nvfp4"):
        page, secs, per = chunk_reads.layout_sections(name, 128)
        f = formats.PageFormat(formats.KVFormat.parse(name), 16, 1, 8, 128)
        assert 4 * page == f.page_bytes and formats.LINE == 128
        old_page, _, old_per = chunk_reads.layout_sections(name, 16)
        assert formats.LINE == 128 and old_per == per and 4 * old_page <= f.page_bytes
        hm_page, hm_secs, hm_per = chunk_reads.head_major_sections(name)
        assert hm_per == per and (4 * hm_page) % (8 * 128) == 0
        block = hm_secs[0][1]
        assert all(s == block for _, s, _ in hm_secs) and hm_secs[-1][0] + hm_secs[-1][2] <= block
        assert all(a[0] + a[2] == b[0] for a, b in zip(hm_secs, hm_secs[1:]))      # contiguous per head
        for tokens in chunk_reads.PAGE_TOKENS:      # "pages": per-token sections grow with the page
            big_page, big_secs, big_per = chunk_reads.layout_sections(name, 128, tokens)
            assert 4 * big_page == formats.PageFormat(formats.KVFormat.parse(name), tokens, 1, 8, 128).page_bytes
            assert len(big_secs) == len(secs) and big_per == sum(4 * c for _, _, c in big_secs)
            assert all(b[2] * 16 == a[2] * tokens for a, b in zip(secs, big_secs) if a[2] > 1)
    for name in chunk_reads.PAIRED:                 # "scales": the same bytes of each head, interleaved
        page, secs, per = chunk_reads.layout_sections(name, 128)
        p_page, p_secs, p_per = chunk_reads.paired_scale_sections(name)
        i, j = chunk_reads.PAIRED[name]
        assert (p_page, p_per) == (page, per) and [c for _, _, c in p_secs] == [c for _, _, c in secs]
        floats = lambda ss: sorted(o + h * st + k for o, st, c in ss for h in range(8) for k in range(c))
        assert floats([p_secs[i], p_secs[j]]) == floats([secs[i], secs[j]])        # same floats, no overlap
        assert p_secs[j][0] == p_secs[i][0] + p_secs[i][2] and p_secs[i][1] == p_secs[i][2] + p_secs[j][2]
    r = script("chunk_reads.py", "--help")
    assert all(kind in r.stdout for kind in ("layouts", "heads", "pages", "scales"))
    r = script("decode_sweep.py", "--help")
    assert "align" in r.stdout
