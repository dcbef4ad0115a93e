"""gather_pages and gathered_chunk_attention on the CPU (Triton interpreter) and the GPU, against
their torch references: the gathered bf16 prefix value-identical to the decoded pages, the chunk
result close to ``paged_chunk_reference``."""
import pytest
import torch

from kvwire.kernels._common import interpreting
from kvwire.kernels.chunk_attention import paged_chunk_reference
from kvwire.kernels.chunk_gathered import PrefixBackend, gathered_chunk_attention, prefix_attention
from kvwire.kernels.page_gather import gather_pages, gather_pages_reference

from .helpers import ALL_UNIFORM, MIXED, make_format, make_pool, rel_err

ON_GPU = torch.cuda.is_available()
DEV = "cuda" if ON_GPU else "cpu"
# compiled on a GPU (in the GPU suite's -m gpu), interpreted on the CPU
kernels_run = pytest.mark.gpu if ON_GPU else pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1")
gpu = [pytest.mark.gpu, pytest.mark.skipif(not ON_GPU, reason="needs CUDA")]


def gather_case(name, heads, head_dim, n_pages, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    f = make_format(name, page_size=16, layers=2, heads=heads, head_dim=head_dim)
    storage, static = make_pool(f, n_pages + 7, gen, DEV, empty=True)
    ids = torch.randperm(n_pages + 7, device=DEV, generator=gen)[:n_pages]
    out = torch.full((2, heads, n_pages * 16, head_dim), float("nan"), dtype=torch.bfloat16, device=DEV)
    gather_pages(storage, f, 1, ids, static, out)
    ref = gather_pages_reference(storage, f, 1, ids, static)
    # value-identical: one fp32 product rounded to nearest even, as the torch decoder rounds (zeros'
    # signs may differ: the GPU's E2M1 placement keeps -0, the interpreter's decoding does not)
    assert torch.equal(out.float(), ref.float())


@kernels_run
@pytest.mark.parametrize("name", ALL_UNIFORM + MIXED)
def test_gather_pages_matches_decoded_pages(name):
    gather_case(name, heads=3, head_dim=64, n_pages=5 if interpreting() else 300)


@kernels_run
@pytest.mark.parametrize("name", ["fp8-token", "nvfp4/fp8-head"])
def test_gather_pages_head_dim_128_and_a_partial_program(name):
    gather_case(name, heads=2, head_dim=128, n_pages=3, seed=1)       # 48 tokens: under one program's 64


def test_gather_pages_rejects_a_wrong_out():
    f = make_format("fp8-token")
    storage, static = make_pool(f, 4, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="out must be contiguous bf16"):
        gather_pages(storage, f, 0, torch.arange(2), static, torch.empty((2, 2, 16, 64), dtype=torch.bfloat16))


def test_prefix_attention_returns_out_and_log_sum_exp():
    gen = torch.Generator().manual_seed(5)
    q = torch.randn((7, 6, 32), generator=gen).to(torch.bfloat16)
    k, v = (torch.randn((2, 40, 32), generator=gen).to(torch.bfloat16) for _ in range(2))
    out, lse = prefix_attention(q, k, v)
    assert out.shape == (1, 7, 6, 32) and lse.shape == (1, 7, 6)
    out, lse = out[0], lse[0]
    s = torch.einsum("nhd,htd->nht", q.float().view(7, 2, 3, 32).reshape(7, 6, 32),
                     k.float().repeat_interleave(3, 0)) / 32 ** 0.5
    assert torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-3)
    ref = torch.einsum("nht,htd->nhd", s.softmax(-1), v.float().repeat_interleave(3, 0))
    assert rel_err(out, ref) < 1e-2


