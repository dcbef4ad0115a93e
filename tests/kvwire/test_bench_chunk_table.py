"""`kvwire bench chunk`'s table: the paged kernel, the gathered path's best backend, and what the engine takes."""
from kvwire.bench import chunk


def row(**over):
    r = {"prefix": 32768, "chunk": 512, "format": "nvfp4", "tile": "64x128x4x2", "splits": 1, "ms": 1.1,
         "one_pass_ms": 1.1, "speedup_vs_one_pass": 1.0, "tflops": 249, "sdpa_causal_ms": 0.93,
         "sdpa_no_mask_ms": 0.46, "sdpa_ms": 0.46, "vs_sdpa": 0.42, "rel_err": 1.3e-3,
         "gathered_ms": {"cudnn": 0.56, "flash": 1.05, "efficient": None}, "engine_path": "gathered",
         "engine_ms": 0.56, "engine_vs_sdpa": 0.46 / 0.56}
    r.update(over)
    return r


def table(*rows):
    return chunk.format_table({"device": "GPU", "shape": {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128,
                                                         "page_size": 16}, "rows": list(rows)})


def test_table_names_the_fastest_backend_and_the_engine_path():
    line = table(row()).splitlines()[-1]
    assert "| 0.560 (cudnn) | 0.82x | gathered | 0.82x |" in line


def test_table_without_the_gathered_path():
    line = table(row(gathered_ms={}, engine_path="paged", engine_ms=1.1, engine_vs_sdpa=0.42)).splitlines()[-1]
    assert line.endswith("| - | - | paged | 0.42x |")


def test_table_names_a_key_run_count():
    line = table(row(gathered_ms={"cudnn": 0.9, "cudnn/4": 0.5})).splitlines()[-1]
    assert "| 0.500 (cudnn/4) | 0.92x |" in line


def test_key_splits_flag():
    import pytest

    from kvwire.errors import UsageError
    assert chunk._key_splits("auto") == []
    assert chunk._key_splits("1, 2,8") == [1, 2, 8]
    for bad in ("0,2", "two", ""):
        with pytest.raises(UsageError, match="--key-splits"):
            chunk._key_splits(bad)
    assert chunk.gathered_label("cudnn", 1) == "cudnn" and chunk.gathered_label("flash", 4) == "flash/4"
