"""Fixtures shared by the transfer tests."""
from __future__ import annotations

import pytest

from kvwire.formats import PageFormat
from tests.transfer.pools import small_format


@pytest.fixture
def fmt() -> PageFormat:
    return small_format()
