"""Shared fixtures. The real SmolLM2 model takes seconds to load, so it is loaded once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2():
    """(LlamaModel, Tokenizer) for the packaged SmolLM2-135M-Instruct GGUF, float32 on the CPU."""
    from kvwire.model import load_model

    return load_model("smollm2", dtype=None, device="cpu")
