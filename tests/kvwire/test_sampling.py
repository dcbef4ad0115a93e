"""sample_rows (a decode step's tokens: greedy rows by one argmax on the logits' device, the others
on the host) picks exactly what each row's own sampler picks."""
import pytest
import torch

from kvwire.sampling import Sampler, SamplingParams, sample_rows

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def samplers(kinds: str) -> list[Sampler]:
    """g: greedy; t: temperature 0.8; p: temperature 1.2 with top-p 0.9 (seeded by position)."""
    params = {"g": dict(), "t": dict(temperature=0.8), "p": dict(temperature=1.2, top_p=0.9)}
    return [Sampler(SamplingParams(seed=i, **params[k])) for i, k in enumerate(kinds)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kinds", ["g", "gggg", "tpt", "gtgpg", "pggg"])
def test_rows_sample_as_their_own_samplers(device, kinds):
    gen = torch.Generator().manual_seed(len(kinds))
    logits = torch.randn((len(kinds), 500), generator=gen) * 3
    logits[0, 17] = logits[0, 400] = logits[0].max() + 1          # a tie: the first index wins everywhere
    want = [s(row) for s, row in zip(samplers(kinds), logits)]
    got = sample_rows(samplers(kinds), logits.to(device))
    assert got == want
    if kinds[0] == "g":
        assert got[0] == 17
