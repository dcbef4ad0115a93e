import pytest

from kvwire.formats import (
    ALIGN, KVFormat, PageFormat, UnknownFormatError, listed_formats,
)

SMOL = dict(page_size=16, num_layers=30, num_kv_heads=3, head_dim=64)


def smol(name: str) -> PageFormat:
    return PageFormat(KVFormat.parse(name), **SMOL)


def test_smollm2_bytes_per_token():
    assert smol("bf16").bytes_per_token == 23040
    for gran in ("tensor", "head", "page", "token"):
        assert 0.50 <= smol(f"fp8-{gran}").ratio_to_bf16 <= 0.54
    assert 0.28 <= smol("nvfp4").ratio_to_bf16 <= 0.29
    mixed = smol("fp8-token/nvfp4").ratio_to_bf16
    assert smol("nvfp4").ratio_to_bf16 < mixed < smol("fp8-token").ratio_to_bf16


def test_names_roundtrip_and_mixed():
    for f in listed_formats(include_all_pairs=True):
        assert KVFormat.parse(f.name) == f
    f = KVFormat.parse("fp8-token/nvfp4")
    assert f.key.name == "fp8-token" and f.value.name == "nvfp4"
    assert KVFormat.parse("fp8-page/fp8-page").name == "fp8-page"


@pytest.mark.parametrize("bad", ["fp4", "fp8", "fp8-none", "bf16/", "a/b/c", "", "nvfp4-token"])
def test_unknown_format_lists_allowed(bad):
    with pytest.raises(UnknownFormatError, match="fp8-token"):
        KVFormat.parse(bad)


def test_hash_is_stable_and_distinguishes():
    assert smol("fp8-token").hash == smol("fp8-token").hash
    hashes = {smol(f.name).hash for f in listed_formats(include_all_pairs=True)}
    assert len(hashes) == len(listed_formats(include_all_pairs=True))
    assert PageFormat(KVFormat.parse("bf16"), 32, 30, 3, 64).hash != smol("bf16").hash
    # Pinned: the hash is part of the wire contract; changing it needs a FORMAT_VERSION bump.
    assert smol("bf16").hash == "d7ce04dbeb7b8dc3"


def test_dict_roundtrip_and_malformed():
    f = smol("fp8-head/nvfp4")
    assert PageFormat.from_dict(f.to_dict()) == f
    with pytest.raises(ValueError, match="malformed"):
        PageFormat.from_dict({"key": ["fp8"]})
    d = f.to_dict() | {"version": 99}
    with pytest.raises(ValueError, match="version 99"):
        PageFormat.from_dict(d)


def test_layout_sections_are_disjoint_aligned_and_cover_the_page():
    f = smol("fp8-token/nvfp4")
    spans = []
    for layer in range(f.num_layers):
        for part in (0, 1):
            for name, _, _ in f.part_format(part).sections(f.page_size, f.num_kv_heads, f.head_dim):
                s = f.section(layer, part, name)
                assert s.offset % ALIGN == 0
                spans.append((s.offset, s.offset + s.nbytes))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert spans[-1][1] <= f.page_bytes < spans[-1][1] + ALIGN
    with pytest.raises(KeyError):
        f.section(0, 0, "page_scale")


def test_nvfp4_needs_head_dim_multiple_of_16():
    with pytest.raises(ValueError, match="divisible by 16"):
        PageFormat(KVFormat.parse("nvfp4"), 16, 2, 2, 40)
