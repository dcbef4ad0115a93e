"""Passkey retrieval prompts: a number hidden in filler, asked for at the end.

Deterministic from a seed (no downloads). The smallest long-context recall test: if a KV format
cannot return five digits from ``depth`` of the way into the context, it will not do RAG.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
INTRO = "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you about it.\n"


@dataclass(frozen=True)
class PasskeyPrompt:
    text: str
    passkey: str
    depth: float


def make_passkey_prompt(tokenizer, target_tokens: int, depth: float = 0.5, seed: int = 0) -> PasskeyPrompt:
    """A prompt of about ``target_tokens`` tokens with the passkey at ``depth`` (0..1) of the filler."""
    if not 0 <= depth <= 1:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    rng = random.Random(seed)
    passkey = str(rng.randint(10000, 99999))
    needle = f"The pass key is {passkey}. Remember it. {passkey} is the pass key. "
    question = "What is the pass key? The pass key is"
    fixed = len(tokenizer.encode(INTRO + needle + question))
    per_filler = len(tokenizer.encode(FILLER * 10)) / 10
    n = max(1, int((target_tokens - fixed) / per_filler))
    before = int(round(n * depth))
    text = INTRO + FILLER * before + needle + FILLER * (n - before) + question
    return PasskeyPrompt(text, passkey, depth)
