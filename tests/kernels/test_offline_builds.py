"""Every Triton kernel a GPU worker launches builds for every GPU its KV format is sold for
(kvwire.kernels.device_support): bf16 pages from Ampere (sm_80) on, FP8 and NVFP4 pages from Ada
(sm_89) on. Only an H200 is lent to this project, so this is how the older targets are checked:
each launcher runs on the CPU in its GPU mode (``_hw``) with its kernel replaced by a recorder, and
the recorded launch is compiled for the target by Triton's compiler and ptxas
(``offline_build``). It found the chunk kernel handing an fp8e4nv pointer to sm_80 builds, which
Triton rejects, so bf16 prefill could not have run on an A100."""
import pytest
import torch

from kvwire.kernels import chunk_attention, chunk_plan, model_ops, page_gather, paged_decode, quantize
from kvwire.kernels._common import interpreting

from .helpers import decode_problem, make_format, make_pool
from .offline_build import Recorder, build_all

pytestmark = pytest.mark.skipif(not interpreting(), reason="records launches in the interpreter (CPU runs)")

AMPERE, ADA, HOPPER, BLACKWELL = (8, 0), (8, 9), (9, 0), (10, 0)


def recorded(monkeypatch, module, *names) -> list[Recorder]:
    recs = [Recorder(getattr(module, name)) for name in names]
    for name, rec in zip(names, recs):
        monkeypatch.setattr(module, name, rec)
    return recs


GPU = torch.device("cuda", 0)


def chunk_launches(monkeypatch, fmt: str, fp8_cores: bool, head_dim: int = 128) -> list:
    # the launch plan a GPU gets (tile, FP8 tensor cores), though the tensors are on the CPU
    monkeypatch.setattr(chunk_attention, "fp8_tensor_cores", lambda dev: fp8_cores)
    monkeypatch.setattr(chunk_attention, "default_tile", lambda f, dev: chunk_plan.default_tile(f, GPU))
    recs = recorded(monkeypatch, chunk_attention, "_chunk_kernel", "_chunk_merge_kernel")
    gen = torch.Generator().manual_seed(0)
    f = make_format(fmt, page_size=16, layers=2, heads=2, head_dim=head_dim)
    storage, static = make_pool(f, 4, gen)
    q = torch.randn((20, 8, head_dim), generator=gen).to(torch.bfloat16)
    kv = torch.randn((20, 2, head_dim), generator=gen).to(torch.bfloat16)
    chunk_attention.paged_chunk_attention(q, torch.arange(32, 52), storage, f, 1, torch.arange(2), kv, kv, 32,
                                          static, num_splits=2, _hw=True)
    return [launch for rec in recs for launch in rec.launches]


def decode_launches(monkeypatch, fmt: str, heads: int = 8, head_dim: int = 128) -> list:
    config = paged_decode.default_config           # the GPU's tile and stages, for an H200's 132 SMs
    monkeypatch.setattr(paged_decode, "interpreting", lambda: False)
    monkeypatch.setattr(paged_decode, "num_sms", lambda dev: 132)
    monkeypatch.setattr(paged_decode, "default_config", lambda f, *a, **kw: config(f, a[0], a[1], GPU, *a[3:], **kw))
    recs = recorded(monkeypatch, paged_decode, "_decode_split_kernel", "_decode_reduce_kernel")
    paged_decode.paged_decode_attention(*decode_problem("cpu", fmt, heads=heads, head_dim=head_dim, num_pages=(3, 1),
                                                        tail_len=(5, 16)), backend="triton", _hw=True)
    return [launch for rec in recs for launch in rec.launches]


def quantize_launches(monkeypatch, fmt: str, head_dim: int = 128) -> list:
    (rec,) = recorded(monkeypatch, quantize, "_quantize_kernel")
    gen = torch.Generator().manual_seed(1)
    f = make_format(fmt, page_size=16, layers=2, heads=2, head_dim=head_dim)
    storage = torch.zeros((4, f.page_bytes), dtype=torch.uint8)
    x = torch.randn((2, 16, 2, head_dim), generator=gen).to(torch.bfloat16)
    static = torch.full((2,), 0.01)
    for part in (0, 1):
        quantize.write_pages(storage, f, 1, part, torch.tensor([3, 0]), x, static, backend="triton", _hw_cast=True)
    return rec.launches


def gather_launches(monkeypatch, fmt: str, head_dim: int = 128) -> list:
    (rec,) = recorded(monkeypatch, page_gather, "_gather_kernel")
    f = make_format(fmt, page_size=16, layers=2, heads=2, head_dim=head_dim)
    storage, static = make_pool(f, 4, torch.Generator().manual_seed(3))
    page_gather.gather_pages(storage, f, 1, torch.tensor([3, 0]), static, _hw=True)
    return rec.launches


