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
    assert all(line.endswith("| - | - |") for line in table.splitlines()[4:])
    assert _row_line(result["rows"][0]).endswith("err -")


def test_rotated_copies_exceed_the_cache_with_fresh_data():
    import torch

    from kvwire.bench.attention import build_problem, copies_for, rotated_copies
    from kvwire.formats import KVFormat, PageFormat
    f = PageFormat(KVFormat.parse("fp8-token"), 16, 1, 2, 64)
    prob = build_problem(f, 2, 64, 4, "cpu")
    probs, nbytes = rotated_copies(prob, f, 2, 64, 4, "cpu")
    assert probs[0] is prob and len(probs) == copies_for(nbytes) > 1
    assert not torch.equal(probs[1].args[0], prob.args[0])         # another seed: other q and pages
