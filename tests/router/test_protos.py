"""The committed generated code in router/api/ must match protos/kvwire/v1/router.proto."""
from __future__ import annotations

import pytest

from router.api import regenerate


def test_generated_code_is_current(tmp_path):
    pytest.importorskip("grpc_tools")
    fresh = regenerate.generate(tmp_path)
    for path in fresh:
        committed = regenerate.ROOT / "router" / "api" / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"router/api/{path.name} is stale: run `python -m router.api.regenerate` and commit")


def test_stale_code_is_detected(tmp_path, monkeypatch):
    """Regenerating from an edited proto gives different code, so the check above can fail."""
    pytest.importorskip("grpc_tools")
    edited = tmp_path / "proto" / "router.proto"
    edited.parent.mkdir()
    edited.write_text(regenerate.PROTO.read_text().replace("bool chat = 9;", "bool chat = 9;\n  bool extra = 99;"))
    monkeypatch.setattr(regenerate, "PROTO", edited)
    fresh = regenerate.generate(tmp_path / "out")
    pb2 = [p for p in fresh if p.name == "router_pb2.py"][0]
    assert pb2.read_bytes() != (regenerate.ROOT / "router" / "api" / "router_pb2.py").read_bytes()
