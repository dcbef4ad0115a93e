#!/usr/bin/env bash
# Time paged_chunk_attention (one layer, Hq=32, Hkv=8, D=128, P=16): a 512-token chunk after a
# stored prefix, against bf16 SDPA over the same keys (no mask: a lower bound on its cost).
set -euo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 - <<'PY'
import torch, torch.nn.functional as F
from kvwire.bench.attention import time_graph
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels.chunk_attention import benchmark
for prefix in (8192, 32768):
    k = torch.randn(1, 8, prefix + 512, 128, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, 32, 512, 128, device="cuda", dtype=torch.bfloat16)
    sd = time_graph([lambda: F.scaled_dot_product_attention(q, k, k, enable_gqa=True)])
    for name in ("bf16", "fp8-token", "fp8-tensor", "nvfp4", "fp8-token/nvfp4"):
        r = benchmark(PageFormat(KVFormat.parse(name), 16, 1, 8, 128), prefix=prefix, chunk=512)
        print(f"prefix {prefix:6d} chunk 512 {name:16s} {r['ms']:.3f} ms  {r['tflops']:.0f} TFLOP/s   "
              f"(bf16 SDPA, same keys, no mask: {sd:.3f} ms)", flush=True)
PY
