"""`kvwire bench quantize`'s table from a recorded H200 run: both kernels, and runs recorded before
the CUDA kernel existed (no "backend" field) still render."""
import json
from pathlib import Path

from kvwire.bench.quantize import format_table

RUN = Path(__file__).resolve().parents[2] / "docs" / "bench-runs" / "2026-12-03-quantize-cuda.json"


def test_table_shows_the_kernel_of_every_row():
    result = json.loads(RUN.read_text())
    table = format_table(result).splitlines()
    rows = [line for line in table if line.startswith("| nvfp4 |")]
    assert [r.split(" | ")[1] for r in rows] == ["cuda", "triton", "cuda"]
    assert "| - |" in rows[0] and "61.8%" in rows[0]


def test_rows_without_a_backend_are_triton():
    result = json.loads(RUN.read_text())
    for r in result["rows"]:
        r.pop("backend")
        r["heads_per_program"] = r["heads_per_program"] or 2
    assert all(" | triton | " in line for line in format_table(result).splitlines()[3:])
