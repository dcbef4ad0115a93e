"""How page placement in the pool moves the CUDA decode kernel and its memory-path probe (PROBE_LOADS=1):
page tables as drawn by kvwire bench attention (a random permutation of the pool), in runs of R consecutive
pages (runs shuffled), and fully sequential. 32x32k by default, graph-timed, bf16 SDPA in the same run.
Usage (GPU machine, repo root): PYTHONPATH=$PWD python3 scripts/gpu/decode_placement.py [SHAPE] [FORMATS]"""
import sys

import torch

from kvwire.bench.attention import build_problem, parse_shape, rotated_copies, time_graph, time_sdpa
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels import paged_decode_cuda as pdc
from kvwire.kernels.paged_decode import paged_decode_attention


def placed(prob, run: int, seed: int):
    """The problem with its page table rebuilt: runs of ``run`` consecutive ids in shuffled order (0: sequential)."""
    pt = prob.args[4]
    b, n = pt.shape
    total = b * n
    ids = torch.arange(total, device=pt.device, dtype=torch.int32)
    if run:
        gen = torch.Generator(device=pt.device).manual_seed(seed)
        order = torch.randperm(-(-total // run), device=pt.device, generator=gen)
        ids = (order.view(-1, 1) * run + torch.arange(run, device=pt.device)).view(-1)
        ids = ids[ids < total].int()
    args = list(prob.args)
    args[4] = ids.view(b, n).contiguous()
    return args


shape = parse_shape(sys.argv[1] if len(sys.argv) > 1 else "32x32k")
formats = (sys.argv[2] if len(sys.argv) > 2 else "fp8-tensor,fp8-token,nvfp4,fp8-token/nvfp4").split(",")
b, ctx = shape
sdpa = min(time_sdpa(b, ctx, 32, 8, 128, quick=True)[0].values())
print(f"{b}x{ctx} bf16 SDPA {sdpa:.4f} ms", flush=True)
for name in formats:
    f = PageFormat(KVFormat.parse(name), 16, 1, 8, 128)
    prob = build_problem(f, b, ctx, 32, "cuda")
    probs, nbytes = rotated_copies(prob, f, b, ctx, 32, "cuda")
    for rnd in range(2):
        for probe in (0, 1):
            pdc.TUNING.clear()
            pdc.TUNING["PROBE_LOADS"] = probe
            res = []
            for label, run in (("random", None), ("runs-64", 64), ("runs-8", 8), ("sequential", 0)):
                argss = [pr.args if run is None else placed(pr, run, i) for i, pr in enumerate(probs)]
                fns = [(lambda a=a, pr=pr: paged_decode_attention(*a, out=pr.out, backend="cuda")) for a, pr in zip(argss, probs)]
                fns[0](); torch.cuda.synchronize()
                ms = time_graph(fns, 10)
                res.append(f"{label}:{ms:.4f}({nbytes / ms / 1e9:.2f}TB/s,{sdpa / ms:.2f}x)")
            print(f"{b}x{ctx} {name:16s} {'probe' if probe else 'kernel':6s} " + " ".join(res), flush=True)
    del probs, prob
    torch.cuda.empty_cache()
pdc.TUNING.clear()