def test_prefix_attention_in_key_runs_is_one_run():
    # 4 runs of 10 keys, each its own head: 4 partials whose log-sum-exp merge is the one run
    gen = torch.Generator().manual_seed(6)
    q = torch.randn((5, 8, 32), generator=gen).to(torch.bfloat16)
    k, v = (torch.randn((2, 40, 32), generator=gen).to(torch.bfloat16) for _ in range(2))
    out1, lse1 = prefix_attention(q, k, v)
    out4, lse4 = prefix_attention(q, k, v, key_splits=4)
    assert out4.shape == (4, 5, 8, 32) and lse4.shape == (4, 5, 8)
    total = torch.logsumexp(lse4, dim=0)
    merged = (out4.float() * torch.exp(lse4 - total)[..., None]).sum(0)
    assert torch.allclose(total, lse1[0], atol=1e-4)
    assert rel_err(merged, out1[0]) < 1e-2
    for run in range(4):        # each run is attention over its own 10 keys
        o, lse = prefix_attention(q, k[:, run * 10:(run + 1) * 10], v[:, run * 10:(run + 1) * 10])
        assert torch.allclose(lse4[run], lse[0], atol=1e-4) and rel_err(out4[run], o[0]) < 1e-2
    with pytest.raises(ValueError, match="divisor of the 40 keys"):
        prefix_attention(q, k, v, key_splits=3)


def chunk_case(name, gqa, heads, head_dim, prefix_pages, n, seed=0, backend=PrefixBackend.CUDNN, tol=1e-2,
               fallback=True, key_splits=None):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    f = make_format(name, page_size=16, layers=2, heads=heads, head_dim=head_dim)
    stored = prefix_pages + n // 16                  # the chunk's full pages are stored too, as the runner does
    storage, static = make_pool(f, stored + 9, gen, DEV, empty=True)
    ids = torch.randperm(stored + 9, device=DEV, generator=gen)[:stored]
    open_start = prefix_pages * 16
    ko, vo = (torch.randn((n, heads, head_dim), device=DEV, generator=gen).to(torch.bfloat16) for _ in range(2))
    pos = torch.arange(open_start, open_start + n, device=DEV)
    q = torch.randn((n, gqa * heads, head_dim), device=DEV, generator=gen).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    gathered_chunk_attention(q, pos, storage, f, 1, ids, ko, vo, open_start, static, out=out, backend=backend,
                             fallback=fallback, key_splits=key_splits)
    ref = paged_chunk_reference(q, pos, storage, f, 1, ids, ko, vo, open_start, static)
    assert not out.isnan().any(), "an output was left unwritten"
    err = rel_err(out, ref)
    assert err < tol, f"relative error {err:.2e}"


@kernels_run
@pytest.mark.parametrize("name", ["bf16", "fp8-token", "fp8-tensor", "nvfp4", "fp8-token/nvfp4", "nvfp4/fp8-page"])
def test_gathered_chunk_formats(name):
    # 4 prefix pages, then a 37-token chunk: two full pages of its own and a partly filled third
    chunk_case(name, gqa=4, heads=2, head_dim=64, prefix_pages=4, n=37)


@kernels_run
@pytest.mark.parametrize("gqa", [1, 3, 8])
def test_gathered_chunk_gqa_ratios(gqa):
    chunk_case("fp8-token/nvfp4", gqa=gqa, heads=2, head_dim=64, prefix_pages=3, n=21, seed=gqa)


@kernels_run
def test_gathered_chunk_prefix_in_pieces(monkeypatch):
    # 2 pages per piece: a 5-page prefix goes as 2 + 2 + 1, merged by log-sum-exp
    f = make_format("fp8-token", heads=2, head_dim=64)
    monkeypatch.setattr("kvwire.kernels.chunk_gathered.GATHER_MAX_BYTES", 2 * f.num_kv_heads * 16 * 64 * 2 * 2)
    chunk_case("fp8-token", gqa=3, heads=2, head_dim=64, prefix_pages=5, n=20, seed=7)


@kernels_run
@pytest.mark.parametrize("key_splits", [2, 3])
def test_gathered_chunk_in_key_runs(key_splits):
    # 7 prefix pages: 6 go to cuDNN in 2 or 3 runs, the 7th (3 runs: 1 over) to the paged kernel
    chunk_case("nvfp4", gqa=3, heads=2, head_dim=64, prefix_pages=7, n=20, seed=key_splits, key_splits=key_splits)


