"""Run the sweep: every (format, context length) cell, one format at a time, saved as it goes.

What a cell costs is mostly prefill, so the order is chosen to let the prefix cache do real
work without changing any answer (warm equals cold is itself measured): formats run bf16 first
(fidelity references), lengths longest first, passkey depths deepest first, so a shallower
passkey prompt re-uses the filler pages of a deeper one; every haystack question after the
first re-uses the context's pages. Answers are greedy and just long enough to see the number
end (its digits plus one token).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from kvwire.validate.backends import Answer, Backend
from kvwire.validate.config import BASELINE, PASSKEY_DEPTHS, SweepConfig, Task
from kvwire.validate.probe import ProbeResult, compare, probe_positions
from kvwire.validate.prompts import first_number, make_haystack, make_passkey
from kvwire.validate.results import ResultStore


def answer_tokens(answer: str) -> int:
    """One token per digit (SmolLM2 splits digits; the prompt ends with the space), one more to
    see that the number ends there (exact match, not prefix match)."""
    return len(answer) + 1


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class CellRun:
    """The work of one cell; ``items`` keeps every prompt's outcome for the JSON."""

    config: SweepConfig
    backend: Backend
    tokenizer: object
    fmt: str
    length: int
    refs: dict
    items: list[dict] = field(default_factory=list)
    prefix: dict = field(default_factory=lambda: {"compared": 0, "identical": 0, "first_ask_cold": True,
                                                  "reused_pages": 0, "reusable_pages": 0})
    fidelity: list[dict] = field(default_factory=list)
    on_ask: object = None          # called with a short note before each request (progress bar)

    def ask(self, task: Task, sample: int, ids: list[int], expected: str, probe: list[int] | None = None,
            **extra) -> tuple[Answer, ProbeResult | None]:
        if self.on_ask:
            self.on_ask(f"{task.value} {len(self.items) + 1}, {len(ids)} tok")
        answer, result = self.backend.complete(self.fmt, ids, answer_tokens(expected), probe=probe)
        text = self.tokenizer.decode(list(answer.token_ids))
        self.items.append({"task": task.value, "sample": sample, **extra, "expected": expected,
                           "got": first_number(text), "text": text, "correct": first_number(text) == expected,
                           "prompt_tokens": answer.prompt_tokens, "reused_pages": answer.prefix_pages_reused})
        return answer, result

    def passkey(self, sample: int, seed: str) -> None:
        for depth in sorted(PASSKEY_DEPTHS, reverse=True):
            p = make_passkey(self.tokenizer, self.length, depth, seed)
            self.ask(Task.PASSKEY, sample, self.tokenizer.encode(p.text), p.passkey, depth=depth)

    def haystack(self, sample: int, seed: str) -> None:
        tok, cfg = self.tokenizer, self.config
        hay = make_haystack(tok, self.length, cfg.questions, seed)
        prompts = [tok.encode(hay.context + q.suffix) for q in hay.questions]
        probe = None
        if self.backend.supports_probe:
            probe = probe_positions(len(tok.encode(hay.context)), cfg.probe_positions, cfg.page_size)
        first, result = self.ask(hay.questions[0].task, sample, prompts[0], hay.questions[0].answer, probe, question=0)
        self.prefix["first_ask_cold"] &= first.prefix_pages_reused == 0
        if result is not None:
            self._fidelity(sample, result)
        warm: dict[int, Answer] = {}
        for i, (q, ids) in enumerate(zip(hay.questions[1:], prompts[1:]), start=1):
            warm[i], _ = self.ask(q.task, sample, ids, q.answer, question=i)
        # Prefix reuse: the first question again, now warm, against its cold first answer; then
        # more questions against cold answers computed on demand where the backend can.
        again, _ = self.ask(Task.PREFIX, sample, prompts[0], hay.questions[0].answer, question=0)
        warm[0] = again
        self._compare(first, again)
        for i in range(1, cfg.prefix_cold if self.backend.supports_cold else 1):
            q = hay.questions[i]
            cold = self.backend.complete_cold(self.fmt, prompts[i], answer_tokens(q.answer))
            self._compare(cold, warm[i])
        # Reusable: whole pages a warm prompt shares with any prompt asked before it (the engine
        # keeps at least one prompt token to run, hence len - 1).
        p, asked = cfg.page_size, [prompts[0]]
        for i in list(range(1, len(prompts))) + [0]:
            shared = max(common_prefix(prompts[i], earlier) for earlier in asked)
            self.prefix["reused_pages"] += warm[i].prefix_pages_reused
            self.prefix["reusable_pages"] += min(shared, len(prompts[i]) - 1) // p
            asked.append(prompts[i])

    def _compare(self, cold: Answer, warm: Answer) -> None:
        self.prefix["compared"] += 1
        self.prefix["identical"] += int(cold.token_ids == warm.token_ids)

    def _fidelity(self, sample: int, result: ProbeResult) -> None:
        key = (self.length, sample)
        if self.fmt == BASELINE:
            self.refs[key] = result
        ref = self.refs.get(key)
        if ref is None:
            return                       # the caller computes missing references before the cell
        self.fidelity.append(compare(ref, result))

    def run(self) -> dict:
        start = time.perf_counter()
        for s in range(self.config.samples):
            seed = f"{self.config.seed}:{self.length}:{s}"
            self.passkey(s, seed)
            self.haystack(s, seed)
        return self.summary(time.perf_counter() - start)

    def summary(self, seconds: float) -> dict:
        counts = {}
        for task in (Task.PASSKEY, Task.RETRIEVAL, Task.CITATION):
            got = [it["correct"] for it in self.items if it["task"] == task.value]
            counts[task.value] = [sum(got), len(got)]
        pf = self.prefix
        counts[Task.PREFIX.value] = [pf["identical"], pf["compared"]]
        pf["reuse_rate"] = round(pf["reused_pages"] / pf["reusable_pages"], 4) if pf["reusable_pages"] else None
        return {"format": self.fmt, "length": self.length, "seconds": round(seconds, 1),
                "accuracy": {k: (c / n if n else None) for k, (c, n) in counts.items()}, "counts": counts,
                "prefix": pf, "fidelity": _mean_fidelity(self.fidelity), "items": self.items}


