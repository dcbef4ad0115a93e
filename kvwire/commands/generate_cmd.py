"""`kvwire generate`: run prompts through the single-process engine on compact KV pages."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvwire.commands.model_args import add_model_arguments, load_from_args
from kvwire.errors import UsageError
from kvwire.formats import KVFormat


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate", help="answer a prompt with the KV cache in compact pages",
        description="Prefill the prompt into KV pages of --kv-format, decode on them, stream the text to "
                    "stdout, then print one summary line (prompt tokens, pages written, prefix pages "
                    "reused, KV bytes held vs bf16). Use --repeat or --prompts-file to see the prefix cache "
                    "reuse pages across prompts.")
    p.add_argument("prompt", nargs="?", help="the prompt text (or use --prompts-file)")
    p.add_argument("--prompts-file", type=Path, help="one prompt per line, run in order in one engine")
    p.add_argument("--repeat", type=int, default=1, metavar="K", help="run each prompt K times (prefix cache demo)")
    p.add_argument("--kv-format", default=None, help="KV page format, e.g. bf16, fp8-token, nvfp4, "
                   "fp8-token/nvfp4 (keys/values); `kvwire formats` lists them (default bf16; with --router, the "
                   "default pool's)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed, for repeatable runs (the same tokens "
                   "as a request with this seed through `kvwire serve`)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--page-size", type=int, default=16, help="tokens per KV page (default 16)")
    p.add_argument("--chunk-size", type=int, default=512, help="prefill tokens per forward pass (default 512)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="decode steps replayed from CUDA graphs (on a GPU, default on; ignored on the CPU)")
    p.add_argument("--router", metavar="HOST:PORT", help="send the prompt to a running `kvwire serve` instead of "
                   "running the model here (the model flags are then ignored)")
    p.add_argument("--pool", default="", help="with --router: the pool to use (default: by --kv-format, or the "
                   "router's default pool)")
    add_model_arguments(p)
    p.set_defaults(run=run)


def _prompts(args: argparse.Namespace) -> list[str]:
    if args.prompts_file is not None:
        if args.prompt is not None:
            raise UsageError("give a prompt or --prompts-file, not both")
        try:
            lines = [ln for ln in args.prompts_file.read_text().splitlines() if ln.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--prompts-file {args.prompts_file}: cannot read it as text "
                             f"({getattr(exc, 'strerror', None) or exc})") from exc
        if not lines:
            raise UsageError(f"{args.prompts_file} has no prompts")
        return lines
    if args.prompt is None:
        raise UsageError("give a prompt, e.g. kvwire generate \"The capital of France is\"")
    if not args.prompt.strip():
        raise UsageError("the prompt is empty: give some text")
    return [args.prompt]


def _check_counts(args: argparse.Namespace) -> None:
    """Both modes refuse 0 alike: the router's wire format reads max_tokens 0 as "the default" (64)."""
    for flag, value in (("--max-tokens", args.max_tokens), ("--repeat", args.repeat)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")


def run(args: argparse.Namespace) -> int:
    _check_counts(args)
    if args.router:
        return run_remote(args)
    if args.pool:
        raise UsageError("--pool names a pool of a router: it needs --router HOST:PORT")
    from kvwire.calibration import CALIBRATION_TEXT
    from kvwire.engine import Engine, EngineConfig
    from kvwire.model.tokenizer import StreamDecoder
    from kvwire.sampling import SamplingParams

    args.kv_format = args.kv_format or "bf16"
    KVFormat.parse(args.kv_format)          # fail fast, before loading the model
    prompts = _prompts(args)
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                top_p=args.top_p, seed=args.seed)
        config = EngineConfig(kv_format=args.kv_format, page_size=args.page_size, chunk_size=args.chunk_size,
                              cuda_graphs=args.cuda_graphs)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.load_format == "dummy" and args.model_shape != "smollm2-135m":
        raise UsageError(f"dummy weights of shape {args.model_shape} come with no tokenizer and generate needs "
                         "text: use --model-shape smollm2-135m, or `kvwire bench ...` for other shapes")
    model, tokenizer = load_from_args(args)
    if tokenizer is None:
        raise UsageError("this model has no tokenizer (dummy weights); generate needs text")
    engine = Engine(model, config, calibration_ids=tokenizer.encode(CALIBRATION_TEXT))
    requests = [tokenizer.encode(tokenizer.apply_chat_template(t) if args.chat else t) for t in prompts]
    for ids in requests:                      # every prompt is checked before any runs
        engine.validate(ids, params)
    for ids in requests:
        for _ in range(args.repeat):
            gen = engine.generate(ids, params)
            stream = StreamDecoder(tokenizer)
            for token in gen:
                sys.stdout.write(stream.push(token))
                sys.stdout.flush()
            sys.stdout.write(stream.flush() + "\n")
            print(gen.summary.line(args.kv_format), flush=True)
    return 0


def run_remote(args: argparse.Namespace) -> int:
    """Stream each prompt's completion from a router; its errors print as one line."""
    import grpc

    from router.client import RouterClient

    prompts = _prompts(args)
    options = dict(kv_format=args.kv_format or "", pool=args.pool, max_tokens=args.max_tokens,
                   temperature=args.temperature, top_p=args.top_p, seed=args.seed, chat=args.chat)
    try:
        RouterClient.request(prompts[0], **options)     # a value the request cannot carry fails here, once
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with RouterClient(args.router) as client:
        for text in prompts:
            for _ in range(args.repeat):
                try:
                    stream = client.generate(text, **options)
                    for event in stream:
                        if event.HasField("delta"):
                            sys.stdout.write(event.delta.text)
                            sys.stdout.flush()
                        else:
                            f = event.finished
                    sys.stdout.write("\n")
                except grpc.RpcError as exc:
                    message = f"{exc.code().name}: {exc.details()}"
                    if exc.code() is grpc.StatusCode.INVALID_ARGUMENT:
                        raise UsageError(message) from None
                    print(f"kvwire generate: error from {args.router}: {message}", file=sys.stderr)
                    return 1
                ratio = f"{f.wire_bytes / f.wire_bf16_bytes:.3f}" if f.wire_bf16_bytes else "no full page"
                print(f"[kvwire] pool {f.pool} ({f.kv_format}) | prompt tokens {f.prompt_tokens} | completion "
                      f"tokens {f.completion_tokens} ({f.finish_reason}) | prefix pages reused "
                      f"{f.prefix_pages_reused} | wire {f.wire_bytes:,} B vs bf16 {f.wire_bf16_bytes:,} B "
                      f"({ratio}) | TTFT {f.ttft_s:.2f} s | {f.prefill_worker} -> {f.decode_worker}", flush=True)
    return 0
