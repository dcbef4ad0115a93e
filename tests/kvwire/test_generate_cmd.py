"""`kvwire generate` with random weights: only SmolLM2's shape has a tokenizer, and another shape is
refused before its weights are allocated (llama-3-8b's would be about 32 GB on the CPU)."""
import resource
import subprocess
import sys

from tests.kvwire.test_cli import assert_one_line_error


def _limited() -> None:
    """An 8 GB address-space cap: allocating llama-3-8b's weights would fail under it."""
    resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))


def test_a_dummy_shape_without_a_tokenizer_is_refused_before_loading():
    r = subprocess.run([sys.executable, "-m", "kvwire.cli", "generate", "--load-format", "dummy", "--model-shape",
                        "llama-3-8b", "--device", "cpu", "hi"], capture_output=True, text=True, timeout=120,
                       preexec_fn=_limited)
    assert_one_line_error(r, "llama-3-8b", "no tokenizer", "smollm2-135m")


def test_pool_without_router_is_refused():
    r = subprocess.run([sys.executable, "-m", "kvwire.cli", "generate", "--pool", "smollm2-bf16", "hi"],
                       capture_output=True, text=True, timeout=120)
    assert_one_line_error(r, "--pool", "--router")