@kernels_run
def test_gathered_chunk_in_key_runs_and_pieces(monkeypatch):
    # 5 pages per piece, cut to 4 for 2 runs: a 9-page prefix goes as 4 + 4 pages, the 9th paged
    f = make_format("fp8-token", heads=2, head_dim=64)
    monkeypatch.setattr("kvwire.kernels.chunk_gathered.GATHER_MAX_BYTES", 5 * f.num_kv_heads * 16 * 64 * 2 * 2)
    chunk_case("fp8-token", gqa=4, heads=2, head_dim=64, prefix_pages=9, n=20, seed=9, key_splits=2)


@kernels_run
def test_a_refused_prefix_kernel_falls_back_to_the_paged_one(monkeypatch, caplog):
    from kvwire.kernels import chunk_gathered
    calls = []

    def refuse(*args):
        calls.append(1)
        raise RuntimeError("No available kernel")
    monkeypatch.setattr(chunk_gathered, "prefix_attention", refuse)
    monkeypatch.setattr(chunk_gathered, "_REFUSED", set())
    chunk_case("nvfp4", gqa=4, heads=2, head_dim=64, prefix_pages=3, n=20)
    chunk_case("nvfp4", gqa=4, heads=2, head_dim=64, prefix_pages=3, n=20, seed=1)
    assert len(calls) == 1, "a refused backend was asked again"
    assert "refused the gathered prefix" in caplog.text
    monkeypatch.setattr(chunk_gathered, "_REFUSED", set())
    with pytest.raises(RuntimeError, match="No available kernel"):     # as the benchmark asks
        chunk_case("nvfp4", gqa=4, heads=2, head_dim=64, prefix_pages=3, n=20, fallback=False)
    assert not chunk_gathered._REFUSED


@kernels_run
def test_gathered_chunk_without_a_prefix_is_the_paged_kernel():
    chunk_case("nvfp4", gqa=4, heads=2, head_dim=64, prefix_pages=0, n=40)


@pytest.mark.skipif(ON_GPU, reason="CPU tensors without the interpreter")
@pytest.mark.parametrize("name", ["fp8-token", "nvfp4"])
def test_gathered_chunk_without_triton_runs_the_reference(name, monkeypatch):
    # as on a CPU machine without TRITON_INTERPRET: no kernel, no prefix partial, the torch reference
    monkeypatch.setattr("kvwire.kernels.chunk_gathered.use_triton", lambda t: False)
    monkeypatch.setattr("kvwire.kernels.chunk_attention.use_triton", lambda t: False)
    monkeypatch.setattr("kvwire.kernels.chunk_gathered.gather_pages", None)
    chunk_case(name, gqa=3, heads=2, head_dim=32, prefix_pages=2, n=18, tol=1e-6)


@pytest.mark.parametrize("name", ["fp8-token", "fp8-tensor", "nvfp4", "fp8-token/nvfp4", "bf16"])
@pytest.mark.parametrize("backend", list(PrefixBackend), ids=[b.value for b in PrefixBackend])
@pytest.mark.parametrize("n", [512, 100])
def test_gpu_gathered_chunk(name, backend, n):
    chunk_case(name, gqa=4, heads=8, head_dim=128, prefix_pages=300, n=n, backend=backend)


@pytest.mark.parametrize("name", ["fp8-token", "nvfp4", "bf16"])
@pytest.mark.parametrize("backend", list(PrefixBackend), ids=[b.value for b in PrefixBackend])
@pytest.mark.parametrize("key_splits", [2, 8])
def test_gpu_gathered_chunk_in_key_runs(name, backend, key_splits):
    # 300 prefix pages: 8 runs leave 4 pages to the paged kernel
    chunk_case(name, gqa=4, heads=8, head_dim=128, prefix_pages=300, n=64, backend=backend, key_splits=key_splits)


for _mark in gpu:
    test_gpu_gathered_chunk = _mark(test_gpu_gathered_chunk)
    test_gpu_gathered_chunk_in_key_runs = _mark(test_gpu_gathered_chunk_in_key_runs)


