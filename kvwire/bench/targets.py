"""The kernel targets (issue 3), judged on a bench run's own rows.

`kvwire bench attention` and `kvwire bench quantize` put the verdicts in their JSON ("targets") and
print them under their tables, so a run says by itself which targets hold on the GPU it ran on: no
reading across a table by hand. A target is a frozen ``Target``: which bench, which shape, which
formats (by element type of keys and values, so every FP8 granularity counts as "FP8 pages"), the
row's metric and the least value that meets it. Targets whose shape or formats a run did not
measure are left out, not failed.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvwire.formats import ElementType, KVFormat

FormatTest = Callable[[KVFormat], bool]


def _kv(key: ElementType, value: ElementType) -> FormatTest:
    return lambda f: f.key.element is key and f.value.element is value


FP8 = _kv(ElementType.FP8, ElementType.FP8)
NVFP4 = _kv(ElementType.NVFP4, ElementType.NVFP4)
FP8_KEYS_NVFP4_VALUES = _kv(ElementType.FP8, ElementType.NVFP4)
BF16 = _kv(ElementType.BF16, ElementType.BF16)


def _compact(f: KVFormat) -> bool:
    return not BF16(f)


@dataclass(frozen=True)
class Target:
    text: str                         # as the issue says it
    bench: str                        # "attention" or "quantize"
    formats: FormatTest
    metric: str                       # the row's field: vs_sdpa, of_read_floor, of_copy_bw
    minimum: float
    batch: int | None = None          # attention: the shape (batch x context)
    context: int | None = None
    tokens: int | None = None         # quantize: tokens written


DECODE_32K = {"bench": "attention", "batch": 32, "context": 32768}
TARGETS = (
    Target("32x32k: FP8 pages >= 1.8x bf16 SDPA", formats=FP8, metric="vs_sdpa", minimum=1.8, **DECODE_32K),
    Target("32x32k: NVFP4 pages >= 3.0x bf16 SDPA", formats=NVFP4, metric="vs_sdpa", minimum=3.0, **DECODE_32K),
    Target("32x32k: FP8 keys with NVFP4 values >= 2.3x bf16 SDPA", formats=FP8_KEYS_NVFP4_VALUES,
           metric="vs_sdpa", minimum=2.3, **DECODE_32K),
    Target("32x32k: compact pages within 80% of their floor", formats=_compact, metric="of_read_floor", minimum=0.8,
           **DECODE_32K),
    Target("32x32k: bf16 pages >= 0.9x bf16 SDPA", formats=BF16, metric="vs_sdpa", minimum=0.9, **DECODE_32K),
    Target("1x32k: FP8 pages >= 1.5x bf16 SDPA", bench="attention", batch=1, context=32768, formats=FP8,
           metric="vs_sdpa", minimum=1.5),
    Target("quantise-on-write at 32k tokens >= 70% of bandwidth", bench="quantize", tokens=32768,
           formats=lambda f: True, metric="of_copy_bw", minimum=0.7),
)


def _applies(t: Target, row: dict) -> bool:
    if t.batch is not None and (row.get("batch"), row.get("context")) != (t.batch, t.context):
        return False
    if t.tokens is not None and row.get("tokens") != t.tokens:
        return False
    return t.formats(KVFormat.parse(row["format"]))


def quantize_rows_judged(rows: list[dict]) -> list[dict]:
    """The quantise rows a target is about: per format, the graph-timed row of the kernel that
    ``write_pages(backend="auto")`` runs (the CUDA kernel where a CUDA row exists, else the best
    Triton launch); the eager rows with the non-finite check are not a target."""
    best: dict[str, dict] = {}
    for r in rows:
        if r.get("check_finite"):
            continue
        old = best.get(r["format"])
        rank = (r.get("backend") == "cuda", r["of_copy_bw"])
        if old is None or rank > (old.get("backend") == "cuda", old["of_copy_bw"]):
            best[r["format"]] = r
    return list(best.values())


def judge(bench: str, rows: list[dict]) -> list[dict]:
    """One verdict per (target, measured row) of ``bench``: the row's format and kernel, the value,
    the minimum and whether it is met."""
    if bench == "quantize":
        rows = quantize_rows_judged(rows)
    out = []
    for t in TARGETS:
        if t.bench != bench:
            continue
        for r in rows:
            if _applies(t, r):
                value = r[t.metric]
                kernel = r.get("kernel", r.get("backend", "triton"))
                out.append({"target": t.text, "format": r["format"], "kernel": kernel,
                            "metric": t.metric, "value": value, "minimum": t.minimum, "met": value >= t.minimum})
    return out


def format_verdicts(verdicts: list[dict]) -> str:
    """The verdicts as a markdown table (empty when the run measured nothing a target is about)."""
    if not verdicts:
        return ""
    lines = ["", "Targets (issue 3), judged on this run:", "| target | format | kernel | measured | needed | |",
             "|---|---|---|---:|---:|---|"]
    for v in verdicts:
        pct = v["metric"] != "vs_sdpa"
        shown = (lambda x: f"{100 * x:.1f}%") if pct else (lambda x: f"{x:.2f}x")
        lines.append(f"| {v['target']} | {v['format']} | {v['kernel']} | {shown(v['value'])} | "
                     f"{shown(v['minimum'])} | {'met' if v['met'] else '**missed**'} |")
    return "\n".join(lines)
