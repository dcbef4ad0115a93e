"""What a NIXL VRAM push between two processes on one GPU spends its time on (issue 4).

    python3 scripts/gpu/transfer_probe.py [--mib 128,512,2048,8192] [--reps 5] [--split 1,4,16]

The parent (sender) and a spawned child (receiver) each register one VRAM pool of random bytes
and exchange handshakes, as `kvwire bench transfer` does. Per size, after one cold transfer:
- copy: same-device torch copy of the same bytes, CUDA events (the ceiling);
- raw: NIXL directly: build descriptors + initialize_xfer (prep), transfer() (post), back-to-back
  check_xfer_state until DONE (done; polls counted), release; the first (cold) one separately;
- repost: the same prepared request posted again (no descriptor work);
- api: NixlTransport.write_pages + TransferHandle.wait, as the workers use it (stats.seconds);
- split K: the same bytes as K descriptors (UCX may spread them over streams).
UCX_PROTO_INFO=y in the environment prints UCX's protocol choice for each new case.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time

import numpy as np
import torch

from kvwire.formats import KVFormat, PageFormat

# One "page" per MiB makes sizes exact; the format only labels the pools.
FMT = PageFormat(KVFormat.parse("bf16"), page_size=16, num_layers=32, num_kv_heads=8, head_dim=64)
assert FMT.page_bytes == 2**20, FMT.page_bytes


DEVICE = os.environ.get("PROBE_DEVICE", "cuda")   # cpu: a DRAM smoke test of this script


def _pool(num_pages: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randint(0, 256, (num_pages, FMT.page_bytes), dtype=torch.uint8, device=DEVICE, generator=g)


def _serve(conn, num_pages: int) -> None:
    from transfer.handshake import decode_handshake
    from transfer.nixl_transport import NixlTransport
    t = NixlTransport("probe-receiver")
    t.register_pool(_pool(num_pages, 2), FMT)
    conn.send(t.handshake().encode())
    t.add_peer(decode_handshake(conn.recv()))
    conn.recv()
    t.close()


def _raw(t, peer: str, pages: int, split: int):
    """One transfer through NIXL directly: (prep, post, done, release) seconds, polls, xfer."""
    agent, storage, pool = t._agent, t.storage, t._peers[peer]
    size = pages * FMT.page_bytes
    step = size // split
    t0 = time.perf_counter()
    mem = "VRAM" if storage.is_cuda else "DRAM"
    local = np.array([(storage.data_ptr() + i * step, step, 0) for i in range(split)], dtype=np.uint64)
    remote = np.array([(pool.page_address(0) + i * step, step, pool.device_id) for i in range(split)], dtype=np.uint64)
    xfer = agent.initialize_xfer("WRITE", agent.get_xfer_descs(local, mem), agent.get_xfer_descs(remote, mem),
                                 peer, backends=["UCX"])
    t1 = time.perf_counter()
    status = agent.transfer(xfer)
    t2 = time.perf_counter()
    polls = 0
    while status == "PROC":
        status = agent.check_xfer_state(xfer)
        polls += 1
    t3 = time.perf_counter()
    assert status == "DONE", status
    return (t1 - t0, t2 - t1, t3 - t2), polls, xfer


def _repost(t, xfer) -> float:
    agent = t._agent
    t0 = time.perf_counter()
    status = agent.transfer(xfer)
    while status == "PROC":
        status = agent.check_xfer_state(xfer)
    assert status == "DONE", status
    return time.perf_counter() - t0


def _copy(pages: int, src: torch.Tensor, dst: torch.Tensor, reps: int) -> float:
    a, b = src[:pages], dst[:pages]
    b.copy_(a)
    times = []
    for _ in range(reps):
        if not a.is_cuda:
            t0 = time.perf_counter()
            b.copy_(a)
            times.append(time.perf_counter() - t0)
            continue
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", default="128,512,2048,8192")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--split", default="1,4,16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sizes = [int(x) for x in args.mib.split(",")]
    splits = [int(x) for x in args.split.split(",")]
    from transfer.handshake import decode_handshake
    from transfer.nixl_transport import NixlTransport
    num_pages = max(sizes)
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_serve, args=(there, num_pages), daemon=True)
    child.start()
    t = NixlTransport("probe-sender")
    t.register_pool(_pool(num_pages, 1), FMT)
    dst = torch.empty_like(t.storage)
    peer = t.add_peer(decode_handshake(here.recv()))
    here.send(t.handshake().encode())
    rows = []
    try:
        for mib in sizes:
            gb = mib * 2**20 / 1e9
            row = {"mib": mib, "copy_ms": _copy(mib, t.storage, dst, args.reps) * 1e3}
            cold, polls, xfer = _raw(t, peer, mib, 1)
            t._agent.release_xfer_handle(xfer)
            row["cold_ms"] = [round(x * 1e3, 3) for x in cold]
            for k in splits:
                parts, reps_polls = [], []
                for _ in range(args.reps):
                    p, polls, xfer = _raw(t, peer, mib, k)
                    t._agent.release_xfer_handle(xfer)
                    parts.append(p)
                    reps_polls.append(polls)
                med = [statistics.median(x[i] for x in parts) * 1e3 for i in range(3)]
                row[f"raw{k}_prep_post_done_ms"] = [round(x, 3) for x in med]
                row[f"raw{k}_polls"] = statistics.median(reps_polls)
                row[f"raw{k}_gb_s"] = gb / (sum(med) / 1e3)
            _p, _n, xfer = _raw(t, peer, mib, 1)
            row["repost_ms"] = statistics.median(_repost(t, xfer) for _ in range(args.reps)) * 1e3
            t._agent.release_xfer_handle(xfer)
            api = []
            ids = list(range(mib))
            for _ in range(args.reps):
                h = t.write_pages(peer, ids, ids, deadline_s=60)
                assert h.wait(60).value == "done", h.error
                api.append(h.stats.seconds)
            row["api_ms"] = statistics.median(api) * 1e3
            row["copy_gb_s"] = gb / (row["copy_ms"] / 1e3)
            row["api_vs_copy"] = row["copy_ms"] / row["api_ms"]
            row["raw1_vs_copy"] = row["copy_ms"] / sum(row["raw1_prep_post_done_ms"])
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        here.send("stop")
        child.join(60)
        t.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
