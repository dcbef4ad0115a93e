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


@pytest.mark.parametrize("kwargs, words", [
    (dict(temperature=float("nan")), ["temperature", "finite", "nan"]),
    (dict(temperature=float("inf")), ["temperature", "finite", "inf"]),
    (dict(temperature=float("-inf")), ["temperature", "-inf"]),
    (dict(top_p=float("nan")), ["top_p", "nan"]),
    (dict(top_p=float("inf")), ["top_p", "inf"]),
    (dict(seed=-1), ["seed", "between 0 and 18446744073709551615", "-1"]),
    (dict(seed=2**64), ["seed", str(2**64)]),
])
def test_params_that_would_fail_mid_request_are_refused(kwargs, words):
    """NaN passes ``temperature < 0``; torch's generator takes no seed outside [0, 2**64)."""
    with pytest.raises(ValueError) as err:
        SamplingParams(temperature=kwargs.pop("temperature", 1.0), **kwargs)
    for w in words:
        assert w in str(err.value)


def test_the_largest_seed_samples():
    logits = torch.randn(500, generator=torch.Generator().manual_seed(0))
    assert 0 <= Sampler(SamplingParams(temperature=1.0, seed=2**64 - 1))(logits) < 500


@pytest.mark.parametrize("temperature", [1e-40, 5e-324])
def test_a_tiny_temperature_is_all_but_greedy(temperature):
    """logits / 1e-40 overflow float32 to +-inf, whose softmax is NaN; the max-shifted logits do not."""
    logits = torch.randn(500, generator=torch.Generator().manual_seed(1)) * 3
    assert Sampler(SamplingParams(temperature=temperature, seed=0))(logits) == int(torch.argmax(logits))
