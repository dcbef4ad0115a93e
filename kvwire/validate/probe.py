"""Fidelity against bf16 from inside one cold engine request: next-token distributions and
which key each attention head picks, layer by layer.

These need model internals (logits at every position, queries, keys as stored), which only the
in-process engine exposes; through the router only the recall tasks run. The probe rides along
on a request the sweep makes anyway (the first, cold question of a haystack), so it costs no
extra prefill: ``ProbedModel`` wraps the model the engine runs and, while a ``Recorder`` is
armed, asks the model for extra logit rows and keeps the queries and new keys it sees.

Attention top-1 follows the engine's page-causal rule: a query at position p scores the keys
of full pages before its own page as stored (read back from the page pool, quantised) and its
own page's keys up to p in bf16.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvwire.page_pool import page_chain_hashes


def probe_positions(context_tokens: int, count: int, page_size: int) -> list[int]:
    """``count`` positions spread evenly over the context, skipping its first page."""
    lo, hi = page_size, context_tokens - 1
    if hi <= lo:
        raise ValueError(f"a {context_tokens}-token context is too short to probe")
    count = min(count, hi - lo + 1)
    if count == 1:
        return [hi]
    return sorted({lo + round(i * (hi - lo) / (count - 1)) for i in range(count)})


@dataclass
class ProbeResult:
    positions: list[int]
    logprobs: torch.Tensor    # [positions, vocab] float32 log-softmax of the next-token logits
    attn_top1: torch.Tensor   # [layers, positions, query heads] int64: index of the top key


class Recorder:
    """Collects logits rows, queries and keys during one request's forwards."""

    def __init__(self, positions: list[int], num_layers: int) -> None:
        self.positions = sorted(positions)
        self._wanted = set(self.positions)
        self.logprobs: dict[int, torch.Tensor] = {}
        self.q: list[dict[int, torch.Tensor]] = [{} for _ in range(num_layers)]
        self.k: list[dict[int, torch.Tensor]] = [{} for _ in range(num_layers)]   # chunk start -> keys

    def forward(self, model, ids: torch.Tensor, pos: torch.Tensor, attn, logits_indices):
        plist = pos.tolist()
        if plist != list(range(plist[0], plist[0] + len(plist))):
            raise RuntimeError("the probe follows one sequence at a time (contiguous positions)")
        rows = [r for r, p in enumerate(plist) if p in self._wanted]

        def recording_attn(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = attn(layer, q, k, v)
            self.k[layer][plist[0]] = k.to(torch.bfloat16)
            for r in rows:
                self.q[layer][plist[r]] = q[r].float().clone()
            return out

        base = (torch.arange(len(plist), device=ids.device) if logits_indices is None
                else logits_indices.to(ids.device))
        extra = torch.tensor(rows, dtype=base.dtype, device=ids.device)
        logits = model(ids, pos, recording_attn, logits_indices=torch.cat((base, extra)))
        n = base.shape[0]
        for j, r in enumerate(rows):
            self.logprobs[plist[r]] = torch.log_softmax(logits[n + j].float(), dim=-1).cpu()
        return logits[:n]

    def keys_bf16(self, layer: int) -> torch.Tensor:
        """Every key this request computed for ``layer``, in position order, [T, Hkv, D] float32."""
        starts = sorted(self.k[layer])
        out, expect = [], 0
        for s in starts:
            if s != expect:
                raise RuntimeError(f"positions {expect}..{s - 1} were not computed in this request "
                                   "(prefix-cache hit): the probe needs a cold request")
            out.append(self.k[layer][s].float())
            expect = s + out[-1].shape[0]
        return torch.cat(out)

    def result(self, engine, prompt_ids: list[int]) -> ProbeResult:
        missing = [p for p in self.positions if p not in self.logprobs]
        if missing:
            raise RuntimeError(f"no logits recorded at {len(missing)} probe positions (first {missing[0]}): "
                               "the probe needs a cold request")
        return ProbeResult(self.positions, torch.stack([self.logprobs[p] for p in self.positions]),
                           self._attention_top1(engine, prompt_ids))

    def _attention_top1(self, engine, prompt_ids: list[int]) -> torch.Tensor:
        kv, fmt = engine.kv, engine.page_format
        p = fmt.page_size
        need = max(self.positions) // p
        hashes = page_chain_hashes(fmt.hash, prompt_ids, p)[:need]
        pages = kv.pool.acquire_prefix(hashes)
        try:
            if len(pages) < need:
                raise RuntimeError(f"only {len(pages)} of the prompt's {need} pages are still cached; "
                                   "give the engine more pages")
            pos = torch.tensor(self.positions)
            own = pos // p * p                                            # first token of each query's page
            t = torch.arange(int(pos.max()) + 1)
            from_pool = t[None, :] < own[:, None]                         # [P, T]: stored keys
            visible = t[None, :] <= pos[:, None]
            tops = []
            for layer in range(fmt.num_layers):
                stored = kv.read_pages(layer, 0, pages).cpu()             # [need * P, Hkv, D]
                fresh = self.keys_bf16(layer)[:len(t)].cpu()
                stored = torch.cat((stored, fresh[len(stored):]))         # past the pool: unused rows
                q = torch.stack([self.q[layer][x] for x in self.positions]).cpu()   # [P, Hq, D]
                hkv = stored.shape[1]
                qg = q.view(len(pos), hkv, q.shape[1] // hkv, q.shape[2])
                s_pool = torch.einsum("phgd,thd->phgt", qg, stored[:len(t)])
                s_fresh = torch.einsum("phgd,thd->phgt", qg, fresh)
                scores = torch.where(from_pool[:, None, None, :], s_pool, s_fresh)
                scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
                tops.append(scores.argmax(dim=-1).reshape(len(pos), -1))  # [P, Hq]
            return torch.stack(tops)
        finally:
            kv.pool.release(pages)


class ProbedModel:
    """The engine's model, unchanged unless ``recorder`` is set (one request at a time)."""

    def __init__(self, model) -> None:
        self.inner = model
        self.config = model.config
        self.recorder: Recorder | None = None

    @property
    def device(self) -> torch.device:
        return self.inner.device

    @property
    def dtype(self) -> torch.dtype:
        return self.inner.dtype

    def __call__(self, ids, pos, attn, logits_indices=None):
        if self.recorder is None:
            return self.inner(ids, pos, attn, logits_indices=logits_indices)
        return self.recorder.forward(self.inner, ids, pos, attn, logits_indices)


def compare(ref: ProbeResult, got: ProbeResult) -> dict:
    """KL(bf16 || format) and top-1 agreement of the next token, attention top-1 agreement per layer."""
    if ref.positions != got.positions:
        raise ValueError("fidelity compares the same probe positions; the prompts differ")
    kl = (ref.logprobs.exp() * (ref.logprobs - got.logprobs)).sum(-1).clamp(min=0)
    top1 = (ref.logprobs.argmax(-1) == got.logprobs.argmax(-1)).float()
    per_layer = (ref.attn_top1 == got.attn_top1).float().mean(dim=(1, 2))
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "top1_agreement": float(top1.mean()),
            "attn_top1_agreement": float(per_layer.mean()),
            "attn_top1_per_layer": [round(float(x), 4) for x in per_layer],
            "positions": len(ref.positions)}
