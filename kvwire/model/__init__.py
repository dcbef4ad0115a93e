"""Llama-family model, loaders and tokenizer; attention is delegated to the serving engine."""

from kvwire.model.config import SHAPES, Llama3RopeScaling, ModelConfig
from kvwire.model.llama import AttentionFn, LlamaModel, dense_causal_attention, generate_without_cache
from kvwire.model.registry import load_model, load_model_config
from kvwire.model.tokenizer import StreamDecoder, Tokenizer

__all__ = [
    "SHAPES",
    "AttentionFn",
    "Llama3RopeScaling",
    "LlamaModel",
    "ModelConfig",
    "StreamDecoder",
    "Tokenizer",
    "dense_causal_attention",
    "generate_without_cache",
    "load_model",
    "load_model_config",
]
