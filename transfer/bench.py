"""Push vs pull throughput of the NIXL transport between two processes on this host.

    python -m transfer.bench [--pages 8,64,512] [--reps 5] [--links default,tcp] [--stride 1] [--device cpu]

The parent and a spawned child each register a pool (DRAM, or VRAM with ``--device cuda``) of
SmolLM2-shaped fp8-token/nvfp4 pages (~147 KiB each) and exchange handshakes over a pipe. The
parent then times, per size, ``reps`` WRITEs into the child (push: prefill's side of the protocol)
and READs from it (pull: decode's side), from issue to DONE as the handle's stats report it, and
prints the median. ``default`` lets UCX pick (CMA zero-copy between processes on one host);
``tcp`` forces UCX onto TCP, the no-RDMA path on which pull is reported to collapse.
``--stride 2`` pairs every other page: one descriptor per page.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
from multiprocessing.connection import Connection

import torch

from kvwire.formats import KVFormat, PageFormat
from transfer.handshake import decode_handshake

FORMAT = PageFormat(KVFormat.parse("fp8-token/nvfp4"), page_size=16, num_layers=30, num_kv_heads=3, head_dim=64)
UCX = {"default": None, "tcp": {"TLS": "tcp"}}


def _make(name: str, link: str, num_pages: int, seed: int, device: str):
    from transfer.nixl_transport import NixlTransport
    t = NixlTransport(name, ucx_config=UCX[link])
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randint(0, 256, (num_pages, FORMAT.page_bytes), dtype=torch.uint8, generator=gen)
    t.register_pool(pool.to(device), FORMAT)
    return t


def _serve(conn: Connection, link: str, num_pages: int, device: str) -> None:
    """The passive side: hold a registered pool until told to stop (transfers are one-sided)."""
    t = _make(f"bench-child-{link}", link, num_pages, seed=2, device=device)
    conn.send(t.handshake().encode())
    t.add_peer(decode_handshake(conn.recv()))
    conn.recv()  # blocks until the parent is done
    t.close()


def _measure(t, peer: str, op: str, local: list[int], remote: list[int], reps: int) -> tuple[float, int]:
    times = []
    for _ in range(reps):
        if op == "push":
            h = t.write_pages(peer, local, remote, deadline_s=120)
        else:
            h = t.read_pages(peer, remote, local, deadline_s=120)
        state = h.wait(120)
        if state.value != "done":
            raise RuntimeError(f"{op} of {len(local)} pages ended {state.value}: {h.error}")
        times.append(h.stats.seconds)
    return statistics.median(times), h.stats.num_descriptors


def run(pages: list[int], reps: int, links: list[str], stride: int, device: str = "cpu") -> list[dict]:
    num_pages = max(pages) * stride
    rows = []
    ctx = mp.get_context("spawn")
    for link in links:
        parent_end, child_end = ctx.Pipe()
        child = ctx.Process(target=_serve, args=(child_end, link, num_pages, device), daemon=True)
        child.start()
        t = _make(f"bench-parent-{link}", link, num_pages, seed=1, device=device)
        try:
            peer = t.add_peer(decode_handshake(parent_end.recv()))
            parent_end.send(t.handshake().encode())
            for n in pages:
                ids = list(range(0, n * stride, stride))
                _measure(t, peer, "push", ids, ids, 1)  # warm-up: connection setup, page faults
                for op in ("push", "pull"):
                    seconds, descriptors = _measure(t, peer, op, ids, ids, reps)
                    nbytes = n * FORMAT.page_bytes
                    rows.append({"link": link, "op": op, "pages": n, "mib": nbytes / 2**20,
                                 "descriptors": descriptors, "ms": seconds * 1e3, "gb_s": nbytes / seconds / 1e9})
        finally:
            parent_end.send("stop")
            child.join(60)
            t.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", default="8,64,512", help="transfer sizes in pages (comma-separated)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--links", default="default,tcp", help=f"comma-separated, of {', '.join(UCX)}")
    ap.add_argument("--stride", type=int, default=1, help="1: contiguous (one descriptor); 2: one per page")
    ap.add_argument("--device", default="cpu", help="where both pools live: cpu (DRAM) or cuda (VRAM)")
    args = ap.parse_args()
    rows = run([int(p) for p in args.pages.split(",")], args.reps, args.links.split(","), args.stride, args.device)
    print(f"page = {FORMAT.page_bytes} B ({FORMAT.name}, {FORMAT.page_size} tokens) on {args.device}; "
          f"median of {args.reps}")
    print(f"{'link':8} {'op':5} {'pages':>6} {'MiB':>8} {'descr':>6} {'ms':>9} {'GB/s':>7}")
    for r in rows:
        print(f"{r['link']:8} {r['op']:5} {r['pages']:6d} {r['mib']:8.1f} {r['descriptors']:6d} "
              f"{r['ms']:9.2f} {r['gb_s']:7.2f}")


if __name__ == "__main__":
    main()
