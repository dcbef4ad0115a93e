"""The markdown report: recommendation first, then one table per task, prefix reuse, fidelity.

Written from the results JSON alone, so `--report-only` can redraw it and what the report says
is always what the file holds.
"""
from __future__ import annotations

import math
from pathlib import Path

from kvwire.validate.config import BASELINE, Task, cell_key
from kvwire.validate.recommend import headline


def _bytes(bpt: float | None) -> str:
    """A format never opened has no size in the results (recommend gives it NaN): "?", as in the tables."""
    return "?" if bpt is None or math.isnan(bpt) else f"{bpt:,.0f}"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(data: dict, header: str, value) -> list[str]:
    lengths = data["sweep"]["lengths"]
    out = [_row([header, "B/token"] + [f"{n}" for n in lengths]), _row(["---"] * (len(lengths) + 2))]
    for fmt in data["sweep"]["formats"]:
        bpt = data["formats"].get(fmt, {}).get("bytes_per_token")
        row = [f"`{fmt}`", _bytes(bpt)]
        for n in lengths:
            cell = data["cells"].get(cell_key(fmt, n))
            row.append(value(cell) if cell else "-")
        out.append(_row(row))
    return out


def _accuracy(task: str):
    def cell_text(cell: dict) -> str:
        c, n = cell["counts"][task]
        return f"{100 * c / n:.0f}% ({c}/{n})" if n else "-"
    return cell_text


def _prefix(cell: dict) -> str:
    c, n = cell["counts"][Task.PREFIX.value]
    rate = cell["prefix"].get("reuse_rate")
    cold = "" if cell["prefix"].get("first_ask_cold", True) else ", first ask not cold"
    return f"{c}/{n} equal, reuse {100 * rate:.0f}%{cold}" if rate is not None else f"{c}/{n} equal{cold}"


def _fidelity(cell: dict) -> str:
    f = cell.get("fidelity")
    if not f:
        return "n/a"
    worst = min(range(len(f["attn_top1_per_layer"])), key=lambda i: f["attn_top1_per_layer"][i])
    return (f"KL {f['kl_mean']:.4f} / top-1 {100 * f['top1_agreement']:.1f}% / attn {100 * f['attn_top1_agreement']:.1f}% "
            f"(L{worst} {100 * f['attn_top1_per_layer'][worst]:.0f}%)")


def _wall(meta: dict) -> str:
    import datetime

    try:
        start = datetime.datetime.fromisoformat(meta["started"])
        end = datetime.datetime.fromisoformat(meta["finished"])
    except (KeyError, ValueError):
        return "?"
    return f"{(end - start).total_seconds() / 60:.1f} min"


def render(data: dict, rec: dict, images: dict[str, str | None]) -> str:
    meta, settings = data.get("meta", {}), data["settings"]
    seconds = sum(c.get("seconds", 0) for c in data["cells"].values())
    lines = [
        "# kvwire validate: recall of KV formats against bf16", "",
        f"- model: {meta.get('model', '?')} (context {meta.get('max_context', '?')})",
        f"- backend: {meta.get('backend', '?')}; machine: {meta.get('machine', '?')}",
        f"- command: `{meta.get('command', '?')}`",
        f"- started {meta.get('started', '?')}, finished {meta.get('finished', '?')} (wall {_wall(meta)}); "
        f"cell time summed over workers: {seconds / 60:.1f} min for {len(data['cells'])} cells",
        f"- per cell: {settings['samples']} sample(s) x (3 passkey depths + one haystack with "
        f"{settings['questions']} retrieval and {settings['questions']} citation questions); "
        f"seed {settings['seed']}; greedy answers", "",
        "## Recommendation", "", f"**{headline(rec)}**", "",
        f"Rule: every recall task (passkey, retrieval, citation) at every length within "
        f"{rec['tolerance_points']:g} percentage points of bf16 on the same prompts, warm answers equal to cold "
        "ones; among those, the fewest bytes per token. With few prompts per cell one flipped answer moves a "
        "cell by many points, so read a narrow miss as 'not shown safe', not 'shown unsafe'.", "",
        _row(["format", "B/token", "qualifies", "worst margin vs bf16", "why not"]), _row(["---"] * 5)]
    for v in rec["verdicts"]:
        margin = "-" if v["worst_margin_points"] is None else f"{v['worst_margin_points']:+.0f} pts"
        lines.append(_row([f"`{v['format']}`", _bytes(v["bytes_per_token"]), "yes" if v["qualifies"] else "no",
                           margin, "; ".join(v["reasons"][:3]) + (" ..." if len(v["reasons"]) > 3 else "")]))
    lines += [""]
    if images.get("recall"):
        lines += [f"![recall curves]({images['recall']})", ""]
    titles = {Task.PASSKEY: "Passkey (needle at 10%, 50%, 90% depth)",
              Task.RETRIEVAL: "Multi-document retrieval (key -> code, near-duplicate distractor keys)",
              Task.CITATION: "Citation (id of the document holding the fact)"}
    for task, title in titles.items():
        lines += [f"## {title}", ""] + _table(data, "format", _accuracy(task.value)) + [""]
    lines += ["## Prefix-cache reuse (warm answer == cold answer, token for token)", "",
              "The first question on a haystack is cold; it is asked again warm, and further questions are "
              "compared with cold answers computed on demand where the backend can (in-process). Reuse: "
              "prompt pages found in the prefix cache / pages shared with the cached context.", ""]
    lines += _table(data, "format", _prefix) + [""]
    lines += ["## Fidelity against bf16 (in-process engine only)", "",
              "On the haystack text at evenly spread positions: mean next-token KL(bf16 || format) in nats, "
              "next-token top-1 agreement, and attention top-1 agreement (which key each query head weighs "
              "most, keys as stored) averaged over layers, with the worst layer. Through the router these "
              "internals are not visible, so routed sweeps leave them empty.", ""]
    lines += _table(data, "format", _fidelity) + [""]
    if images.get("fidelity"):
        lines += [f"![fidelity curves]({images['fidelity']})", ""]
    return "\n".join(lines)


def write_report(data: dict, rec: dict, out_dir: Path, images: dict[str, Path | None]) -> Path:
    rel = {k: (p.name if p else None) for k, p in images.items()}
    path = out_dir / "report.md"
    path.write_text(render(data, rec, rel))
    return path


def baseline_passkey(data: dict) -> float | None:
    """bf16 passkey recall over every length (the acceptance figure)."""
    c = n = 0
    for key, cell in data["cells"].items():
        if cell["format"] == BASELINE:
            c += cell["counts"][Task.PASSKEY.value][0]
            n += cell["counts"][Task.PASSKEY.value][1]
    return c / n if n else None
