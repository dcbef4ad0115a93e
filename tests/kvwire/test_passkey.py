"""Passkey in ~2,000 tokens of filler, on compact pages of every format.

EXPECTED records which formats pass (3 depths, one seed) as measured; a change either way fails
the test so the record stays true.
"""
import pytest

from kvwire.calibration import CALIBRATION_TEXT
from kvwire.engine import Engine, EngineConfig
from kvwire.sampling import SamplingParams
from kvwire.tasks.passkey import make_passkey_prompt

pytestmark = pytest.mark.slow

EXPECTED = {
    "bf16": 3, "fp8-tensor": 3, "fp8-head": 3, "fp8-page": 3, "fp8-token": 3,
    "nvfp4": 3, "fp8-token/nvfp4": 3,
}


@pytest.mark.parametrize("fmt", list(EXPECTED))
def test_passkey_2k(smollm2, fmt):
    model, tok = smollm2
    engine = Engine(model, EngineConfig(kv_format=fmt), calibration_ids=tok.encode(CALIBRATION_TEXT))
    found = []
    for depth in (0.1, 0.5, 0.9):
        p = make_passkey_prompt(tok, 2000, depth, seed=0)
        ids = tok.encode(p.text)
        assert 1900 <= len(ids) <= 2100
        out = tok.decode(list(engine.generate(ids, SamplingParams(max_tokens=8))))
        found.append(p.passkey in out)
    print(f"passkey 2k {fmt}: {sum(found)}/3 {found}")
    assert sum(found) == EXPECTED[fmt], found
