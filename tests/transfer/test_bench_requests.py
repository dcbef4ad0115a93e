"""`kvwire bench transfer` on DRAM: wire bytes per request match the format's bytes per token; bad
arguments are one line and exit 2 before anything starts."""
import argparse

import pytest
import torch

from kvwire.cli import main


def test_wire_bytes_match_format_within_one_percent():
    pytest.importorskip("nixl")
    from transfer.bench_requests import format_table, run
    args = argparse.Namespace(prompts="100,1000", formats="bf16,fp8-token,nvfp4,fp8-token/nvfp4",
                              shape="smollm2-135m", device="cpu", reps=1)
    result = run(args)
    assert len(result["rows"]) == 8
    for r in result["rows"]:
        assert abs(r["wire_bytes"] - r["expected_wire_bytes"]) <= 0.01 * r["expected_wire_bytes"], r
        assert r["descriptors"] == 1 and r["pages"] == (r["prompt_tokens"] - 1) // 16
        assert r["gb_s"] > 0 and r["vs_copy"] > 0
    ratios = {r["format"]: r["ratio"] for r in result["rows"] if r["prompt_tokens"] == 1000}
    assert ratios["bf16"] == 1.0
    assert ratios["nvfp4"] < ratios["fp8-token/nvfp4"] < ratios["fp8-token"] < 0.55
    assert "wire MB" in format_table(result)


@pytest.mark.parametrize("args, words", [
    pytest.param(["--device", "cuda"], ["CUDA is not available", "--device cpu"],
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")),
    (["--device", "bogus"], ["'bogus' is not a device", "cpu, cuda"]),
    (["--device", "meta"], ["DRAM (cpu) or VRAM (cuda)"]),
    (["--prompts", "0"], ["--prompts", "at least 17 tokens"]),
    (["--prompts", "abc"], ["--prompts takes comma-separated token counts", "'abc'"]),
    (["--prompts", "1024,"], ["--prompts takes comma-separated token counts"]),
    (["--shape", "nope"], ["unknown --shape 'nope'", "llama-3-8b"]),
    (["--reps", "0"], ["--reps must be at least 1"]),
    (["--formats", "bf16,fp4"], ["unknown KV format 'fp4'"]),
])
def test_bad_arguments_are_one_line_exit_2(capsys, args, words):
    small = ["--device", "cpu", "--prompts", "100", "--shape", "smollm2-135m", "--reps", "1"]   # should one run
    assert main(["bench", "transfer", *small, *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvwire bench: error: "), captured.err
    assert all(w in lines[0] for w in words), lines[0]
    assert "[bench transfer]" not in captured.out, "refused before the first format ran"


def test_an_indexed_cpu_device_is_the_cpu(tmp_path, capsys):
    """`--device cpu:1` used to pass as CUDA to the copy baseline: an AssertionError traceback."""
    pytest.importorskip("nixl")
    import json
    out = tmp_path / "t.json"
    assert main(["bench", "transfer", "--device", "cpu:1", "--prompts", "100", "--shape", "smollm2-135m",
                 "--formats", "bf16", "--reps", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["copy_gb_s"] > 0


def test_the_copy_baseline_takes_any_cpu_device_name():
    from transfer.bench_requests import copy_gbytes_per_s
    assert copy_gbytes_per_s(1 << 16, "cpu:1", reps=1) > 0


def test_prompt_lengths_take_the_k_the_help_shows():
    """--help gives the default as 1k,4k,16k,64k; `--prompts 16k` used to be refused."""
    from transfer.bench_requests import _prompts
    assert _prompts("1k, 100,16K") == [1024, 100, 16384]
