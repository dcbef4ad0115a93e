"""Issue 3's targets judged on bench rows (kvwire.bench.targets): on the recorded H200 runs of
record the verdicts must be what docs/benchmarks.md says, the floor must be the fastest read of the
run (not the slower copy rate), and the quantise verdict must take the kernel the engine runs, not
the fastest row."""
import json
from pathlib import Path

import pytest

from kvwire.bench import attention, quantize
from kvwire.bench.attention import add_read_floor
from kvwire.bench.targets import judge

RUNS = Path(__file__).parents[2] / "docs" / "bench-runs"


def verdicts(found: list[dict]) -> dict[tuple[str, str], bool]:
    return {(v["target"].split(":")[0] + " " + v["metric"], v["format"]): v["met"] for v in found}


@pytest.mark.parametrize("run,nvfp4", [("2026-12-04f-attention.json", "2.27x"), ("2026-12-05b-attention.json", "2.26x")])
def test_the_decode_runs_of_record(run, nvfp4):
    result = json.loads((RUNS / run).read_text())
    read = add_read_floor(result["rows"], result.get("read_bandwidth", {}).get("read_pass"))
    got = verdicts(judge("attention", result["rows"]))
    assert got == {
        ("32x32k vs_sdpa", "fp8-token"): False, ("32x32k vs_sdpa", "fp8-tensor"): True,
        ("32x32k vs_sdpa", "nvfp4"): False, ("32x32k vs_sdpa", "fp8-token/nvfp4"): False,
        ("32x32k vs_sdpa", "bf16"): True,
        ("32x32k of_read_floor", "fp8-token"): True, ("32x32k of_read_floor", "fp8-tensor"): True,
        ("32x32k of_read_floor", "nvfp4"): False, ("32x32k of_read_floor", "fp8-token/nvfp4"): True,
        ("1x32k vs_sdpa", "fp8-token"): True, ("1x32k vs_sdpa", "fp8-tensor"): True,
    }
    # Those runs had no read pass: the fastest read was bf16 SDPA at 16x128k, faster than the copy.
    assert read["source"] == "bf16 SDPA at 16x128k" and read["tb_per_s"] > 1.05 * result["copy_bandwidth"]["tb_per_s"]
    table = attention.format_table({**result, "targets": judge("attention", result["rows"])})
    assert f"| 32x32k: NVFP4 pages >= 3.0x bf16 SDPA | nvfp4 | cuda | {nvfp4} | 3.00x | **missed** |" in table
    assert all(r["of_read_floor"] < 1.0 for r in result["rows"] if (r["batch"], r["context"]) == (16, 131072))


def test_the_floor_takes_the_fastest_read_of_the_run():
    rows = [{"batch": 1, "context": 32768, "kv_bytes": 2e9, "ms": 1.0, "sdpa_bf16_kv_bytes": 4e9, "sdpa_bf16_ms": 2.0},
            {"batch": 8, "context": 32768, "kv_bytes": 2e9, "ms": 1.0, "sdpa_bf16_kv_bytes": 4e9, "sdpa_bf16_ms": 1.0}]
    read = add_read_floor(rows, {"bytes": 1, "ms": 1.0, "tb_per_s": 3.0})
    assert read["source"] == "bf16 SDPA at 8x32k" and read["tb_per_s"] == pytest.approx(4.0)
    assert rows[0]["read_floor_ms"] == pytest.approx(0.5) and rows[1]["of_read_floor"] == pytest.approx(0.5)
    read = add_read_floor(rows, {"bytes": 1, "ms": 1.0, "tb_per_s": 5.0})
    assert read["source"] == "read pass" and rows[0]["of_read_floor"] == pytest.approx(0.4)


def test_unmeasured_shapes_are_left_out():
    result = json.loads((RUNS / "2026-12-04f-attention.json").read_text())
    rows = [r for r in result["rows"] if (r["batch"], r["context"]) == (8, 32768)]
    assert rows and judge("attention", rows) == []


def row(fmt: str, backend: str, of_copy: float, check: bool = False, tokens: int = 32768) -> dict:
    return {"format": fmt, "tokens": tokens, "backend": backend, "check_finite": check, "timing": "cuda graph",
            "heads_per_program": None, "ms": 0.03, "bytes_read": 1, "bytes_written": 1, "tb_per_s": 3.0,
            "of_copy_bw": of_copy}


def test_quantize_judges_the_kernel_the_engine_runs():
    rows = [row("fp8-tensor", "triton", 0.83), row("fp8-tensor", "cuda", 0.69), row("fp8-tensor", "cuda", 0.95, True),
            row("bf16", "triton", 0.65), row("bf16", "triton", 0.79), row("nvfp4", "cuda", 0.72, tokens=4096)]
    found = judge("quantize", rows)
    assert [(v["format"], v["kernel"], v["value"], v["met"]) for v in found] == [
        ("fp8-tensor", "cuda", 0.69, False), ("bf16", "triton", 0.79, True)]
    result = {"device": "H200", "copy_bandwidth": {"tb_per_s": 4.28}, "rows": rows, "targets": found,
              "shape": {"num_kv_heads": 8, "head_dim": 128, "page_size": 16}}
    assert "| quantise-on-write at 32k tokens >= 70% of bandwidth | fp8-tensor | cuda | 69.0% | 70.0% | **missed** |" \
        in quantize.format_table(result)


@pytest.mark.parametrize("run", ["2026-12-06c-h200-attention.json", "2026-12-06c-h200-attention-run2.json",
                                 "2026-12-06d-h200-attention.json", "2026-12-06d-h200-attention-run2.json",
                                 "2026-12-06e-h200-attention.json", "2026-12-06e-h200-attention-run2.json"])
def test_the_decode_runs_of_record_2026_12_06(run):
    # session 27's runs, session 28's (after the NVFP4 page-loop cuts) and the current figures of
    # record (session 29, FP8 keys as whole lines): the same verdicts, and fp8-tensor/nvfp4 (first
    # timed on the H200 in session 27) missed
    result = json.loads((RUNS / run).read_text())
    got = verdicts(judge("attention", result["rows"]))
    assert {k: v for k, v in got.items() if not v} == {
        ("32x32k vs_sdpa", "fp8-token"): False, ("32x32k vs_sdpa", "nvfp4"): False,
        ("32x32k vs_sdpa", "fp8-token/nvfp4"): False, ("32x32k vs_sdpa", "fp8-tensor/nvfp4"): False,
        ("32x32k of_read_floor", "nvfp4"): False,
    }
    assert got[("32x32k vs_sdpa", "fp8-tensor")] and got[("32x32k vs_sdpa", "bf16")]
    assert got[("1x32k vs_sdpa", "fp8-token")] and got[("1x32k vs_sdpa", "fp8-tensor")]


@pytest.mark.parametrize("run", ["2026-12-06c-h200-quantize.json", "2026-12-06c-h200-quantize-run2.json"])
def test_the_quantize_runs_of_record_meet_the_target(run):
    result = json.loads((RUNS / run).read_text())
    found = judge("quantize", result["rows"])
    assert {v["format"] for v in found} == {"bf16", "fp8-tensor", "fp8-page", "fp8-token", "nvfp4"}
    assert all(v["met"] for v in found)
    assert [v["value"] for v in found if v["format"] == "nvfp4"][0] > 0.80
