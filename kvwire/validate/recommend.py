"""The recommendation: the lowest-precision format whose recall stays within a tolerance of bf16.

"Lowest precision" is measured in what the format costs, bytes per token; "within tolerance"
means every recall task (passkey, retrieval, citation) at every swept length scores no more
than ``tolerance`` percentage points below bf16 on the same prompts. A format whose warm
(prefix-cache) answers differ from its cold ones is disqualified whatever its recall: a cache
that changes answers is a bug, not a trade-off. Missing cells disqualify too (no guessing).
"""
from __future__ import annotations

from dataclasses import dataclass

from kvwire.validate.config import BASELINE, Task, cell_key

RECALL_TASKS = tuple(t.value for t in Task if t.is_recall)


@dataclass(frozen=True)
class Verdict:
    format: str
    bytes_per_token: float
    qualifies: bool
    worst_margin: float | None      # min over tasks and lengths of (format - bf16), points
    reasons: tuple[str, ...]


def judge(data: dict, fmt: str, tolerance: float) -> Verdict:
    cells, lengths = data["cells"], data["sweep"]["lengths"]
    bpt = data["formats"].get(fmt, {}).get("bytes_per_token", float("nan"))
    reasons, margins = [], []
    for n in lengths:
        cell, base = cells.get(cell_key(fmt, n)), cells.get(cell_key(BASELINE, n))
        if cell is None or base is None:
            reasons.append(f"no result at {n} tokens")
            continue
        for task in RECALL_TASKS:
            a, b = cell["accuracy"].get(task), base["accuracy"].get(task)
            if a is None or b is None:
                continue
            margin = round(100 * (a - b), 6)   # 0.7 - 0.8 must be exactly -10 points
            margins.append(margin)
            if margin < -tolerance:
                reasons.append(f"{task} at {n} tokens: {100 * a:.0f}% vs bf16 {100 * b:.0f}%")
        ident, compared = cell["counts"][Task.PREFIX.value]
        if ident != compared:
            reasons.append(f"warm != cold in {compared - ident} of {compared} at {n} tokens")
    worst = min(margins) if margins else None
    return Verdict(fmt, bpt, not reasons, worst, tuple(reasons))


def recommend(data: dict, tolerance: float) -> dict:
    """The verdict for every format and the chosen one (None when no format but bf16 qualifies)."""
    formats = data["sweep"]["formats"]
    verdicts = [judge(data, f, tolerance) for f in formats]
    ok = [v for v in verdicts if v.qualifies and v.format != BASELINE]
    ok.sort(key=lambda v: (v.bytes_per_token, -(v.worst_margin or 0.0), v.format))
    bf16 = data["formats"].get(BASELINE, {}).get("bytes_per_token")
    out = {"tolerance_points": tolerance, "lengths": data["sweep"]["lengths"], "format": None,
           "bytes_per_token": None, "bf16_bytes_per_token": bf16, "saved_bytes_per_token": None,
           "ratio_to_bf16": None,
           "verdicts": [{"format": v.format, "bytes_per_token": v.bytes_per_token, "qualifies": v.qualifies,
                         "worst_margin_points": v.worst_margin, "reasons": list(v.reasons)} for v in verdicts]}
    if ok and bf16:
        best = ok[0]
        out.update(format=best.format, bytes_per_token=best.bytes_per_token,
                   saved_bytes_per_token=bf16 - best.bytes_per_token,
                   ratio_to_bf16=round(best.bytes_per_token / bf16, 4))
    return out


def headline(rec: dict) -> str:
    lengths = ", ".join(str(n) for n in rec["lengths"])
    if rec["format"] is None:
        return (f"recommendation: none (no format below bf16 stays within {rec['tolerance_points']:g} points "
                f"of bf16 at every length: {lengths})")
    return (f"recommendation: {rec['format']} ({rec['bytes_per_token']:,.0f} B/token, "
            f"{rec['ratio_to_bf16']:.3f} of bf16, saves {rec['saved_bytes_per_token']:,.0f} B per token) "
            f"within {rec['tolerance_points']:g} points of bf16 at every length ({lengths})")
