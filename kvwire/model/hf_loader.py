"""Load a Hugging Face ``LlamaForCausalLM`` directory (config.json + safetensors) into LlamaModel.

Both config spellings are accepted: transformers < 5 writes ``rope_theta`` + ``rope_scaling``,
transformers >= 5 writes a ``rope_parameters`` dict. Getting this wrong would not fail loudly, it
would only rotate K differently from the checkpoint's training, so unknown rope types raise.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from kvwire.model.config import Llama3RopeScaling, ModelConfig
from kvwire.model.llama import LlamaModel

_SUPPORTED_ARCHS = {"LlamaForCausalLM", "MistralForCausalLM"}


def _rope(raw: dict[str, Any]) -> tuple[float, Llama3RopeScaling | None]:
    params = dict(raw.get("rope_parameters") or {})
    legacy = raw.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    spec = params if params.get("rope_type", params.get("type")) not in (None, "default") else legacy
    rope_type = spec.get("rope_type", spec.get("type", "default")) if spec else "default"
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope type {rope_type!r} (only default and llama3)")
    scaling = Llama3RopeScaling(
        factor=float(spec["factor"]),
        low_freq_factor=float(spec["low_freq_factor"]),
        high_freq_factor=float(spec["high_freq_factor"]),
        original_max_position=int(spec["original_max_position_embeddings"]),
    )
    return theta, scaling


def _token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(x) for x in value) if isinstance(value, list) else (int(value),)


_REQUIRED_KEYS = ("num_attention_heads", "hidden_size", "vocab_size", "intermediate_size", "num_hidden_layers")


def config_from_hf(raw: dict[str, Any], name: str = "hf-llama") -> ModelConfig:
    """Translate a ``config.json`` dict; refuses features this model does not implement."""
    archs = set(raw.get("architectures") or ["LlamaForCausalLM"])
    if not archs & _SUPPORTED_ARCHS and raw.get("model_type") not in ("llama", "mistral"):
        raise ValueError(f"unsupported architecture {sorted(archs)}; expected a Llama-family model")
    if raw.get("attention_bias") or raw.get("mlp_bias"):
        raise ValueError("attention_bias / mlp_bias checkpoints are not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {raw['hidden_act']!r}")
    if raw.get("sliding_window"):
        raise ValueError("sliding-window attention is not supported")
    missing = [k for k in _REQUIRED_KEYS if k not in raw]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}: not a complete Llama-family config")
    heads = int(raw["num_attention_heads"])
    theta, scaling = _rope(raw)
    head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
    bos = raw.get("bos_token_id")
    return ModelConfig(
        name=name,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=int(raw["hidden_size"]),
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_context=int(raw.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=_token_ids(raw.get("eos_token_id")),
    )


def _safetensor_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [directory / f for f in sorted(set(weight_map.values()))]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {directory}")
    return files


def iter_hf_weights(directory: Path, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield checkpoint tensors, skipping buffers and the redundant head of tied models."""
    from safetensors import safe_open

    for file in _safetensor_files(directory):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for key in handle.keys():
                if key.endswith("rotary_emb.inv_freq"):
                    continue
                if key == "lm_head.weight" and config.tie_embeddings:
                    continue
                yield key, handle.get_tensor(key)


def load_hf_model(
    directory: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> LlamaModel:
    """Build the model described by ``directory/config.json`` and fill it from its safetensors."""
    path = Path(directory)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} not found; not a Hugging Face model directory")
    config = config_from_hf(json.loads(config_file.read_text()), name=path.name)
    model = LlamaModel(config, dtype=dtype, device=device)
    model.load_weights(iter_hf_weights(path, config))
    return model.eval()
