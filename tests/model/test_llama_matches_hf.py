"""Our Llama (with attention as a callback) must reproduce transformers' LlamaForCausalLM logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvwire.model import SHAPES, LlamaModel, ModelConfig, dense_causal_attention, generate_without_cache, load_model
from kvwire.model.hf_loader import config_from_hf
from kvwire.model.registry import load_model_config

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def dense(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return dense_causal_attention(q, k, v)


class AccumulatingAttention:
    """Keeps every layer's K/V across forward calls, like a (dense, single-sequence) KV cache."""

    def __init__(self) -> None:
        self.k: dict[int, torch.Tensor] = {}
        self.v: dict[int, torch.Tensor] = {}

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.k[layer] = torch.cat([self.k[layer], k]) if layer in self.k else k
        self.v[layer] = torch.cat([self.v[layer], v]) if layer in self.v else v
        return dense_causal_attention(q, self.k[layer], self.v[layer])


def _save_tiny_hf(directory: Path, tied: bool, head_dim: int | None, shard: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    extra = {"head_dim": head_dim} if head_dim else {}
    config = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-5,
        rope_scaling=LLAMA3_ROPE, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=[2, 3], **extra,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # HF inits norms to 1; perturb them so a mis-mapped norm would show
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(directory, max_shard_size="100KB" if shard else "5GB")
    return model


@pytest.fixture(
    scope="module",
    params=[
        {"tied": False, "head_dim": None, "shard": False},
        {"tied": True, "head_dim": 32, "shard": True},
    ],
    ids=["untied", "tied-headdim32-sharded"],
)
def tiny(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny_llama")
    hf_model = _save_tiny_hf(directory, **request.param)
    model, tokenizer = load_model(str(directory))
    return hf_model, model, tokenizer, directory


def test_config_translated(tiny) -> None:
    hf_model, model, tokenizer, directory = tiny
    cfg = model.config
    assert tokenizer is None
    assert cfg.tie_embeddings == hf_model.config.tie_word_embeddings
    assert (model.lm_head is None) == cfg.tie_embeddings
    assert cfg.rope_scaling is not None and cfg.rope_scaling.original_max_position == 32
    assert cfg.eos_token_ids == (2, 3) and cfg.bos_token_id == 1
    assert cfg.head_dim == hf_model.config.head_dim
    assert load_model_config(str(directory)) == cfg
    if (directory / "model.safetensors.index.json").exists():
        assert len(list(directory.glob("*.safetensors"))) > 1


def test_logits_match_hf(tiny) -> None:
    hf_model, model, _, _ = tiny
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf_model(ids[None]).logits[0].float()
    got = model(ids, torch.arange(len(ids)), dense)
    assert got.dtype == torch.float32 and got.shape == (40, 300)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    rows = torch.tensor([0, 17, 39])
    torch.testing.assert_close(model(ids, torch.arange(len(ids)), dense, logits_indices=rows), got[rows])


def test_chunked_positions_equal_one_shot(tiny) -> None:
    _, model, _, _ = tiny
    ids = torch.randint(0, 300, (29,), generator=torch.Generator().manual_seed(2))
    one_shot = model(ids, torch.arange(29), dense)
    cache = AccumulatingAttention()
    parts = [model(ids[a:b], torch.arange(a, b), cache) for a, b in ((0, 11), (11, 12), (12, 29))]
    torch.testing.assert_close(torch.cat(parts), one_shot, atol=1e-5, rtol=1e-5)


def test_flattened_sequences_equal_separate_runs(tiny) -> None:
    _, model, _, _ = tiny
    seqs = [torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(n)) for n in (7, 12)]
    bounds = [0, 7, 19]

    def varlen(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.cat([dense_causal_attention(q[a:b], k[a:b], v[a:b]) for a, b in zip(bounds, bounds[1:])])

    positions = torch.cat([torch.arange(len(s)) for s in seqs])
    got = model(torch.cat(seqs), positions, varlen, logits_indices=torch.tensor([6, 18]))
    for row, seq in zip(got, seqs):
        torch.testing.assert_close(row, model(seq, torch.arange(len(seq)), dense)[-1], atol=1e-5, rtol=1e-5)


def test_generate_without_cache_is_greedy(tiny) -> None:
    _, model, _, _ = tiny
    prompt = [5, 17, 42, 7]
    out = generate_without_cache(model, prompt, 6, kv_dtype=torch.float32, stop_token_ids=())
    assert len(out) == 6
    ids = list(prompt)
    for token in out:
        logits = model(torch.tensor(ids), torch.arange(len(ids)), dense)
        assert int(logits[-1].argmax()) == token
        ids.append(token)
    first = out[0]
    assert generate_without_cache(model, prompt, 6, kv_dtype=torch.float32, stop_token_ids=[first]) == [first]


def test_legacy_rope_config_keys() -> None:
    base = {
        "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "tie_word_embeddings": True, "eos_token_id": 2,
    }
    legacy = config_from_hf({**base, "rope_theta": 5e5, "rope_scaling": {**LLAMA3_ROPE, "rope_type": "llama3"}})
    modern = config_from_hf({**base, "rope_parameters": {**LLAMA3_ROPE, "rope_theta": 5e5}})
    assert legacy == modern and legacy.rope_theta == 5e5 and legacy.eos_token_ids == (2,)
    with pytest.raises(ValueError, match="rope type"):
        config_from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    # an incomplete config.json said only "num_attention_heads" (a KeyError's text)
    with pytest.raises(ValueError, match="lacks num_attention_heads, hidden_size, vocab_size"):
        config_from_hf({})


def test_hf_dir_tokenizer_json_is_loaded(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers, processors

    _save_tiny_hf(tmp_path, tied=True, head_dim=None, shard=False)
    backend = Backend(models.WordLevel({"<unk>": 0, "<s>": 1, "hello": 4, "world": 5}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.save(str(tmp_path / "tokenizer.json"))
    _, tokenizer = load_model(str(tmp_path))
    assert tokenizer is not None and tokenizer.eos_token_ids == (2, 3)
    assert tokenizer.encode("hello world") == [4, 5]
    assert tokenizer.encode("hello world", add_bos=True) == [1, 4, 5]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}))
    assert load_model(str(tmp_path))[1].encode("hello world") == [1, 4, 5]
    (tmp_path / "tokenizer_config.json").unlink()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    backend.save(str(tmp_path / "tokenizer.json"))
    assert load_model(str(tmp_path))[1].encode("hello world") == [1, 4, 5]


def test_config_validation() -> None:
    good = SHAPES["smollm2-135m"]
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelConfig(**{**good.__dict__, "num_kv_heads": 4})
    with pytest.raises(ValueError, match="outside vocab"):
        ModelConfig(**{**good.__dict__, "eos_token_ids": (good.vocab_size,)})
    with pytest.raises(ValueError, match="positive int"):
        ModelConfig(**{**good.__dict__, "num_layers": 0})


def test_dummy_load_is_seeded_and_runs() -> None:
    model, _ = load_model(load_format="dummy", model_shape="smollm2-135m")
    again = LlamaModel(SHAPES["smollm2-135m"])
    again.init_random(seed=0)
    assert isinstance(model, LlamaModel) and model.config == SHAPES["smollm2-135m"]
    assert torch.equal(model.layers[3].qkv_proj, again.layers[3].qkv_proj)
    assert bool((model.layers[0].input_layernorm == 1).all()) and bool((model.norm == 1).all())
    assert 0.015 < float(model.embed_tokens.std()) < 0.025
    logits = model(torch.tensor([1, 2, 3]), torch.arange(3), dense)
    assert logits.shape == (3, 49152) and bool(torch.isfinite(logits).all())
    assert load_model_config(load_format="dummy", model_shape="llama-3-8b") == SHAPES["llama-3-8b"]
    with pytest.raises(ValueError, match="model_shape"):
        load_model(load_format="dummy", model_shape="nope")
    with pytest.raises(FileNotFoundError):
        load_model("/does/not/exist")
