"""A/B of the reduce kernel's programmatic dependent launch (paged_decode_cuda.DEPENDENT_LAUNCH) at 1x32k and
32x32k, interleaved twice, graph-timed. Usage (GPU machine, repo root): PYTHONPATH=$PWD python3 scripts/gpu/pdl_ab.py"""
import torch
from kvwire.bench.attention import build_problem, parse_shape, rotated_copies, time_graph, time_sdpa
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels import paged_decode_cuda as pdc
from kvwire.kernels.paged_decode import paged_decode_attention
for b, ctx in [parse_shape(s) for s in ("1x32k", "32x32k")]:
    sdpa = min(time_sdpa(b, ctx, 32, 8, 128, quick=True)[0].values())
    print(f"{b}x{ctx} bf16 SDPA {sdpa:.4f} ms", flush=True)
    for name in ("fp8-tensor", "fp8-token", "nvfp4", "fp8-token/nvfp4"):
        f = PageFormat(KVFormat.parse(name), 16, 1, 8, 128)
        prob = build_problem(f, b, ctx, 32, "cuda")
        probs, nbytes = rotated_copies(prob, f, b, ctx, 32, "cuda")
        res = []
        for pdl in (True, False, True, False):
            pdc.DEPENDENT_LAUNCH = pdl
            fns = [(lambda pr=pr: paged_decode_attention(*pr.args, out=pr.out, backend="cuda")) for pr in probs]
            fns[0](); torch.cuda.synchronize()
            ms = time_graph(fns, 10)
            res.append(f"{'pdl' if pdl else 'plain'}:{ms:.4f}({sdpa / ms:.2f}x)")
        print(f"{b}x{ctx} {name:16s} " + " ".join(res), flush=True)
        del probs, prob; torch.cuda.empty_cache()
pdc.DEPENDENT_LAUNCH = True
