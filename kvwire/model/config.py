"""Shape and hyper-parameters of a Llama-family decoder.

One frozen record describes every model kvwire serves, whatever it was loaded from (GGUF, a
Hugging Face directory or random "dummy" weights), so that the engine, the KV page allocator and
the kernels size themselves from a single source of truth.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1-style frequency-dependent RoPE stretching (HF ``rope_type: llama3``).

    Kept as its own record because it changes the inverse frequencies, and therefore the K values
    that end up in the cache: two models differing only here are not interchangeable.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int

    def __post_init__(self) -> None:
        if self.factor <= 0:
            raise ValueError(f"rope scaling factor must be > 0, got {self.factor}")
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                "rope scaling needs high_freq_factor > low_freq_factor, got "
                f"{self.high_freq_factor} <= {self.low_freq_factor}"
            )
        if self.low_freq_factor <= 0 or self.original_max_position <= 0:
            raise ValueError("rope scaling low_freq_factor and original_max_position must be > 0")


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to build a :class:`kvwire.model.llama.LlamaModel` and size its KV cache."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rope_scaling: Llama3RopeScaling | None
    rms_norm_eps: float
    max_context: int
    tie_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        positive = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "max_context": self.max_context,
        }
        for key, value in positive.items():
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError("rope_theta and rms_norm_eps must be > 0")
        if not isinstance(self.eos_token_ids, tuple):
            raise ValueError(f"eos_token_ids must be a tuple, got {type(self.eos_token_ids).__name__}")
        ids = list(self.eos_token_ids) + ([self.bos_token_id] if self.bos_token_id is not None else [])
        for token_id in ids:
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(f"special token id {token_id} outside vocab of {self.vocab_size}")

    @property
    def q_size(self) -> int:
        """Width of the query projection output."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (or value) projection output."""
        return self.num_kv_heads * self.head_dim

    @property
    def num_params(self) -> int:
        """Parameter count, for logging and memory planning."""
        per_layer = (
            self.hidden_size * (self.q_size + 2 * self.kv_size)
            + self.q_size * self.hidden_size
            + 3 * self.hidden_size * self.intermediate_size
            + 2 * self.hidden_size
        )
        head = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.vocab_size * self.hidden_size + self.num_layers * per_layer + self.hidden_size + head


SHAPES: dict[str, ModelConfig] = {
    "llama-3-8b": ModelConfig(
        name="llama-3-8b",
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        rope_scaling=Llama3RopeScaling(
            factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192
        ),
        rms_norm_eps=1e-5,
        max_context=131072,
        tie_embeddings=False,
        bos_token_id=128000,
        eos_token_ids=(128001, 128008, 128009),
    ),
    "smollm2-135m": ModelConfig(
        name="smollm2-135m",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        rope_theta=100000.0,
        rope_scaling=None,
        rms_norm_eps=1e-5,
        max_context=8192,
        tie_embeddings=True,
        bos_token_id=1,
        eos_token_ids=(2,),
    ),
}
