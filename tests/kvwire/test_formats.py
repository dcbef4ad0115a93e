import pytest

from kvwire.formats import (
    ALIGN, LINE, KVFormat, PageFormat, UnknownFormatError, listed_formats,
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
    assert smol("bf16").hash == "906739d7ca814a17"


def test_dict_roundtrip_and_malformed():
    f = smol("fp8-head/nvfp4")
    assert PageFormat.from_dict(f.to_dict()) == f
    with pytest.raises(ValueError, match="malformed"):
        PageFormat.from_dict({"key": ["fp8"]})
    d = f.to_dict() | {"version": 99}
    with pytest.raises(ValueError, match="version 99"):
        PageFormat.from_dict(d)
    with pytest.raises(ValueError, match="version 1 is not readable here.*same kvwire release"):
        PageFormat.from_dict(f.to_dict() | {"version": 1})


@pytest.mark.parametrize("field, bad", [("head_dim", 0), ("head_dim", -128), ("page_size", "16"),
                                        ("page_size", 16.9), ("num_kv_heads", True), ("num_layers", 10**6),
                                        ("head_dim", 2**30)])
def test_impossible_or_non_integer_shapes_are_malformed(field, bad):
    """A description off the wire (a peer's handshake) is checked before its layout is built:
    10**6 layers took 13 s and 3 GiB there, and head_dim 0 or "16" used to pass."""
    with pytest.raises(ValueError, match="malformed"):
        PageFormat.from_dict(smol("fp8-token/nvfp4").to_dict() | {field: bad})


@pytest.mark.parametrize("shape", [SMOL, dict(page_size=16, num_layers=2, num_kv_heads=8, head_dim=128),
                                   dict(page_size=3, num_layers=3, num_kv_heads=1, head_dim=16)])
@pytest.mark.parametrize("name", ["fp8-token/nvfp4", "fp8-page/nvfp4", "bf16/fp8-token", "nvfp4"])
def test_layout_sections_are_disjoint_aligned_and_cover_the_page(name, shape):
    f = PageFormat(KVFormat.parse(name), **shape)
    spans, groups = [], []
    for layer in range(f.num_layers):
        for part in (0, 1):
            for sec_name, _, _ in f.part_format(part).sections(f.page_size, f.num_kv_heads, f.head_dim):
                s = f.section(layer, part, sec_name)
                assert s.offset % (LINE if sec_name == "data" else ALIGN) == 0
                spans.append((s.offset, s.offset + s.nbytes))
                groups.append((s.offset, sec_name))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert f.page_bytes % LINE == 0 and spans[-1][1] <= f.page_bytes < spans[-1][1] + LINE
    # data first, then per-token scales, then per-head scales
    rank = {"data": 0, "token_scale": 1, "block_scale": 1, "page_scale": 2, "global_scale": 2}
    order = [rank[n] for _, n in sorted(groups)]
    assert order == sorted(order)
    for part in (0, 1):                     # each section repeats at a fixed layer stride
        for sec_name, _, _ in f.part_format(part).sections(f.page_size, f.num_kv_heads, f.head_dim):
            stride = f.layer_stride(part, sec_name)
            assert stride > 0
            assert [f.section(layer, part, sec_name).offset for layer in range(f.num_layers)] == [
                f.section(0, part, sec_name).offset + layer * stride for layer in range(f.num_layers)]
    with pytest.raises(KeyError, match="no section 'tensor_scale'"):
        f.section(0, 0, "tensor_scale")


def test_bench_shape_keeps_each_heads_slices_within_lines():
    """At 8 KV heads, D = 128 (kvwire bench attention) no head's slice of a data or per-token
    scale section crosses a 128-byte line it need not cross (version 1's 16-byte packing did)."""
    for name in ("fp8-token/nvfp4", "fp8-tensor/nvfp4", "nvfp4", "fp8-token"):
        f = PageFormat(KVFormat.parse(name), 16, 1, 8, 128)
        assert f.page_bytes % LINE == 0
        for part in (0, 1):
            for sec_name, shape, _ in f.part_format(part).sections(16, 8, 128):
                s = f.section(0, part, sec_name)
                per_head = s.nbytes // shape[0]
                if per_head >= 64:
                    assert all((s.offset + h * per_head) % min(per_head, LINE) == 0 for h in range(8))


def test_nvfp4_needs_head_dim_multiple_of_16():
    with pytest.raises(ValueError, match="divisible by 16"):
        PageFormat(KVFormat.parse("nvfp4"), 16, 2, 2, 40)
