"""Regenerate router/api/ from protos/kvwire/v1/router.proto (needs grpcio-tools, a test extra).

The proto directory is mapped onto the import path ``router/api`` so that the generated gRPC
module imports ``router.api.router_pb2`` (not a top-level ``router_pb2``).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "protos" / "kvwire" / "v1" / "router.proto"
GENERATED = ("router_pb2.py", "router_pb2.pyi", "router_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Write the generated files under ``out_root/router/api/``; returns their paths."""
    (out_root / "router" / "api").mkdir(parents=True, exist_ok=True)
    # protoc runs in its own process: grpc_tools' bundled protobuf in a process that has already
    # loaded the protobuf runtime (and grpc's reflection/health modules) crashed with SIGSEGV.
    args = [sys.executable, "-m", "grpc_tools.protoc", f"--proto_path=router/api={PROTO.parent}",
            f"--python_out={out_root}", f"--grpc_python_out={out_root}", f"--pyi_out={out_root}", str(PROTO)]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"protoc failed on {PROTO}: {done.stderr.strip()}")
    return [out_root / "router" / "api" / name for name in GENERATED]


def main() -> int:
    for path in generate(ROOT):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
