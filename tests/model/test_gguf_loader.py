"""Any llama GGUF: write a tiny one the way llama.cpp's converter does, load it, compare with HF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kvwire.model import Llama3RopeScaling, dense_causal_attention, load_model
from kvwire.model.llama import compute_inv_freq

HEADS, KV_HEADS, LAYERS, VOCAB = 4, 2, 2, 300
BYTE_TOKENS = 256
MERGES = ["Ġ t", "h e", "Ġt he"]
GGUF_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def dense(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return dense_causal_attention(q, k, v)


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's Q/K row permutation (half-split -> interleaved RoPE)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _vocab() -> tuple[list[str], list[int]]:
    from kvwire.model.tokenizer import _bytes_to_unicode

    tokens = ["<|endoftext|>", *_bytes_to_unicode().values(), "Ġt", "he", "Ġthe"]
    tokens += [f"[PAD{i}]" for i in range(VOCAB - len(tokens))]
    types = [3] + [1] * (BYTE_TOKENS + len(MERGES)) + [5] * (VOCAB - 1 - BYTE_TOKENS - len(MERGES))
    return tokens, types


def _write_gguf(path: Path, hf_model: torch.nn.Module, pre: str) -> None:
    """Q8_0 for the matrices (dequantised back into hf_model, so both sides see identical weights)."""
    import gguf

    cfg = hf_model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (
        ("block_count", LAYERS), ("context_length", cfg.max_position_embeddings),
        ("embedding_length", cfg.hidden_size), ("feed_forward_length", cfg.intermediate_size),
        ("head_count", HEADS), ("head_count_kv", KV_HEADS), ("rope_dimension_count", cfg.head_dim),
        ("vocab_size", VOCAB),
    ):
        getattr(writer, f"add_{key}")(value)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    tokens, types = _vocab()
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    rotary = hf_model.model.rotary_emb
    plain = compute_inv_freq(_plain_config(cfg))
    writer.add_tensor("rope_freqs.weight", (plain / rotary.inv_freq).numpy().astype(np.float32))
    for name, param in hf_model.state_dict().items():
        weight = param.detach().numpy().astype(np.float32)
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "lm_head.weight":
            gguf_name = "output.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            gguf_name = f"blk.{layer}.{GGUF_NAMES[rest.removesuffix('.weight')]}.weight"
        if weight.ndim == 1:
            writer.add_tensor(gguf_name, weight)
            continue
        quantized = gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0)
        param.copy_(torch.from_numpy(gguf.quants.dequantize(quantized, gguf.GGMLQuantizationType.Q8_0)))
        if gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = HEADS if "attn_q" in gguf_name else KV_HEADS
            quantized = gguf.quants.quantize(_permute(param.numpy(), heads), gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(gguf_name, quantized, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _plain_config(cfg):
    from kvwire.model.config import ModelConfig

    return ModelConfig(
        name="plain", vocab_size=VOCAB, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=cfg.head_dim,
        rope_theta=cfg.rope_parameters["rope_theta"], rope_scaling=None, rms_norm_eps=cfg.rms_norm_eps,
        max_context=cfg.max_position_embeddings, tie_embeddings=False, bos_token_id=None,
    )


@pytest.fixture(scope="module", params=["gpt2", "llama-bpe"])
def written(request, tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, max_position_embeddings=16384, rope_theta=10000.0, rms_norm_eps=1e-5,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
        tie_word_embeddings=False,
    )
    hf_model = LlamaForCausalLM(config).eval()
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    with torch.no_grad():
        _write_gguf(path, hf_model, request.param)
    model, tokenizer = load_model(str(path))
    return hf_model, model, tokenizer


def test_config_and_rope_freqs(written) -> None:
    _, model, _ = written
    cfg = model.config
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (2, 4, 2, 16, 300)
    assert not cfg.tie_embeddings and model.lm_head is not None
    assert cfg.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 8192)


def test_logits_match_hf(written) -> None:
    hf_model, model, _ = written
    ids = torch.randint(0, VOCAB, (33,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = hf_model(ids[None]).logits[0]
    torch.testing.assert_close(model(ids, torch.arange(33), dense), expected, atol=1e-4, rtol=1e-4)


def test_tokenizer_from_gguf(written) -> None:
    _, _, tokenizer = written
    the = tokenizer.token_to_id("Ġthe")
    assert tokenizer.encode(" the<|endoftext|>") == [the, 0]
    assert tokenizer.vocab_size == VOCAB and tokenizer.eos_token_ids == (0,)
    text = "x the 12  é\n"
    assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.parametrize("scaling", ["linear", "yarn", "scale_linear", "factor_only", "none", "factor_1"])
def test_rope_scaling_is_read_as_llama_cpp_reads_it_and_refused(tmp_path, scaling) -> None:
    """Plain RoPE on such a file rotated K wrongly with no error (the HF loader refuses it too)."""
    import gguf

    from kvwire.model.gguf_loader import config_from_gguf, open_gguf

    path = tmp_path / f"{scaling}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(16384)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    if scaling == "scale_linear":
        w.add_float32("llama.rope.scale_linear", 4.0)
    elif scaling in ("factor_only", "factor_1"):                # llama.cpp takes a missing type as linear
        w.add_rope_scaling_factor(4.0 if scaling == "factor_only" else 1.0)
    else:
        w.add_rope_scaling_type(gguf.RopeScalingType(scaling))
        w.add_rope_scaling_factor(4.0)
    w.add_tensor("token_embd.weight", np.random.default_rng(0).standard_normal((32, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if scaling in ("none", "factor_1"):                         # no scaling, whatever the factor says
        assert config_from_gguf(open_gguf(str(path))).rope_scaling is None
        return
    with pytest.raises(ValueError, match="unsupported rope scaling"):
        config_from_gguf(open_gguf(str(path)))
