"""`kvwire bench transfer` on DRAM: wire bytes per request match the format's bytes per token."""
import argparse

import pytest

pytest.importorskip("nixl")


def test_wire_bytes_match_format_within_one_percent():
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
