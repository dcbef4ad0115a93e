"""Token sampling: greedy, temperature and nucleus (top-p), reproducible with a seed."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MAX_SEED = 2**64 - 1      # torch.Generator.manual_seed's (and the router proto's uint64) largest seed


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0      # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        """Refuse here what would otherwise fail inside a worker mid-request: NaN passes ``< 0``, so the
        temperature must be finite (top_p's range test already fails NaN and inf), and the seed must fit
        torch's generator."""
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must be between 0 and {MAX_SEED}, got {self.seed}")


_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = 2**64 - 1


def _splitmix64(x: int) -> int:
    z = (x + _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def token_seed(seed: int, index: int) -> int:
    """The generator seed for a request's ``index``-th completion token: splitmix64 of the mixed
    seed and the index (mixing the seed first, so seeds s and s + k never share draws shifted by
    tokens).

    A seeded request's draws depend on (seed, index) alone, not on one generator's running state:
    the prefill worker samples token 0 and a decode worker, in another process, the rest, and a
    request gives the same tokens there as in the single-process engine. (Two generators seeded
    alike used to make token 1 reuse token 0's draw; since that fix, 2026-12-07, a seed gives
    other tokens than it did before.)
    """
    return _splitmix64(_splitmix64(seed) ^ index)


class Sampler:
    """Samples a request's completion tokens, one call each, from float32 logits [vocab].

    ``first_index`` is the completion index of the first token this sampler draws: 0 where it
    samples from the first token on, 1 on a decode worker continuing after prefill's token.
    """

    def __init__(self, params: SamplingParams, first_index: int = 0) -> None:
        self.params = params
        self.index = first_index
        self.generator = torch.Generator()
        if params.seed is None:
            self.generator.seed()

    def __call__(self, logits: torch.Tensor) -> int:
        p = self.params
        if p.seed is not None:
            self.generator.manual_seed(token_seed(p.seed, self.index))
        self.index += 1
        if p.temperature == 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(_scaled(logits.float().cpu(), p.temperature), dim=-1)
        if p.top_p < 1:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < p.top_p
            sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
            return int(order[torch.multinomial(sorted_p, 1, generator=self.generator)])
        return int(torch.multinomial(probs, 1, generator=self.generator))


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature`` shifted so the largest is 0 (softmax is unchanged by the shift). A tiny
    temperature then sends the others to -inf rather than every logit to +-inf, whose softmax is NaN;
    dividing in float64 keeps a temperature below float32's smallest (1e-50) from rounding to 0."""
    return ((logits - logits.max()).double() / temperature).float()


def sample_rows(samplers: list[Sampler], logits: torch.Tensor) -> list[int]:
    """One token per row of ``logits`` [rows, vocab] (on any device), row i by ``samplers[i]``.

    Greedy rows take one argmax on the logits' device, so a decode step moves a few integers to
    the host instead of every row's vocabulary (6 MB per step at 32 rows of SmolLM2's 49k), and
    only the rows that sample go to the host whole. Same tokens as ``samplers[i](logits[i])``:
    argmax returns the first maximal index on every device.
    """
    greedy = [i for i, s in enumerate(samplers) if s.params.temperature == 0]
    others = [i for i, s in enumerate(samplers) if s.params.temperature != 0]
    tokens = [0] * len(samplers)
    if greedy:
        picked = logits if len(greedy) == len(samplers) else logits[greedy]
        for i, t in zip(greedy, torch.argmax(picked, dim=-1).tolist()):
            tokens[i] = t
    if others:
        rows = logits[others].cpu()
        for i, row in zip(others, rows):
            tokens[i] = samplers[i](row)
    return tokens
