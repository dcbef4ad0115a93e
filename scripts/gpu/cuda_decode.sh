#!/usr/bin/env bash
# The CUDA (NVRTC) decode split kernel on the GPU: correctness tests, one bench run against the
# Triton kernel and bf16 SDPA, then a sweep of compile-time variants x split counts. Results in $OUT.
# Usage (GPU machine, repo root): bash scripts/gpu/cuda_decode.sh [SHAPES] [FORMATS] [SPLITS] [VARIANTS]
#   VARIANTS: space-separated KEY=V,KEY=V overrides of paged_decode_cuda.tuning_for (or "default"),
#             e.g. "default DEPTH=2 DEPTH=3,MINB=3"
#   SPLITS: space-separated counts; 0 = the default choice
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SHAPES=${1:-1x32k,32x32k}
FORMATS=${2:-fp8-tensor,fp8-token,nvfp4,fp8-token/nvfp4}
SPLITS=${3:-"0"}
VARIANTS=${4:-"default"}
if [ -z "${SKIP_TESTS:-}" ]; then
  # The engine test also runs its model on the CPU: cap torch's threads per worker (oversubscribed
  # OpenMP threads spin and can stall a test for minutes).
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} python3 -m pytest -q -p no:cacheprovider -n ${TEST_WORKERS:-4} --durations=8 \
      tests/kernels/test_gpu_cuda_decode.py tests/kvwire/test_engine_gpu.py tests/kernels/test_gpu.py \
      -k "decode or cuda or kernel_path" 2>&1 | tee "$OUT/tests_cuda.txt" | tail -25
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  python3 -m kvwire.bench.attention --formats "$FORMATS" --shapes "$SHAPES" --backends cuda,triton \
      --no-dequant-baseline --out "$OUT/attention.json" 2>&1 | tee "$OUT/attention.txt" | tail -30
fi
python3 - "$FORMATS" "$SHAPES" "$SPLITS" "$VARIANTS" <<'PY' 2>&1 | tee "$OUT/sweep.txt"
import sys, torch
from kvwire.bench.attention import build_problem, parse_shape, rotated_copies, time_graph, time_sdpa
from kvwire.formats import KVFormat, PageFormat
from kvwire.kernels import paged_decode_cuda as pdc
from kvwire.kernels.paged_decode import paged_decode_attention
formats, shapes = sys.argv[1].split(","), [parse_shape(s) for s in sys.argv[2].split(",")]
splits, variants = [int(s) for s in sys.argv[3].split()], sys.argv[4].split()
for b, ctx in shapes:
    sdpa = min(time_sdpa(b, ctx, 32, 8, 128, quick=True)[0].values())
    print(f"{b}x{ctx} bf16 SDPA {sdpa:.4f} ms (same run)", flush=True)
    for name in formats:
        f = PageFormat(KVFormat.parse(name), 16, 1, 8, 128)
        prob = build_problem(f, b, ctx, 32, "cuda")
        probs, nbytes = rotated_copies(prob, f, b, ctx, 32, "cuda")
        for var in variants:
            pdc.TUNING.clear()
            if var != "default":
                pdc.TUNING.update({k: int(v) for k, v in (kv.split("=") for kv in var.split(","))})
            try:
                k = pdc.kernel_for(f, 32, prob.args[0].dtype, prob.args[0].device)
            except RuntimeError as e:          # e.g. a ring that does not fit in shared memory
                print(f"{b}x{ctx} {name:16s} {var:18s} does not build: {str(e).splitlines()[-2:]}", flush=True)
                continue
            dflt = pdc.default_splits(k, b, 8, prob.args[4].shape[1], prob.args[0].device)
            res = []
            for s in splits:
                s = s or dflt
                fns = [(lambda pr=pr, s=s: paged_decode_attention(*pr.args, out=pr.out, backend="cuda", num_splits=s)) for pr in probs]
                try:
                    fns[0](); torch.cuda.synchronize()
                except RuntimeError as e:      # e.g. the deep-grid kernel of this variant does not build
                    res.append(f"{s}:fails({str(e).splitlines()[-1][:80]})")
                    continue
                ms = time_graph(fns, 10)
                res.append(f"{s}:{ms:.4f}({nbytes / ms / 1e9:.2f}TB/s,{sdpa / ms:.2f}x)")
            tun = ",".join(f"{a}={v}" for a, v in pdc.tuning_for(f).items())
            print(f"{b}x{ctx} {name:16s} {var:26s} [{tun}] regs={k.num_regs} blocks/SM={k.blocks_per_sm(128)} "
                  f"default={dflt} " + " ".join(res), flush=True)
        del probs, prob; torch.cuda.empty_cache()
pdc.TUNING.clear()
PY
