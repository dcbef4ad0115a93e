"""The recommendation rule on hand-made results: cheapest format within tolerance everywhere."""
from kvwire.validate.recommend import headline, recommend

LENGTHS = [1024, 4096]
BPT = {"bf16": 23040.0, "fp8-token": 12240.0, "nvfp4": 6540.0, "fp8-token/nvfp4": 9390.0}


def cell(fmt, n, acc, prefix=(2, 2)):
    counts = {t: [round(acc[t] * 10), 10] for t in ("passkey", "retrieval", "citation")}
    counts["prefix"] = list(prefix)
    return {"format": fmt, "length": n, "accuracy": {t: c / m for t, (c, m) in counts.items()}, "counts": counts}


def data(accs: dict, prefix: dict | None = None, missing=()):
    cells = {}
    for fmt, per_len in accs.items():
        for n, acc in zip(LENGTHS, per_len):
            if (fmt, n) not in missing:
                cells[f"{fmt}@{n}"] = cell(fmt, n, acc, (prefix or {}).get((fmt, n), (2, 2)))
    return {"sweep": {"formats": list(accs), "lengths": LENGTHS, "tolerance": 2.0}, "cells": cells,
            "formats": {f: {"bytes_per_token": BPT[f]} for f in accs}}


def same(p=1.0, r=0.8, c=0.6):
    return {"passkey": p, "retrieval": r, "citation": c}


def test_cheapest_qualifying_format_wins():
    d = data({"bf16": [same(), same()], "fp8-token": [same(), same()], "fp8-token/nvfp4": [same(), same()],
              "nvfp4": [same(), same(r=0.5)]})
    rec = recommend(d, 2.0)
    assert rec["format"] == "fp8-token/nvfp4"
    assert rec["saved_bytes_per_token"] == BPT["bf16"] - BPT["fp8-token/nvfp4"]
    nv = next(v for v in rec["verdicts"] if v["format"] == "nvfp4")
    assert not nv["qualifies"] and "retrieval at 4096" in nv["reasons"][0]
    assert "fp8-token/nvfp4" in headline(rec) and "saves 13,650 B" in headline(rec)


def test_tolerance_is_in_points_and_a_format_may_beat_bf16():
    d = data({"bf16": [same(), same()], "nvfp4": [same(r=0.7), same(c=0.9)]})
    assert recommend(d, 2.0)["format"] is None           # 10 points down at 1024
    assert recommend(d, 10.0)["format"] == "nvfp4"       # exactly at the tolerance is allowed


def test_warm_differing_from_cold_disqualifies():
    d = data({"bf16": [same(), same()], "nvfp4": [same(), same()]}, prefix={("nvfp4", 4096): (1, 2)})
    rec = recommend(d, 2.0)
    assert rec["format"] is None
    assert "warm != cold" in rec["verdicts"][1]["reasons"][0]
    assert headline(rec).startswith("recommendation: none")


def test_missing_cells_disqualify():
    d = data({"bf16": [same(), same()], "nvfp4": [same(), same()]}, missing={("nvfp4", 4096)})
    rec = recommend(d, 2.0)
    assert rec["format"] is None and "no result at 4096" in rec["verdicts"][1]["reasons"][0]


def test_bf16_alone_is_no_recommendation():
    assert recommend(data({"bf16": [same(), same()]}), 2.0)["format"] is None
