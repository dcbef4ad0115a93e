"""An in-process sweep split over several worker processes (``--jobs N``), formats dealt out in turn.

Why processes and not threads: on the shared 2-core development machine one torch process with
two threads ran a cell about 15x slower than with one thread (the threads spin waiting for each
other when the cores are busy), so the fast way to use both cores is two single-threaded
processes. Each worker loads the model, runs its formats' cells with ``run_sweep`` and sends
each finished cell to this process, which alone writes the results file and draws the progress
bar. A worker without bf16 recomputes the bf16 fidelity references it needs (one cold prefill
per length); answers do not depend on which worker ran a cell.
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import queue
import sys
import threading
import time
import traceback

from kvwire.validate.config import SweepConfig
from kvwire.validate.results import ResultStore


class _QueueStore:
    """What ``run_sweep`` needs of a store, forwarding writes to the parent."""

    def __init__(self, mine: set[str], done: set[tuple[str, int]], out) -> None:
        self.mine, self.done, self.out = mine, done, out

    def has(self, fmt: str, length: int) -> bool:
        return fmt not in self.mine or (fmt, length) in self.done

    def put(self, fmt: str, length: int, cell: dict) -> None:
        self.out.put(("cell", fmt, length, cell))

    def set_format(self, fmt: str, bytes_per_token: float, bf16_bytes_per_token: float) -> None:
        self.out.put(("format", fmt, bytes_per_token, bf16_bytes_per_token))


def _exit_with_parent(parent: int) -> None:
    """A killed parent (SIGTERM, OOM) cannot stop its workers itself; they notice and exit."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _worker(config: SweepConfig, model_source: str, device: str, threads: int, formats: list[str],
            done: set[tuple[str, int]], out, parent: int) -> None:
    _exit_with_parent(parent)
    try:
        import torch

        from kvwire.commands.model_args import resolve_device
        from kvwire.model.registry import load_model
        from kvwire.validate.backends import InProcessBackend
        from kvwire.validate.sweep import run_sweep

        torch.set_num_threads(threads)
        model, tok = load_model(model_source, device=resolve_device(device))
        backend = InProcessBackend(model, tok, config.page_size, config.chunk_size)
        run_sweep(dataclasses.replace(config, formats=tuple(formats)), backend, tok,
                  _QueueStore(set(formats), done, out), progress=False)
        out.put(("done",))
    except BaseException:  # everything goes back to the parent, which stops the sweep
        out.put(("error", traceback.format_exc()))


def deal(formats: tuple[str, ...], jobs: int) -> list[list[str]]:
    """Formats in turn to each job (bf16 first, to job 0); empty jobs dropped."""
    hands = [list(formats[i::jobs]) for i in range(jobs)]
    return [h for h in hands if h]


def run_parallel(config: SweepConfig, store: ResultStore, jobs: int, model_source: str, device: str,
                 threads: int = 1, progress: bool = True) -> None:
    from tqdm import tqdm

    cells = [(f, n) for f in config.formats for n in config.lengths]
    done = {c for c in cells if store.has(*c)}
    todo = tuple(f for f in config.formats if any((f, n) not in done for n in config.lengths))
    hands = deal(todo, jobs)
    ctx = mp.get_context("spawn")        # no fork after torch has started threads
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(config, model_source, device, threads, hand, done, out, os.getpid()),
                         daemon=True)
             for hand in hands]
    bar = tqdm(total=len(cells), initial=len(done), unit="cell", disable=not progress, file=sys.stderr,
               dynamic_ncols=True, desc=f"{len(procs)} workers")
    for p in procs:
        p.start()
    running = len(procs)
    try:
        while running:
            try:
                msg = out.get(timeout=5)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    raise RuntimeError("the sweep's workers exited without finishing (killed? out of memory?)")
                continue
            if msg[0] == "cell":
                store.put(msg[1], msg[2], msg[3])
                bar.set_postfix_str(f"{msg[1]} @{msg[2]} done", refresh=False)
                bar.update(1)
            elif msg[0] == "format":
                store.set_format(*msg[1:])
            elif msg[0] == "done":
                running -= 1
            else:
                raise RuntimeError(f"a sweep worker failed:\n{msg[1]}")
    finally:
        bar.close()
        for p in procs:
            if running:            # stopped early (a failure, Ctrl-C): do not wait for the others
                p.terminate()
            p.join(timeout=30)     # finished workers exit on their own, running their finalizers
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        out.close()            # release the queue's feeder thread and semaphores with the workers
        out.join_thread()