def model_op_launches(monkeypatch) -> list:
    """RMSNorm and RoPE as the model runs them on a GPU: bf16 activations, and fp32 ones (a model
    loaded in float32 keeps the fused ops too, ``model_ops.fused_ops_for``)."""
    recs = recorded(monkeypatch, model_ops, "_add_rms_norm_kernel", "_rope_split_kernel")
    gen = torch.Generator().manual_seed(2)
    for dtype in (torch.bfloat16, torch.float32):
        h = torch.randn((5, 576), generator=gen).to(dtype)
        model_ops.add_rms_norm(h, h.clone(), torch.ones(576, dtype=dtype), 1e-5)
        cos = torch.randn((5, 64), generator=gen).to(dtype)
        model_ops.rope_split(torch.randn((5, 15 * 64), generator=gen).to(dtype), cos, cos.clone(), 9, 3, 64)
    return [launch for rec in recs for launch in rec.launches]


def assert_builds(launches: list, capability: tuple[int, int]) -> list[dict]:
    assert launches, "nothing was launched"
    results = build_all([(launch, capability) for launch in launches])
    failed = [f"{launch.kernel.fn.__name__}: {res['error']}"
              for launch, res in zip(launches, results) if "error" in res]
    assert not failed, f"does not build for sm_{capability[0]}{capability[1]}:\n" + "\n".join(failed)
    return results


@pytest.mark.parametrize("capability", [AMPERE, HOPPER])
def test_bf16_pages_build_from_ampere_on(monkeypatch, capability):
    launches = (chunk_launches(monkeypatch, "bf16", fp8_cores=False) + decode_launches(monkeypatch, "bf16")
                + quantize_launches(monkeypatch, "bf16") + model_op_launches(monkeypatch))
    assert {launch.kernel.fn.__name__ for launch in launches} == {
        "_chunk_kernel", "_chunk_merge_kernel", "_decode_split_kernel", "_decode_reduce_kernel", "_quantize_kernel",
        "_add_rms_norm_kernel", "_rope_split_kernel"}
    results = assert_builds(launches, capability)
    if capability == AMPERE:      # the chunk tile fits an A10's 99 KiB (an A100 has 163)
        assert results[0]["shared"] <= 99 * 1024


# head_dim 64 is SmolLM2's (the default model), 128 the common one; Hopper with 64 runs in the GPU tests
@pytest.mark.parametrize("capability,head_dim", [(ADA, 64), (ADA, 128), (HOPPER, 128)], ids=["ada-64", "ada-128",
                                                                                         "hopper-128"])
@pytest.mark.parametrize("fmt", ["fp8-token/nvfp4", "nvfp4", "fp8-tensor"])
def test_compact_pages_build_from_ada_on(monkeypatch, fmt, capability, head_dim):
    # Triton's side of compact pages: chunk attention (FP8 keys on E4M3 tensor cores, as on sm_89+),
    # the split decode kernel (heads the CUDA kernel does not cover), quantise from fp16/fp32 input
    launches = (chunk_launches(monkeypatch, fmt, fp8_cores=True, head_dim=head_dim)
                + decode_launches(monkeypatch, fmt) + quantize_launches(monkeypatch, fmt, head_dim))
    assert_builds(launches, capability)


@pytest.mark.parametrize("fmt", ["bf16", "fp8-token/nvfp4"])
def test_blackwell_builds(monkeypatch, fmt):
    """sm_100 passes every capability check (device_support, the CUDA kernels' sm_89+ and sm_90+
    paths), so a B200 would run all of this: the default pages and the likely sweet spot."""
    launches = (chunk_launches(monkeypatch, fmt, fp8_cores=fmt != "bf16") + decode_launches(monkeypatch, fmt)
                + quantize_launches(monkeypatch, fmt))
    assert_builds(launches, BLACKWELL)


def test_the_launches_built_are_the_gpus(monkeypatch):
    launches = chunk_launches(monkeypatch, "nvfp4", fp8_cores=True)
    rows, bn, warps, stages = chunk_plan.COMPACT_TILE
    assert (launches[0].kwargs["BN"], launches[0].kwargs["num_warps"], launches[0].kwargs["num_stages"]) == (
        bn, warps, stages), "the recorder saw the interpreter's tile, not the GPU's"
    split = decode_launches(monkeypatch, "nvfp4")[0]
    assert (split.kwargs["BN"], split.kwargs["num_stages"], split.kwargs["HW"]) == (128, 3, True)


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8-token/nvfp4"])
def test_small_heads_build(monkeypatch, fmt):
    """Heads of 16 (the tests' tiny models) take the Triton decode kernel on the GPU; its NVFP4 half
    tiles once came out 8 wide there, which tl.dot rejects on a GPU and the interpreter allowed
    (found on the H200, 2026-12-05), and the 4-warp chunk tile could not be laid out for them
    (2026-12-04). The build catches both without a GPU."""
    assert_builds(decode_launches(monkeypatch, fmt, heads=2, head_dim=16)
                  + chunk_launches(monkeypatch, fmt, fp8_cores=True, head_dim=16), HOPPER)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("fmt", ["bf16", "fp8-tensor", "nvfp4", "fp8-token/nvfp4"])
def test_gathered_prefix_builds_for_hopper(monkeypatch, fmt, head_dim):
    """The prefix gather (chunk_gathered), which the runner selects on Hopper only."""
    launches = gather_launches(monkeypatch, fmt, head_dim)
    assert len(launches) == 2 and launches[0].kwargs["HW"]
    assert_builds(launches, HOPPER)
