"""Token counts as the benches' flags write them: ``2048`` or ``2k`` (= 2048, a k is 1024 tokens)."""
from __future__ import annotations


def token_count(text: str) -> int:
    """``"16k"`` -> 16384, ``"1000"`` -> 1000; ValueError for anything else."""
    s = text.strip().lower()
    return int(s[:-1]) * 1024 if s.endswith("k") else int(s)
