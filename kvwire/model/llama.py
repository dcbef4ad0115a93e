"""A Llama-family decoder in plain torch whose attention is delegated to the caller.

The serving engine owns the KV cache (compact FP8/NVFP4 pages), so the model never stores K/V
itself: every layer hands its freshly projected, RoPE-rotated q/k/v to an :class:`AttentionFn`
and gets the attention output back. The model is therefore stateless and the same weights can
serve prefill, decode and reference (no-cache) runs.

Numerics follow Hugging Face's ``LlamaForCausalLM`` (RMSNorm in float32, cos/sin cast to the
activation dtype, rotate_half RoPE, llama3 frequency scaling) so logits can be compared directly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Protocol

import torch
import torch.nn.functional as F

from kvwire.model.config import ModelConfig


class AttentionFn(Protocol):
    """Callback computing attention for one layer; the engine implements it over its KV pages."""

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [N, Hq, D], k/v: [N, Hkv, D] (contiguous) for the N tokens of this forward call,
        RoPE already applied (HF rotate_half convention). Returns the attention output [N, Hq, D]
        (same dtype as q), softmax scale 1/sqrt(D), causal semantics are the callback's business."""
        ...


def compute_inv_freq(config: ModelConfig, device: torch.device | str = "cpu") -> torch.Tensor:
    """RoPE inverse frequencies [D/2] in float32, bit-identical to HF's (incl. llama3 scaling)."""
    dim = config.head_dim
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim
    inv_freq = 1.0 / (config.rope_theta**exponents)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    low_freq_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_position / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm: normalise in float32, scale in the activation dtype."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add (if any) and the RMSNorm after it: (h + delta, RMSNorm(h + delta)), in torch."""
    if delta is not None:
        h = h + delta
    return h, _rms_norm(h, weight, eps)


