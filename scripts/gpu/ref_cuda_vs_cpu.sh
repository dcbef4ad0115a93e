#!/usr/bin/env bash
# Does kvwire.quant.quantize_pages give the same bytes on CUDA as on the CPU? (It should: a page's
# bytes must decode the same everywhere.) Prints the mismatching sections per format.
set -euo pipefail
export PYTHONPATH=$PWD
python3 - <<'PY'
import torch
from kvwire.formats import _parse_part
from kvwire.quant import quantize_pages
g = torch.Generator().manual_seed(0)
x = torch.randn(512, 16, 8, 128, generator=g) * torch.exp(torch.empty(512, 16, 8, 1).uniform_(-3, 2, generator=g))
for name in ["fp8-page", "fp8-token", "nvfp4"]:
    fmt = _parse_part(name)
    a = quantize_pages(x, fmt)
    b = {k: v.cpu() for k, v in quantize_pages(x.cuda(), fmt).items()}
    for k in a:
        diff = int((a[k].view(torch.uint8) != b[k].view(torch.uint8)).sum())
        print(f"quantize_pages cuda vs cpu {name:10s} {k:13s} differing bytes: {diff} / {a[k].numel() * a[k].element_size()}")
PY
