"""Fixtures for the validation sweep's tests: the tokenizer alone (fast) and an oracle backend
that answers from the prompt text, so the sweep's bookkeeping is tested without a model."""
from __future__ import annotations

import re

import pytest

from kvwire.validate.backends import Answer


@pytest.fixture(scope="session")
def tokenizer():
    from kvwire.model.registry import load_tokenizer

    return load_tokenizer("smollm2")


class OracleBackend:
    """Reads the answer off the prompt (passkey, code, document id) and returns it as tokens;
    ``wrong`` maps (format, task) to a prompt length from which it answers wrongly. Prefix reuse
    is simulated from the prompts seen since the format opened (whole pages of a common prefix)."""

    supports_cold = True
    supports_probe = False
    description = "oracle"

    def __init__(self, tokenizer, wrong: dict | None = None, page_size: int = 16) -> None:
        self.tok = tokenizer
        self.wrong = wrong or {}
        self.page_size = page_size
        self.seen: list[list[int]] = []
        self.calls = 0
        self.opened: list[str] = []

    def open_format(self, fmt: str) -> None:
        self.opened.append(fmt)
        self.seen = []

    def close_format(self, fmt: str) -> None:
        pass

    def bytes_per_token(self, fmt: str) -> float:
        return {"bf16": 100.0, "fp8-token": 53.0, "nvfp4": 28.0}.get(fmt, 50.0)

    def _answer(self, text: str) -> tuple[str, str]:
        if text.rstrip().endswith("The pass key is"):
            return "passkey", re.search(r"The pass key is (\d+)", text).group(1)
        key = re.search(r"secret code of ([A-Z][a-z]+ [A-Z][a-z]+)\?", text).group(1)
        code, doc = re.search(rf"The secret code of {key} is (\d+) \(from Document (\d+)\)", text).groups()
        return ("citation", doc) if text.rstrip().endswith("Document") else ("retrieval", code)

    def complete(self, fmt, prompt_ids, max_tokens, probe=None):
        self.calls += 1
        text = self.tok.decode(prompt_ids)
        task, ans = self._answer(text)
        if len(prompt_ids) >= self.wrong.get((fmt, task), 10**9):
            ans = "1" + ans
        best = max((sum(1 for _ in iter_common(p, prompt_ids)) for p in self.seen), default=0)
        reused = min(best, len(prompt_ids) - 1) // self.page_size
        self.seen.append(list(prompt_ids))
        ids = self.tok.encode(ans + ".")[:max_tokens]
        return Answer(tuple(ids), len(prompt_ids), reused), None

    def complete_cold(self, fmt, prompt_ids, max_tokens):
        seen, self.seen = self.seen, []
        try:
            return self.complete(fmt, prompt_ids, max_tokens)[0]
        finally:
            self.seen = seen

    def close(self) -> None:
        pass


def iter_common(a, b):
    for x, y in zip(a, b):
        if x != y:
            return
        yield x


@pytest.fixture()
def oracle(tokenizer):
    return lambda wrong=None: OracleBackend(tokenizer, wrong)


# The small real-model sweep several modules compare against (two formats, two short lengths).
TINY_SWEEP = ["--formats", "nvfp4", "--lengths", "320,384", "--questions", "1", "--prefix-cold", "1",
              "--probe-positions", "8", "--no-progress", "--threads", "1"]


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory):
    """Output directory of TINY_SWEEP run in this process (torch threads restored after)."""
    import torch

    from kvwire.validate.cli import main

    out = tmp_path_factory.mktemp("tiny-sweep")
    before = torch.get_num_threads()
    try:
        assert main(TINY_SWEEP + ["--out", str(out)]) == 0
    finally:
        torch.set_num_threads(before)
    return out