@pytest.mark.parametrize("capability, queries, prefix, expect", [
    ((9, 0), 512, 32768, True),      # 512 x 32 rows = 128 tiles on 132 SMs, a long prefix
    ((9, 0), 64, 32768, False),      # 16 tiles: runs of 8k would give 64, runs of 4k lost
    ((9, 0), 512, 2048, False),      # too short a prefix to repay the bf16 write
    ((8, 0), 512, 32768, False),     # not measured off Hopper
])
def test_gathered_prefix_policy(monkeypatch, capability, queries, prefix, expect):
    from kvwire.kernels import chunk_plan
    monkeypatch.setattr(chunk_plan, "interpreting", lambda: False)
    monkeypatch.setattr(chunk_plan, "num_sms", lambda dev: 132)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev: capability)
    for name in ("fp8-tensor", "nvfp4", "bf16"):
        f = make_format(name, heads=8, head_dim=128)
        assert chunk_plan.gathered_prefix_pays(queries, 32, prefix, f, torch.device("cuda", 0)) is expect
        assert not chunk_plan.gathered_prefix_pays(queries, 32, prefix, f, torch.device("cpu"))


@pytest.mark.parametrize("name, queries, prefix, splits, pays", [
    ("fp8-tensor", 512, 32768, 1, True),      # 128 tiles already
    ("nvfp4", 256, 16384, 2, True),           # 64 tiles x 2 runs of 8k (NVFP4: runs of 8k repay)
    ("fp8-token", 256, 16384, 2, True),       # so do token-scaled FP8 pages
    ("fp8-page", 256, 16384, 1, False),       # not page-scaled ones (runs of 16k)
    ("fp8-token/nvfp4", 128, 32768, 4, True),  # 32 tiles x 4 runs of 8k
    ("bf16", 256, 32768, 2, True),            # other formats: runs of 16k
    ("bf16", 256, 16384, 1, False),           # runs of 8k lost for them
    ("fp8-tensor", 128, 32768, 2, False),     # 2 runs of 16k give 64 tiles only
    ("nvfp4", 64, 32768, 4, False),           # 16 tiles x 4 runs of 8k: still half the GPU
    ("nvfp4", 16, 1 << 20, 8, False),         # 4 tiles: the cap of 8 runs is not enough
])
def test_prefix_key_splits_fill_the_grid(monkeypatch, name, queries, prefix, splits, pays):
    from kvwire.kernels import chunk_plan
    monkeypatch.setattr(chunk_plan, "interpreting", lambda: False)
    monkeypatch.setattr(chunk_plan, "num_sms", lambda dev: 132)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev: (9, 0))
    dev, f = torch.device("cuda", 0), make_format(name, heads=8, head_dim=128)
    assert chunk_plan.prefix_key_splits(queries, 32, prefix, f, dev) == splits
    assert chunk_plan.gathered_prefix_pays(queries, 32, prefix, f, dev) is pays
    assert chunk_plan.prefix_key_splits(queries, 32, prefix, f, torch.device("cpu")) == 1


def test_paged_chunk_attention_rejects_a_misshapen_prefix_partial():
    from kvwire.kernels.chunk_attention import paged_chunk_attention
    f = make_format("fp8-token", heads=2, head_dim=64)
    storage, static = make_pool(f, 4, torch.Generator().manual_seed(0))
    q = torch.randn((3, 4, 64)).to(torch.bfloat16)
    kv = torch.randn((3, 2, 64)).to(torch.bfloat16)
    for bad in ((torch.zeros(3, 4, 32), torch.zeros(3, 4)), (torch.zeros(2, 3, 4, 64), torch.zeros(3, 2, 4)),
                (torch.zeros(1, 1, 3, 4, 64), torch.zeros(1, 1, 3, 4))):
        with pytest.raises(ValueError, match="prefix_partial must be"):
            paged_chunk_attention(q, torch.arange(16, 19), storage, f, 0, torch.arange(1), kv, kv, 16, static,
                                  prefix_partial=bad)
