"""Model-selection flags shared by the subcommands, and loading from them."""
from __future__ import annotations

import argparse

import torch

from kvwire.errors import ModelLoadError, UsageError


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--model", default="smollm2", metavar="SOURCE",
                   help="'smollm2' (the packaged SmolLM2-135M-Instruct GGUF, default), a .gguf file, "
                        "or a Hugging Face directory (config.json + safetensors + tokenizer.json)")
    g.add_argument("--load-format", default="auto", choices=["auto", "gguf", "hf", "dummy"],
                   help="how to read --model; 'dummy' makes random weights at --model-shape (speed work)")
    g.add_argument("--model-shape", default=None, metavar="SHAPE",
                   help="shape for --load-format dummy, e.g. llama-3-8b or smollm2-135m")
    g.add_argument("--device", default="auto", help="'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1'")


def resolve_device(name: str) -> torch.device:
    """The --device flag as a torch device; a name torch does not parse, or CUDA where there is none, is a
    usage error (torch's own errors are a RuntimeError and an AssertionError deep in the first allocation)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                         f"numbered from 0")
    return dev


def config_from_args(args: argparse.Namespace):
    """The model's config only (no weights), for commands that need just the shape."""
    from kvwire.model.registry import load_model_config

    try:
        return load_model_config(args.model, load_format=args.load_format, model_shape=args.model_shape)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise ModelLoadError(_message(exc)) from exc


def _message(exc: Exception) -> str:
    """A KeyError's str() is the repr of its argument; show the plain text."""
    return exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)


def load_from_args(args: argparse.Namespace):
    """(model, tokenizer or None) for the flags; bad flags and missing files are user errors."""
    from kvwire.model.registry import load_model

    if args.load_format == "dummy" and not args.model_shape:
        raise UsageError("--load-format dummy needs --model-shape (e.g. llama-3-8b)")
    try:
        return load_model(args.model, load_format=args.load_format, model_shape=args.model_shape,
                          device=resolve_device(args.device))
    except (FileNotFoundError, KeyError, ValueError) as exc:  # what load_model raises for bad sources/shapes
        raise ModelLoadError(_message(exc)) from exc
