"""RouterClient.request refuses, with the field and its range, what the request message cannot carry."""
from __future__ import annotations

import pytest

from router.client import RouterClient


@pytest.mark.parametrize("kwargs, words", [
    (dict(max_tokens=-1), ["max_tokens", "between 1 and 4294967295", "-1"]),
    (dict(max_tokens=0), ["max_tokens", "between 1 and 4294967295", "got 0"]),
    (dict(max_tokens=2**32), ["max_tokens", str(2**32)]),
    (dict(seed=-1), ["seed", "between 0 and 18446744073709551615", "-1"]),
    (dict(seed=2**64), ["seed", str(2**64)]),
])
def test_out_of_range_values_name_the_field(kwargs, words):
    with pytest.raises(ValueError) as err:
        RouterClient.request("hi", **kwargs)
    for w in words:
        assert w in str(err.value)


def test_the_limits_themselves_go_through():
    req = RouterClient.request("hi", max_tokens=2**32 - 1, seed=2**64 - 1)
    assert req.max_tokens == 2**32 - 1 and req.seed == 2**64 - 1
    assert RouterClient.request("hi", seed=0).HasField("seed")
    assert not RouterClient.request("hi").HasField("seed") and RouterClient.request("hi").max_tokens == 64
