"""The packaged SmolLM2-135M-Instruct GGUF, checked against transformers loading the same file."""

from __future__ import annotations

import functools
import importlib.util

import pytest
import torch

from kvwire.model import StreamDecoder, dense_causal_attention, generate_without_cache
from kvwire.model.gguf_loader import find_smollm2_gguf, gguf_reader_class
from kvwire.model.registry import load_model_config

pytestmark = pytest.mark.slow

TEXTS = [
    "The capital of France is",
    "Hello world! 12345 + 678 = 13023, pi≈3.14159",
    "  leading spaces\n\n\ttabs and\r\nCRLF   trailing   ",
    "Ünïcödé: 日本語のテキスト, emoji 🎉🚀, Ελληνικά, русский",
    "<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "code: def f(x):\n    return x**2  # it's ok, they'll see",
]


def dense(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return dense_causal_attention(q, k, v)


@pytest.fixture(scope="module")
def hf_reference():
    """transformers' own GGUF loading of the same file (model, tokenizer): an independent reference.

    Three speed/packaging patches, none touching the numbers transformers computes:
    - it refuses GGUF without `accelerate`, which it only needs for device maps and which the
      test extras lack, so that guard is lifted when accelerate is missing;
    - its GGUFReader is swapped for ours (same parser over an ndarray view, 3x faster);
    - `gguf.get_tensor_name_map` is memoised (transformers rebuilds it ~400 times, ~20 s).
    """
    transformers = pytest.importorskip("transformers")
    import gguf
    import transformers.modeling_utils as modeling_utils

    path = find_smollm2_gguf()
    patch = pytest.MonkeyPatch()
    if importlib.util.find_spec("accelerate") is None:
        patch.setattr(modeling_utils, "is_accelerate_available", lambda: True)
    patch.setattr(gguf, "GGUFReader", gguf_reader_class())
    patch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    finally:
        patch.undo()
    return model, tokenizer


def test_structure(smollm2) -> None:
    model, tokenizer = smollm2
    c = model.config
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 9, 3, 64)
    assert (c.hidden_size, c.intermediate_size, c.vocab_size, c.max_context) == (576, 1536, 49152, 8192)
    assert c.tie_embeddings and model.lm_head is None and c.rope_scaling is None
    assert c.rope_theta == 100000.0 and abs(c.rms_norm_eps - 1e-5) < 1e-9
    assert (c.bos_token_id, c.eos_token_ids) == (1, (2,))
    assert (tokenizer.bos_token_id, tokenizer.eos_token_ids, tokenizer.add_bos) == (1, (2,), False)
    assert tokenizer.vocab_size == c.vocab_size
    assert model.dtype == torch.float32 and model.device.type == "cpu"
    assert load_model_config() == c


def test_weights_identical_to_transformers(smollm2, hf_reference) -> None:
    model, _ = smollm2
    hf_model, _ = hf_reference
    layer, hf_layer = model.layers[7], hf_model.model.layers[7]
    c = model.config
    q, k, v = layer.qkv_proj.split([c.q_size, c.kv_size, c.kv_size])
    assert torch.equal(q, hf_layer.self_attn.q_proj.weight)
    assert torch.equal(k, hf_layer.self_attn.k_proj.weight)
    assert torch.equal(v, hf_layer.self_attn.v_proj.weight)
    assert torch.equal(layer.down_proj, hf_layer.mlp.down_proj.weight)
    assert torch.equal(model.embed_tokens, hf_model.model.embed_tokens.weight)


def test_logits_match_transformers(smollm2, hf_reference) -> None:
    model, tokenizer = smollm2
    hf_model, _ = hf_reference
    ids = tokenizer.encode(tokenizer.apply_chat_template("Name three primary colors."))
    with torch.no_grad():
        expected = hf_model(torch.tensor([ids])).logits[0].float()
    got = model(torch.tensor(ids), torch.arange(len(ids)), dense)
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)


def test_tokenizer_matches_transformers(smollm2, hf_reference) -> None:
    _, tokenizer = smollm2
    _, hf_tokenizer = hf_reference
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert ids == hf_tokenizer.encode(text, add_special_tokens=False), text
        assert tokenizer.decode(ids) == hf_tokenizer.decode(ids) == text


def test_digits_are_isolated_before_the_gpt2_split(smollm2) -> None:
    """llama.cpp's "smollm" pre-tokenizer (= tokenizer.json's Digits + ByteLevel) splits digits
    first, so a whitespace run before a digit stays one piece and merges to "ĠĠ" (id 256).
    transformers' GGUF tokenizer skips the digit step and yields two "Ġ" (216, 216) here."""
    _, tokenizer = smollm2
    assert tokenizer.encode("a  1") == [81, 256, 33]
    assert tokenizer.encode(" 2024") == [216, 34, 32, 34, 36]


def test_special_tokens_and_chat_template(smollm2) -> None:
    _, tokenizer = smollm2
    prompt = tokenizer.apply_chat_template("Hi!", system="Be brief.")
    assert prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    default = tokenizer.apply_chat_template("Hi!")
    assert default.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert tokenizer.apply_chat_template("Hi!", system="").startswith("<|im_start|>user\n")
    ids = tokenizer.encode(prompt)
    assert ids[0] == 1 and ids.count(2) == 2 and tokenizer.decode(ids) == prompt
    assert tokenizer.decode(ids, skip_special_tokens=True) == "system\nBe brief.\nuser\nHi!\nassistant\n"


def test_stream_decoder_handles_split_utf8(smollm2) -> None:
    _, tokenizer = smollm2
    text = "Ünïcödé 日本語 🎉🚀 done."
    ids = tokenizer.encode(text)
    stream = StreamDecoder(tokenizer)
    deltas = [stream.push(i) for i in ids]
    assert "".join(deltas) + stream.flush() == text
    assert "" in deltas and all("\ufffd" not in d for d in deltas)
    special = StreamDecoder(tokenizer)
    assert [special.push(i) for i in tokenizer.encode("Hi<|im_end|>")] == ["Hi", ""]


def test_greedy_generation_knows_paris(smollm2) -> None:
    model, tokenizer = smollm2
    out = generate_without_cache(model, tokenizer.encode("The capital of France is"), 8)
    assert "Paris" in tokenizer.decode(out)
