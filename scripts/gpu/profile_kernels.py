"""Run the CUDA decode and quantise kernels a few times each, for a profiler (ncu) to sample.

Usage (GPU machine, repo root): ncu ... python3 scripts/gpu/profile_kernels.py [FORMAT] [BxCTX] [VARIANT]
VARIANT: KEY=V,KEY=V overrides of paged_decode_cuda.tuning_for, or "default".
"""
import sys

import torch

from kvwire.bench.attention import build_problem, parse_shape
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels import paged_decode_cuda
from kvwire.kernels.paged_decode import paged_decode_attention
from kvwire.kernels.quantize import write_pages

name = sys.argv[1] if len(sys.argv) > 1 else "nvfp4"
batch, ctx = parse_shape(sys.argv[2] if len(sys.argv) > 2 else "32x32k")
variant = sys.argv[3] if len(sys.argv) > 3 else "default"
if variant != "default":
    paged_decode_cuda.TUNING.update({k: int(v) for k, v in (kv.split("=") for kv in variant.split(","))})
f = PageFormat(KVFormat.parse(name), 16, 1, 8, 128)
prob = build_problem(f, batch, ctx, 32, "cuda")
for _ in range(3):
    paged_decode_attention(*prob.args, out=prob.out, backend="cuda")
n = 2048
x = torch.randn((n, 16, 8, 128), device="cuda").to(torch.bfloat16)
pool = torch.zeros((2 * n, f.page_bytes), dtype=torch.uint8, device="cuda")
ids = torch.randperm(2 * n, device="cuda")[:n]
static = torch.full((8,), 0.01, device="cuda")
for _ in range(3):
    write_pages(pool, f, 0, 0, ids, x, static, check_finite=False, backend="cuda")
torch.cuda.synchronize()
print("ran", name, batch, ctx, variant)
