"""`kvwire bench attention` output formatting, on a recorded H200 run (the bench itself needs a GPU)."""
import json
from pathlib import Path

from kvwire.bench.attention import _row_line, format_table

RUN = Path(__file__).parents[2] / "docs" / "bench-runs" / "2026-12-03-cuda-decode-shipped.json"


def test_rows_without_the_dequant_baseline_show_a_dash_not_nan():
    result = json.loads(RUN.read_text())
    assert result["rows"] and all("rel_err" not in r for r in result["rows"])
    table = format_table(result)
    assert "nan" not in table and "| 32x32k | nvfp4 | cuda |" in table
    assert all(line.endswith("| - | - |") for line in table.splitlines()[3:])
    assert _row_line(result["rows"][0]).endswith("err -")
