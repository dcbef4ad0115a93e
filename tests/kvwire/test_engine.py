"""The single-process engine on compact pages, with the real SmolLM2 model."""
import pytest

from kvwire.calibration import CALIBRATION_TEXT
from kvwire.engine import Engine, EngineConfig, InvalidRequestError
from kvwire.model.llama import generate_without_cache
from kvwire.sampling import SamplingParams

pytestmark = pytest.mark.slow


def engine_for(smollm2, fmt: str, **kw) -> Engine:
    model, tok = smollm2
    return Engine(model, EngineConfig(kv_format=fmt, **kw), calibration_ids=tok.encode(CALIBRATION_TEXT))


def test_bf16_pages_equal_full_recomputation_for_64_tokens(smollm2):
    model, tok = smollm2
    ids = tok.encode("The capital of France is")
    want = generate_without_cache(model, ids, 64)
    engine = engine_for(smollm2, "bf16", page_size=4, chunk_size=4)  # many pages, several chunks
    gen = engine.generate(ids, SamplingParams(max_tokens=64))
    got = list(gen)
    assert got == want
    assert "Paris" in tok.decode(got[:4])
    assert gen.summary.pages_written == (len(ids) + len(got) - 1 - 1) // 4


def test_chunking_does_not_change_tokens(smollm2):
    _, tok = smollm2
    ids = tok.encode("Caches trade memory for time. " * 12 + "In one sentence, a cache is")
    runs = [list(engine_for(smollm2, "fp8-token/nvfp4", chunk_size=c).generate(ids, SamplingParams(max_tokens=12)))
            for c in (32, 512)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("fmt", ["bf16", "fp8-page", "nvfp4"])
def test_prompt_run_twice_reuses_full_pages_and_gives_same_tokens(smollm2, fmt):
    _, tok = smollm2
    engine = engine_for(smollm2, fmt)
    ids = tok.encode("The history of the printing press. " * 10 + "Summarise it:")
    first = engine.generate(ids, SamplingParams(max_tokens=10))
    a = list(first)
    second = engine.generate(ids, SamplingParams(max_tokens=10))
    b = list(second)
    assert a == b
    assert first.summary.prefix_pages_reused == 0
    assert second.summary.prefix_pages_reused == (len(ids) - 1) // 16 > 0
    assert second.summary.pages_written < first.summary.pages_written
    c = engine.kv.pool.counters()
    assert c.used == 0 and c.cached > 0 and engine.kv.tails.free_slots == engine.config.max_sequences


def test_kv_bytes_summary(smollm2):
    _, tok = smollm2
    engine = engine_for(smollm2, "fp8-token")
    gen = engine.generate(tok.encode("word " * 70), SamplingParams(max_tokens=3, stop_at_eos=False))
    list(gen)
    s = gen.summary
    pages = s.pages_written
    tokens = s.prompt_tokens + s.completion_tokens - 1
    pf = engine.page_format
    assert s.kv_bytes == pages * pf.page_bytes + (tokens - pages * 16) * pf.bf16_bytes_per_token
    assert s.kv_bf16_bytes == tokens * pf.bf16_bytes_per_token
    assert s.kv_bytes < 0.7 * s.kv_bf16_bytes


def test_abort_frees_pages(smollm2):
    _, tok = smollm2
    engine = engine_for(smollm2, "nvfp4")
    gen = engine.generate(tok.encode("Count: one two three four five six seven eight nine ten " * 4),
                          SamplingParams(max_tokens=50, stop_at_eos=False))
    it = iter(gen)
    next(it)
    next(it)
    assert engine.kv.pool.counters().used > 0
    gen.close()
    assert engine.kv.pool.counters().used == 0
    assert gen.summary.finish_reason == "aborted"


def test_invalid_requests(smollm2):
    engine = engine_for(smollm2, "bf16")
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.generate([], SamplingParams())
    with pytest.raises(InvalidRequestError, match="at most 8191"):
        engine.generate([5] * 8192, SamplingParams())
    with pytest.raises(InvalidRequestError, match="token ids"):
        engine.generate([49152], SamplingParams())
