"""The model, its config and its tokenizer for a sweep, read through the loaders `kvwire generate` and
`kvwire formats` use (kvwire.commands.model_args), so that a --model that is missing or unreadable is the
same one-line error, exit 2, under every command instead of a traceback."""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kvwire.errors import ModelLoadError
from kvwire.validate.config import ConfigError

if TYPE_CHECKING:
    from kvwire.model.config import ModelConfig
    from kvwire.model.llama import LlamaModel
    from kvwire.model.tokenizer import Tokenizer


def _model_flags(args: argparse.Namespace) -> argparse.Namespace:
    """The model flags model_args reads; validate has --model and --device only (real weights, auto format)."""
    return argparse.Namespace(model=args.model, load_format="auto", model_shape=None, device=args.device)


def load_config(args: argparse.Namespace) -> ModelConfig:
    """The model's config (no weights): the first read of --model, so a bad one fails before anything runs."""
    from kvwire.commands.model_args import config_from_args

    return config_from_args(_model_flags(args))


def load_tokenizer(args: argparse.Namespace) -> Tokenizer:
    """The tokenizer alone (no weights): prompts are sized with it before the model loads."""
    from kvwire.model import registry

    try:
        tokenizer = registry.load_tokenizer(args.model)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise ModelLoadError(f"model {args.model}: cannot read its tokenizer ({exc})") from exc
    if tokenizer is None:
        raise ConfigError(f"model {args.model} has no tokenizer; validation needs text")
    return tokenizer


def load_model(args: argparse.Namespace) -> tuple[LlamaModel, Tokenizer | None]:
    """(model, tokenizer) on --device, for the in-process engine."""
    from kvwire.commands.model_args import load_from_args

    return load_from_args(_model_flags(args))
