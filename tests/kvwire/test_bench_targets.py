"""Issue 3's targets judged on bench rows (kvwire.bench.targets): on the recorded H200 runs of
record the verdicts must be what docs/benchmarks.md says, and the quantise verdict must take the
kernel the engine runs, not the fastest row."""
import json
from pathlib import Path

from kvwire.bench import attention, quantize
from kvwire.bench.targets import judge

RUNS = Path(__file__).parents[2] / "docs" / "bench-runs"


def verdicts(found: list[dict]) -> dict[tuple[str, str], bool]:
    return {(v["target"].split(":")[0] + " " + v["metric"], v["format"]): v["met"] for v in found}


def test_the_decode_run_of_record():
    result = json.loads((RUNS / "2026-12-04f-attention.json").read_text())
    got = verdicts(judge("attention", result["rows"]))
    assert got == {
        ("32x32k vs_sdpa", "fp8-token"): False, ("32x32k vs_sdpa", "fp8-tensor"): True,
        ("32x32k vs_sdpa", "nvfp4"): False, ("32x32k vs_sdpa", "fp8-token/nvfp4"): False,
        ("32x32k vs_sdpa", "bf16"): True,
        ("32x32k of_floor", "fp8-token"): True, ("32x32k of_floor", "fp8-tensor"): True,
        ("32x32k of_floor", "nvfp4"): False, ("32x32k of_floor", "fp8-token/nvfp4"): True,
        ("1x32k vs_sdpa", "fp8-token"): True, ("1x32k vs_sdpa", "fp8-tensor"): True,
    }
    table = attention.format_table({**result, "targets": judge("attention", result["rows"])})
    assert "| 32x32k: NVFP4 pages >= 3.0x bf16 SDPA | nvfp4 | cuda | 2.27x | 3.00x | **missed** |" in table


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
