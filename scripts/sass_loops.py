"""Loops in an nvdisasm listing, for the offline SASS reports (scripts/chunk_sass.py, cuda_sass.py):
each loop is the instructions from a backward branch's target to the branch."""
from __future__ import annotations

import collections
import re


def loops(sass: str) -> list[list[str]]:
    """Every loop body of the listing, as its instructions' texts."""
    ins, labels, pending = [], {}, None
    for line in sass.splitlines():
        m = re.match(r"\.L_x_(\d+):", line.strip())
        if m:
            pending = m.group(1)
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            addr = int(m.group(1), 16)
            ins.append((addr, m.group(2).strip()))
            if pending is not None:
                labels[pending], pending = addr, None
    bodies = []
    for addr, text in ins:
        m = re.search(r"BRA.*\.L_x_(\d+)", text)
        if m and m.group(1) in labels and labels[m.group(1)] < addr:
            bodies.append([t for a, t in ins if labels[m.group(1)] <= a <= addr])
    return bodies


def opcode_mix(body: list[str]) -> collections.Counter:
    """Opcodes (without modifiers or predicates) of a loop body, counted."""
    return collections.Counter((t.split()[1] if t.startswith("@") else t.split()[0]).split(".")[0] for t in body)