def rope_split(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, num_kv_heads: int,
                head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused QKV projection split into q, k, v [N, heads, D], RoPE (rotate_half) on q and k, in
    torch; cos/sin [N, D] in the activation dtype."""
    n = qkv.shape[0]
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    q = q.view(n, num_heads, head_dim)
    k = k.view(n, num_kv_heads, head_dim)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    return q, k, v.reshape(n, num_kv_heads, head_dim).contiguous()


def block_ops(h: torch.Tensor, head_dim: int):
    """(add + RMSNorm, QKV split + RoPE) for activations ``h``: one fused kernel each on CUDA
    (``kvwire.kernels.model_ops``, the same numerics), the torch ops elsewhere (and RoPE in torch
    for a head_dim that is not a power of two)."""
    if h.is_cuda:
        from kvwire.kernels import model_ops
        if model_ops.fused_ops_for(h):
            return model_ops.add_rms_norm, (model_ops.rope_split if head_dim & (head_dim - 1) == 0 else rope_split)
    return add_rms_norm, rope_split


def _weight(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class LlamaLayer(torch.nn.Module):
    """One decoder block; q/k/v and gate/up are fused so each costs a single GEMM."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.input_layernorm = _weight((hidden,), dtype, device)
        self.qkv_proj = _weight((config.q_size + 2 * config.kv_size, hidden), dtype, device)
        self.o_proj = _weight((hidden, config.q_size), dtype, device)
        self.post_attention_layernorm = _weight((hidden,), dtype, device)
        self.gate_up_proj = _weight((2 * inter, hidden), dtype, device)
        self.down_proj = _weight((hidden, inter), dtype, device)


# HF checkpoint suffix -> (our parameter, row slice index) ; slice index selects a fused block.
_LAYER_KEYS: dict[str, tuple[str, int | None]] = {
    "input_layernorm.weight": ("input_layernorm", None),
    "post_attention_layernorm.weight": ("post_attention_layernorm", None),
    "self_attn.q_proj.weight": ("qkv_proj", 0),
    "self_attn.k_proj.weight": ("qkv_proj", 1),
    "self_attn.v_proj.weight": ("qkv_proj", 2),
    "self_attn.o_proj.weight": ("o_proj", None),
    "mlp.gate_proj.weight": ("gate_up_proj", 0),
    "mlp.up_proj.weight": ("gate_up_proj", 1),
    "mlp.down_proj.weight": ("down_proj", None),
}


class LlamaModel(torch.nn.Module):
    """Llama decoder + LM head; see the module docstring for the attention contract."""

    config: ModelConfig

    def __init__(
        self, config: ModelConfig, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> None:
        """Allocates uninitialised weights directly on ``device`` (fill them with a loader)."""
        super().__init__()
        self.config = config
        dev = torch.device(device)
        self.embed_tokens = _weight((config.vocab_size, config.hidden_size), dtype, dev)
        self.layers = torch.nn.ModuleList(LlamaLayer(config, dtype, dev) for _ in range(config.num_layers))
        self.norm = _weight((config.hidden_size,), dtype, dev)
        self.lm_head = None if config.tie_embeddings else _weight((config.vocab_size, config.hidden_size), dtype, dev)
        self._rope_cache: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    def _split_sizes(self, param: str) -> list[int]:
        c = self.config
        return [c.q_size, c.kv_size, c.kv_size] if param == "qkv_proj" else [c.intermediate_size] * 2

    def _target(self, name: str) -> torch.Tensor:
        """Map an HF checkpoint name to the (slice of the) parameter it fills."""
        key = name.removeprefix("model.")
        if key in ("embed_tokens.weight", "norm.weight"):
            return getattr(self, key.split(".")[0])
        if key == "lm_head.weight":
            if self.lm_head is None:
                raise KeyError("lm_head.weight given but the config ties embeddings")
            return self.lm_head
        parts = key.split(".", 2)
        if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit() and parts[2] in _LAYER_KEYS:
            index = int(parts[1])
            if index >= self.config.num_layers:
                raise KeyError(f"{name}: layer {index} >= num_layers {self.config.num_layers}")
            param_name, block = _LAYER_KEYS[parts[2]]
            param = getattr(self.layers[index], param_name)
            if block is None:
                return param
            return param.split(self._split_sizes(param_name), dim=0)[block]
        raise KeyError(f"unknown weight {name!r}")

    def expected_weight_names(self) -> set[str]:
        """The HF-style names :meth:`load_weights` needs to fully initialise the model."""
        names = {"model.embed_tokens.weight", "model.norm.weight"}
        if self.lm_head is not None:
            names.add("lm_head.weight")
        for i in range(self.config.num_layers):
            names.update(f"model.layers.{i}.{suffix}" for suffix in _LAYER_KEYS)
        return names

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], strict: bool = True) -> set[str]:
        """Copy HF-named tensors (``model.layers.0.self_attn.q_proj.weight``...) into the model.

        Returns the names loaded. With ``strict`` a missing weight raises, since uninitialised
        memory would otherwise silently produce garbage logits.
        """
        loaded: set[str] = set()
        for name, tensor in weights:
            canonical = name if name.startswith(("model.", "lm_head.")) else f"model.{name}"
            target = self._target(canonical)
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != expected {tuple(target.shape)}")
            target.copy_(tensor)
            loaded.add(canonical)
        missing = self.expected_weight_names() - loaded
        if strict and missing:
            raise ValueError(f"checkpoint lacks {len(missing)} weights, e.g. {sorted(missing)[:3]}")
        return loaded

    @torch.no_grad()
    def init_random(self, seed: int = 0, std: float = 0.02) -> None:
        """Dummy weights (for benchmarking shapes without a checkpoint), generated on-device."""
        generator = torch.Generator(device=self.device).manual_seed(seed)
        for name, param in self.named_parameters():
            if name.endswith("norm"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, std, generator=generator)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [N, D] in float32, from a table built once on first use up to max_context."""
        if self._rope_cache is None or self._rope_cache[0].device != positions.device:
            inv_freq = compute_inv_freq(self.config, positions.device)
            t = torch.arange(self.config.max_context, device=positions.device, dtype=torch.float32)
            freqs = t[:, None] * inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            self._rope_cache = (emb.cos(), emb.sin())
        cos, sin = self._rope_cache
        return cos[positions], sin[positions]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionFn,
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [N] int64 (tokens of one or several sequences flattened);
        returns logits [len(logits_indices), vocab] in float32 for the rows logits_indices
        (default: all rows)."""
        if input_ids.dim() != 1 or positions.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and positions must be equal-length 1-D tensors, got "
                f"{tuple(input_ids.shape)} and {tuple(positions.shape)}"
            )
        c = self.config
        n = input_ids.shape[0]
        h = F.embedding(input_ids, self.embed_tokens)
        cos, sin = self._rope(positions)
        cos, sin = cos.to(h.dtype), sin.to(h.dtype)
        add_norm, split_rope = block_ops(h, c.head_dim)
        mlp_out = None        # each layer's MLP output joins the residual in the next norm (one fused op)
        for index, layer in enumerate(self.layers):
            h, x = add_norm(h, mlp_out, layer.input_layernorm, c.rms_norm_eps)
            q, k, v = split_rope(F.linear(x, layer.qkv_proj), cos, sin, c.num_heads, c.num_kv_heads, c.head_dim)
            out = attn(index, q, k, v)
            h, x = add_norm(h, F.linear(out.reshape(n, c.q_size), layer.o_proj), layer.post_attention_layernorm,
                            c.rms_norm_eps)
            gate, up = F.linear(x, layer.gate_up_proj).chunk(2, dim=-1)
            mlp_out = F.linear(F.silu(gate) * up, layer.down_proj)
        if logits_indices is not None:
            h = h[logits_indices]
            mlp_out = None if mlp_out is None else mlp_out[logits_indices]
        _, h = add_norm(h, mlp_out, self.norm, c.rms_norm_eps)
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        return F.linear(h, head).float()


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Reference causal GQA attention for ONE sequence: q [Nq, Hq, D], k/v [Nk, Hkv, D].

    When Nk > Nq the queries are taken to be the last Nq positions of the Nk-token sequence, so a
    callback that accumulates K/V across chunked forwards can reuse this function.
    """
    nq, hq, d = q.shape
    nk, hkv = k.shape[0], k.shape[1]
    if nk < nq or hq % hkv != 0 or v.shape != k.shape or k.shape[2] != d:
        raise ValueError(f"bad attention shapes q={tuple(q.shape)} k={tuple(k.shape)} v={tuple(v.shape)}")
    group = hq // hkv
    kh = k.to(q.dtype).repeat_interleave(group, dim=1).transpose(0, 1)
    vh = v.to(q.dtype).repeat_interleave(group, dim=1).transpose(0, 1)
    rows = torch.arange(nq, device=q.device)[:, None] + (nk - nq)
    mask = torch.arange(nk, device=q.device)[None, :] <= rows
    out = F.scaled_dot_product_attention(q.transpose(0, 1), kh, vh, attn_mask=mask, scale=1.0 / math.sqrt(d))
    return out.transpose(0, 1).contiguous()


def generate_without_cache(
    model: LlamaModel,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    kv_dtype: torch.dtype = torch.bfloat16,
    stop_token_ids: Sequence[int] | None = None,
) -> list[int]:
    """Greedy decoding by recomputing the whole sequence every step (no KV cache at all).

    K and V are rounded to ``kv_dtype`` before attention, which makes this the ground truth a
    ``kv_dtype`` KV cache must reproduce token for token. Returns only the new tokens; stops
    after emitting a stop token (default: the config's EOS ids), which is included.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    stops = set(model.config.eos_token_ids if stop_token_ids is None else stop_token_ids)

    def attn(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return dense_causal_attention(q, k.to(kv_dtype), v.to(kv_dtype))

    ids = list(prompt_ids)
    new: list[int] = []
    for _ in range(max_new_tokens):
        if len(ids) > model.config.max_context:
            break
        tokens = torch.tensor(ids, dtype=torch.int64, device=model.device)
        positions = torch.arange(len(ids), dtype=torch.int64, device=model.device)
        last = torch.tensor([len(ids) - 1], device=model.device)
        token = int(model(tokens, positions, attn, logits_indices=last)[0].argmax())
        ids.append(token)
        new.append(token)
        if token in stops:
            break
    return new
