"""Static fp8 scales (granularities ``tensor`` and ``head``), calibrated once at start-up.

The model runs once over a calibration text with plain attention; each layer's K and V amax
(per head, or over all heads) sets the scale, with ``STATIC_SCALE_HEADROOM`` of room so hotter
prompts saturate rarely. The scales then travel with the format (manifests), not in pages.
"""
from __future__ import annotations

import torch

from kvwire.formats import FP8_MAX
from kvwire.quant import scale_from_amax

STATIC_SCALE_HEADROOM = 2.0

CALIBRATION_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based ink and a wooden screw press. Within fifty years "
    "printers in more than two hundred cities had produced millions of books. Prices fell, "
    "literacy rose, and scientists could share exact copies of tables, diagrams and proofs.\n"
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
    "Q: What is 17 times 23? A: 391. Q: Name three prime numbers above 100. A: 101, 103, 107.\n"
    "The passkey is 48213. Remember it. The grass is green. The sky is blue. The sun is yellow."
)


@torch.inference_mode()
def calibrate_static_scales(model: torch.nn.Module, token_ids: list[int] | None = None) -> torch.Tensor:
    """Per-head amax-based fp8 scales ``[layers, 2, kv_heads]`` from one pass of the model.

    ``token_ids``: the calibration prompt (normally CALIBRATION_TEXT tokenised); without one, a
    fixed pseudo-random token sequence stands in (dummy-weight models have no tokenizer).
    ``tensor`` granularity takes the max over heads of these (see ``reduce_for_granularity``).
    """
    from kvwire.model.llama import dense_causal_attention

    cfg = model.config
    device = model.device
    if not token_ids:
        gen = torch.Generator().manual_seed(0)
        token_ids = torch.randint(0, cfg.vocab_size, (256,), generator=gen).tolist()
    amax = torch.zeros((cfg.num_layers, 2, cfg.num_kv_heads), dtype=torch.float32, device=device)

    def attn(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        amax[layer, 0] = k.float().abs().amax(dim=(0, 2))
        amax[layer, 1] = v.float().abs().amax(dim=(0, 2))
        return dense_causal_attention(q, k, v)

    ids = torch.tensor(token_ids, dtype=torch.long, device=device)
    model(ids, torch.arange(len(token_ids), device=device), attn, logits_indices=ids.new_tensor([len(token_ids) - 1]))
    if not bool(torch.isfinite(amax).all()):
        raise ValueError("calibration produced non-finite K/V: check the model weights")
    return scale_from_amax(amax * STATIC_SCALE_HEADROOM, FP8_MAX)     # 1 where amax is 0 or underflows


def reduce_for_granularity(scales: torch.Tensor, key_tensor: bool, value_tensor: bool) -> torch.Tensor:
    """Collapse per-head scales to one per layer for parts whose granularity is ``tensor``."""
    out = scales.clone()
    for part, flag in ((0, key_tensor), (1, value_tensor)):
        if flag:
            out[:, part] = scales[:, part].amax(dim=-1, keepdim=True).expand_as(scales[:, part])
    return out
