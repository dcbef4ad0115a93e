"""Two NIXL agents in this process: the CPU their threads take while idle, then transfer latency.

Measures what the progress thread's poll delay costs and saves (docs/benchmarks.md, "NIXL's
progress thread spun a core per worker"). ``--delay-us 0`` keeps the agent as NIXL's Python wrapper
makes it (its thread spins); any other value is ``NixlTransport(progress_delay_us=...)``.
Usage (repository root): .venv/bin/python scripts/nixl_idle_cpu.py [--delay-us N] [--tls tcp]
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import transfer.nixl_transport as nt  # noqa: E402
from tests.transfer.pools import big_format, random_pool, unique  # noqa: E402
from transfer import TransferState  # noqa: E402


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay-us", type=int, default=1000, help="progress-thread poll delay; 0: NIXL's own")
    ap.add_argument("--tls", default="", help="UCX_TLS for both agents, e.g. tcp (default: UCX's choice)")
    ap.add_argument("--idle-s", type=float, default=3.0)
    args = ap.parse_args()
    options: dict = {"ucx_config": {"TLS": args.tls}} if args.tls else {}
    if args.delay_us == 0:
        nt._new_agent = lambda api, name, _delay: api.nixl_agent(name, api.nixl_agent_config(backends=[]))
    else:
        options["progress_delay_us"] = args.delay_us
    fmt = big_format()
    a, b = nt.NixlTransport(unique("a"), **options), nt.NixlTransport(unique("b"), **options)
    a.register_pool(random_pool(fmt, 64, seed=1), fmt)
    b.register_pool(torch.zeros((64, fmt.page_bytes), dtype=torch.uint8), fmt)
    a.add_peer(b.handshake())
    b.add_peer(a.handshake())
    try:
        if a.write_pages(b.name, [0], [0], deadline_s=10).wait(10) is not TransferState.DONE:
            raise RuntimeError("the first transfer did not finish")
        c0, t0 = cpu_s(), time.monotonic()
        time.sleep(args.idle_s)
        idle = (cpu_s() - c0) / (time.monotonic() - t0)
        writes, reads = [], []
        for i in range(200):
            s = time.perf_counter()
            if a.write_pages(b.name, [i % 64], [i % 64], deadline_s=10).wait(10) is not TransferState.DONE:
                raise RuntimeError("a write did not finish")
            writes.append(time.perf_counter() - s)
        for _ in range(50):
            s = time.perf_counter()
            if b.read_pages(a.name, list(range(32)), list(range(32)), deadline_s=10).wait(10) is not TransferState.DONE:
                raise RuntimeError("a read did not finish")
            reads.append(time.perf_counter() - s)
    finally:
        a.close()
        b.close()
    print(f"delay_us={args.delay_us} tls={args.tls or 'default'} idle CPU {100 * idle:.0f}% of a core; "
          f"one-page write median {1e3 * statistics.median(writes):.3f} ms; 32-page read "
          f"({32 * fmt.page_bytes / 1e6:.1f} MB) median {1e3 * statistics.median(reads):.2f} ms")


if __name__ == "__main__":
    main()