def _mean_fidelity(runs: list[dict]) -> dict | None:
    if not runs:
        return None
    out = {k: sum(r[k] for r in runs) / len(runs) for k in ("kl_mean", "top1_agreement", "attn_top1_agreement")}
    out["kl_max"] = max(r["kl_max"] for r in runs)
    layers = len(runs[0]["attn_top1_per_layer"])
    out["attn_top1_per_layer"] = [round(sum(r["attn_top1_per_layer"][i] for r in runs) / len(runs), 4)
                                  for i in range(layers)]
    out["positions"] = sum(r["positions"] for r in runs)
    return out


def _reference(config: SweepConfig, backend: Backend, tokenizer, length: int, refs: dict) -> None:
    """bf16 probe results for ``length`` when its bf16 cell finished in an earlier run."""
    for s in range(config.samples):
        if (length, s) in refs:
            continue
        hay = make_haystack(tokenizer, length, config.questions, f"{config.seed}:{length}:{s}")
        ids = tokenizer.encode(hay.context + hay.questions[0].suffix)
        pos = probe_positions(len(tokenizer.encode(hay.context)), config.probe_positions, config.page_size)
        backend.open_format(BASELINE)
        try:
            _, refs[(length, s)] = backend.complete(BASELINE, ids, 1, probe=pos)
        finally:
            backend.close_format(BASELINE)


def run_sweep(config: SweepConfig, backend: Backend, tokenizer, store: ResultStore,
              progress: bool = True) -> None:
    """Run every cell the store lacks; each is saved as soon as it finishes."""
    from tqdm import tqdm

    cells = [(f, n) for f in config.formats for n in sorted(config.lengths, reverse=True)]
    todo = [c for c in cells if not store.has(*c)]
    bf16_bpt = backend.bytes_per_token(BASELINE)
    refs: dict = {}
    bar = tqdm(total=len(cells), initial=len(cells) - len(todo), unit="cell", disable=not progress,
               file=sys.stderr, dynamic_ncols=True, mininterval=1.0)
    try:
        for fmt in config.formats:
            mine = [n for f, n in todo if f == fmt]
            if not mine:
                continue
            if backend.supports_probe and fmt != BASELINE:
                for n in mine:
                    bar.set_description(f"bf16 reference @{n}")
                    _reference(config, backend, tokenizer, n, refs)
            backend.open_format(fmt)
            try:
                store.set_format(fmt, backend.bytes_per_token(fmt), bf16_bpt)
                for n in mine:
                    bar.set_description(f"{fmt} @{n}")
                    cell = CellRun(config, backend, tokenizer, fmt, n, refs,
                                   on_ask=lambda note: bar.set_postfix_str(note, refresh=True)).run()
                    store.put(fmt, n, cell)
                    bar.update(1)
            finally:
                backend.close_format(fmt)
    finally:
        bar.close()
