"""Command line of the sweep, shared by `python -m kvwire.validate` (what `ray job submit` runs)
and `kvwire validate`. Mistakes print one line and exit with status 2."""
from __future__ import annotations

import argparse
import sys

from kvwire.validate.config import DEFAULT_LENGTHS, ConfigError

# What Ctrl-C prints, under both names of the command: a stopped sweep loses no finished cell.
INTERRUPTED = "kvwire validate: interrupted (finished cells are saved; run again to resume)"

DESCRIPTION = """\
Measure recall of every KV format against bf16 on the serving stack and recommend the
lowest-precision format within a tolerance of bf16 at every context length.

Tasks (seeded, no downloads): passkey at 10/50/90% depth, multi-document retrieval with
near-duplicate keys, citation (document id), prefix-cache reuse (warm == cold); fidelity
(next-token KL, top-1, per-layer attention top-1) with the in-process backend.

Outputs in --out: results.json (every cell; re-running resumes), recall.png, fidelity.png,
report.md.

  kvwire validate --max-length 4096                        in-process, every listed format
  kvwire validate --backend router --target 127.0.0.1:50051 --formats bf16,nvfp4
  ray job submit --working-dir . -- python -m kvwire.validate --backend ray --max-length 4096
"""


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sweep")
    g.add_argument("--formats", type=_names, default=None, metavar="F1,F2",
                   help="KV formats, KEYS/VALUES for mixed (default: every format `kvwire formats` lists; "
                        "bf16 is always added)")
    g.add_argument("--all-formats", action="store_true", help="every KEYS/VALUES pair (`kvwire formats --all`)")
    g.add_argument("--lengths", type=_ints, default=DEFAULT_LENGTHS, metavar="N1,N2",
                   help="context lengths in tokens (default %(default)s, clipped to the model's context)")
    g.add_argument("--max-length", type=int, default=None, metavar="N", help="drop lengths above N")
    g.add_argument("--samples", type=int, default=1, help="seeds per cell (default 1: 3 passkey prompts + "
                   "one haystack)")
    g.add_argument("--questions", type=int, default=3, help="retrieval and citation questions per haystack (3)")
    g.add_argument("--prefix-cold", type=int, default=2,
                   help="questions whose warm answer is checked against a cold one (default 2; a running "
                        "router can only do the first)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--tolerance", type=float, default=2.0, help="points below bf16 allowed (default 2)")
    g.add_argument("--probe-positions", type=int, default=48, help="positions for fidelity (default 48)")
    g.add_argument("--page-size", type=int, default=16)
    g.add_argument("--chunk-size", type=int, default=512, help="prefill tokens per forward (default 512)")
    b = p.add_argument_group("backend")
    b.add_argument("--backend", choices=["inprocess", "router", "ray"], default="inprocess",
                   help="inprocess: engine in this process (fast, fidelity included); router: a running "
                        "`kvwire serve` (--target); ray: start a router with one pool per format in turn on "
                        "the Ray cluster (--ray-address; what `ray job submit` runs)")
    b.add_argument("--target", default="127.0.0.1:50051", help="router address for --backend router")
    b.add_argument("--ray-address", default="auto", help="Ray cluster for --backend ray (default auto)")
    b.add_argument("--transport", choices=["nixl", "inprocess"], default="nixl",
                   help="page transport of the pools --backend ray starts (default nixl)")
    b.add_argument("--prefill-resource", metavar="NAME",
                   help="--backend ray: custom Ray resource each prefill worker takes (e.g. kvwire_prefill)")
    b.add_argument("--decode-resource", metavar="NAME",
                   help="--backend ray: custom Ray resource each decode worker takes (e.g. kvwire_decode)")
    b.add_argument("--model", default="smollm2", help="model source (default smollm2)")
    b.add_argument("--device", default="auto", help="in-process device: auto, cpu, cuda")
    b.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per process (default: torch's choice; 1 is much faster on a busy "
                        "shared machine)")
    b.add_argument("--jobs", type=int, default=1,
                   help="in-process worker processes, formats dealt out between them (default 1); "
                        "with --threads 1 this is how to use several CPU cores")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="runs/validate", help="output directory (default runs/validate)")
    o.add_argument("--fresh", action="store_true", help="discard finished cells in --out and start over")
    o.add_argument("--report-only", action="store_true", help="redraw report and plots from results.json")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    o.add_argument("--print-report", action="store_true",
                   help="also print report.md to stdout (a Ray job's logs then carry it)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvwire.validate", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p


def run(args: argparse.Namespace) -> int:
    from kvwire.validate.main import run_validate

    return run_validate(args)


def main(argv: list[str] | None = None) -> int:
    from kvwire.errors import USER_ERRORS
    from kvwire.validate.backends import BackendError

    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (ConfigError, BackendError, *USER_ERRORS) as exc:
        print(f"kvwire validate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return 130
