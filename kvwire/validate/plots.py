"""Recall curves (accuracy vs context length, one line per format, one panel per task) and
fidelity curves, as PNG. Matplotlib's Agg backend: no display needed (CI, Ray jobs)."""
from __future__ import annotations

from pathlib import Path

from kvwire.validate.config import BASELINE, Task, cell_key

FIDELITY = (("top1_agreement", "next-token top-1 agreement with bf16 (%)", 100.0),
            ("attn_top1_agreement", "attention top-1 agreement with bf16 (%)", 100.0),
            ("kl_mean", "next-token KL(bf16 || format), nats", 1.0))


def _style(fmt: str, index: int) -> dict:
    """bf16 black and thick; FP8-only solid, NVFP4-only dashed, mixed dotted: the family shows
    at a glance even with a dozen lines."""
    import matplotlib.pyplot as plt

    if fmt == BASELINE:
        return {"color": "black", "linewidth": 2.6, "linestyle": "-", "marker": "o", "zorder": 5}
    parts = fmt.split("/")
    if len(parts) == 2:
        ls = ":"
    else:
        ls = "--" if "nvfp4" in fmt else "-"
    color = plt.get_cmap("tab20")(index % 20)
    return {"color": color, "linewidth": 1.5, "linestyle": ls, "marker": "osD^v<>ph*"[index % 10], "markersize": 4}


def _series(data: dict, fmt: str, value) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for n in data["sweep"]["lengths"]:
        cell = data["cells"].get(cell_key(fmt, n))
        y = value(cell) if cell else None
        if y is not None:
            xs.append(n)
            ys.append(y)
    return xs, ys


def accuracy_limits(formats: int, dodge: float) -> tuple[float, float]:
    """Fixed y-limits for accuracy panels: 0-100% plus room for the dodged lines and a 2-point margin.
    Matplotlib's own limits zoom in on the data, so formats tied at 100% but dodged by 0.4 points
    filled the panel (97.8-102.2%) and looked like a spread of results."""
    pad = 2.0 + dodge * formats / 2
    return -pad, 100.0 + pad


def _panels(data: dict, path: Path, title: str, panels: list[tuple[str, object, bool]],
            dodge: float = 0.0, ylim: tuple[float, float] | None = None) -> Path | None:
    """``dodge``: points each format's line is shifted by (bf16 never), so that formats with
    equal scores, common with a few prompts per cell, stay visible side by side. ``ylim``: fixed
    limits for the linear panels (None: matplotlib's)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    formats = data["sweep"]["formats"]
    cols = 2 if len(panels) > 1 else 1
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 4.2 * rows), squeeze=False)
    drawn = False
    for ax, (label, value, log) in zip(axes.flat, panels):
        for i, fmt in enumerate(formats):
            xs, ys = _series(data, fmt, value)
            if dodge and not log and fmt != BASELINE:
                ys = [y + dodge * (i - len(formats) / 2) for y in ys]
            if xs:
                ax.plot(xs, ys, label=fmt, **_style(fmt, i))
                drawn = True
        ax.set_xscale("log", base=2)
        ax.set_xticks(data["sweep"]["lengths"], [str(n) for n in data["sweep"]["lengths"]])
        if log:
            ax.set_yscale("symlog", linthresh=1e-4)
            ax.set_ylim(bottom=0)
        elif ylim is not None:
            ax.set_ylim(*ylim)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("context length (tokens)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if not drawn:
        plt.close(fig)
        return None
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(7, len(labels)), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.04 + 0.025 * ((len(labels) - 1) // 7), 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def recall_plot(data: dict, path: Path) -> Path | None:
    def acc(task: str):
        return lambda cell: None if cell["accuracy"].get(task) is None else 100 * cell["accuracy"][task]

    names = {Task.PASSKEY: "passkey (depths 10/50/90%), accuracy %",
             Task.RETRIEVAL: "multi-document retrieval, exact match %",
             Task.CITATION: "citation (document id), exact match %",
             Task.PREFIX: "prefix cache: warm answer == cold answer, %"}
    panels = [(names[t], acc(t.value), False) for t in Task]
    model = data.get("meta", {}).get("model", "")
    dodge = 0.4
    return _panels(data, path, f"kvwire validate: recall vs context length ({model}); "
                               f"lines offset by {dodge:g} points per format so ties stay visible", panels,
                   dodge=dodge, ylim=accuracy_limits(len(data["sweep"]["formats"]), dodge))


def fidelity_plot(data: dict, path: Path) -> Path | None:
    def fid(key: str, scale: float):
        return lambda cell: None if not cell.get("fidelity") else scale * cell["fidelity"][key]

    panels = [(label, fid(key, scale), key == "kl_mean") for key, label, scale in FIDELITY]
    model = data.get("meta", {}).get("model", "")
    return _panels(data, path, f"kvwire validate: fidelity against bf16 ({model}, in-process)", panels)
