"""Put a sweep together from the command line: config, model or tokenizer, backend, store;
run; then the recommendation, plots and report (also alone, with --report-only)."""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
from pathlib import Path

from kvwire.out_dir import check_writable_dir
from kvwire.validate.config import ConfigError, SweepConfig, backend_kind
from kvwire.validate.loading import load_config, load_model, load_tokenizer
from kvwire.validate.plots import fidelity_plot, recall_plot
from kvwire.validate.recommend import headline, recommend
from kvwire.validate.report import baseline_passkey, write_report
from kvwire.validate.results import ResultStore, check_resumable, load_results


def sweep_config(args: argparse.Namespace, max_context: int) -> SweepConfig:
    from kvwire.formats import listed_formats

    formats = args.formats or tuple(f.name for f in listed_formats(args.all_formats))
    config = SweepConfig(formats=formats, lengths=args.lengths, samples=args.samples, questions=args.questions,
                         prefix_cold=args.prefix_cold, seed=args.seed, tolerance=args.tolerance,
                         probe_positions=args.probe_positions, page_size=args.page_size,
                         chunk_size=args.chunk_size, model=args.model,
                         backend=backend_kind(args.backend)).fit_lengths(max_context)
    clipped = sorted(n for n in args.lengths if n not in config.lengths)
    if clipped:
        print(f"[validate] lengths {', '.join(map(str, clipped))} clipped to {max(config.lengths)}: the model's "
              f"context is {max_context}, less room for the question and answer", file=sys.stderr, flush=True)
    if args.max_length is not None:
        kept = tuple(n for n in config.lengths if n <= args.max_length)
        if not kept:
            raise ConfigError(f"--max-length {args.max_length} drops every length ({list(config.lengths)})")
        config = SweepConfig(**{**config.__dict__, "lengths": kept})
    return config


def machine() -> str:
    import torch

    cpu = f"{platform.machine()}, {os.cpu_count()} CPUs"
    if torch.cuda.is_available():
        cpu += f", {torch.cuda.get_device_name(0)}"
    return f"{platform.node()} ({cpu}; Python {platform.python_version()}, torch {torch.__version__})"


def make_out_dir(out: Path) -> None:
    """Create --out and write a scratch file there before the model loads (``check_writable_dir``)."""
    check_writable_dir(out, f"--out {out}")


def finish(out: Path, data: dict | None = None) -> tuple[dict, list[Path]]:
    """Recommendation, plots and report from the results file; returns the recommendation and the plots
    written (fidelity has none without the in-process engine, and none without matplotlib)."""
    data = data or load_results(out / "results.json")
    rec = recommend(data, data["sweep"]["tolerance"])
    try:
        import matplotlib  # noqa: F401
        images = {"recall": recall_plot(data, out / "recall.png"),
                  "fidelity": fidelity_plot(data, out / "fidelity.png")}
    except ImportError:   # e.g. the GPU image: draw them later with --report-only where it is installed
        print("kvwire validate: matplotlib is not installed; no plots (pip install matplotlib, then "
              "--report-only redraws them)", file=sys.stderr)
        images = {}
    write_report(data, rec, out, images)
    data["recommendation"] = rec
    ResultStore(out / "results.json", data).save()
    return rec, [p for p in images.values() if p]


def _backend(args: argparse.Namespace, config: SweepConfig, model, tokenizer, model_config):
    if args.backend == "inprocess":
        from kvwire.validate.backends import InProcessBackend
        return InProcessBackend(model, tokenizer, config.page_size, config.chunk_size)
    if args.backend == "router":
        from kvwire.validate.backends import RouterBackend
        return RouterBackend(args.target, formats=config.formats)
    from kvwire.formats import KVFormat, PageFormat
    from kvwire.validate.ray_backend import PoolTemplate, RayRouterBackend

    def bpt(fmt: str) -> float:
        c = model_config
        return PageFormat(KVFormat.parse(fmt), config.page_size, c.num_layers, c.num_kv_heads, c.head_dim).bytes_per_token

    template = PoolTemplate(model=args.model, page_size=config.page_size, chunk_size=config.chunk_size,
                            transport=args.transport, device=args.device,
                            prefill_resource=args.prefill_resource, decode_resource=args.decode_resource)
    return RayRouterBackend(args.ray_address, template, bpt)


# What --report-only reads from results.json instead of the command line: the flags a run would use.
_RUN_FLAGS = ("formats", "all_formats", "lengths", "max_length", "samples", "questions", "prefix_cold", "seed",
              "tolerance", "probe_positions", "page_size", "chunk_size", "backend", "target", "ray_address",
              "transport", "prefill_resource", "decode_resource", "model", "device", "threads", "jobs", "fresh")


def _check_report_only_flags(args: argparse.Namespace) -> None:
    """A run's flag beside --report-only would be silently ignored (the report is redrawn as it was run)."""
    from kvwire.validate.cli import build_parser

    defaults = build_parser().parse_args([])
    given = [name for name in _RUN_FLAGS if getattr(args, name) != getattr(defaults, name)]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ConfigError(f"--report-only redraws the report from results.json as it was run; drop {flags} "
                          "(or drop --report-only to run a sweep)")


def command_line(argv: list[str]) -> str:
    """The command as typed: under `python -m kvwire.validate` (what `ray job submit` runs) argv[0] is
    .../kvwire/validate/__main__.py, whose name alone says nothing."""
    path = Path(argv[0]) if argv else Path("kvwire")
    modules = {("validate", "__main__.py"): "kvwire.validate", ("kvwire", "cli.py"): "kvwire.cli"}
    module = modules.get((path.parent.name, path.name))
    program = ["python", "-m", module] if module else [path.name]
    return shlex.join(program + argv[1:])


def _report_only(args: argparse.Namespace, out: Path) -> int:
    """An error, not a report, for a results file without cells (a sweep stopped before its first cell
    finished): a report would only say that nothing qualifies, which reads like a measured verdict, and
    exit 2 tells a script that redraws fetched results that there was nothing to redraw."""
    _check_report_only_flags(args)
    data = load_results(out / "results.json")
    if not data["cells"]:
        raise ConfigError(f"{out / 'results.json'} has no finished cells, so there is nothing to report; "
                          "run the sweep (without --report-only) first")
    print(headline(finish(out, data)[0]))
    print(f"report: {out / 'report.md'}")
    if args.print_report:
        print("\n" + (out / "report.md").read_text())
    return 0


def _check_run_flags(args: argparse.Namespace) -> None:
    if args.threads is not None:
        import torch
        if args.threads < 1:
            raise ConfigError("--threads must be at least 1")
        torch.set_num_threads(args.threads)
    if args.jobs < 1:
        raise ConfigError("--jobs must be at least 1")
    if args.jobs > 1 and args.backend != "inprocess":
        raise ConfigError("--jobs splits in-process sweeps; a router backend spreads work over its pools")


def _start_backend(args: argparse.Namespace, config: SweepConfig, model_config, tokenizer):
    """(backend, description); no backend with --jobs > 1 (each worker process makes its own)."""
    from kvwire.commands.model_args import resolve_device

    if args.jobs > 1:
        return None, f"in-process engine ({resolve_device(args.device)}), {args.jobs} worker processes"
    model = load_model(args)[0] if args.backend == "inprocess" else None
    backend = _backend(args, config, model, tokenizer, model_config)
    return backend, backend.description


def _meta(model_config, description: str) -> dict:
    return {"model": model_config.name, "max_context": model_config.max_context, "backend": description,
            "machine": machine(), "command": command_line(sys.argv),
            "started": datetime.datetime.now().isoformat(timespec="seconds")}


def _print_outputs(args: argparse.Namespace, out: Path, data: dict, rec: dict, plots: list[Path]) -> None:
    """The closing lines: name only the files this run wrote (no fidelity plot through a router)."""
    print(headline(rec))
    bp = baseline_passkey(data)
    if bp is not None:
        print(f"bf16 passkey recall: {100 * bp:.1f}%")
    print(f"results: {out / 'results.json'}")
    if plots:
        print(f"plots: {', '.join(str(p) for p in plots)}")
    print(f"report: {out / 'report.md'}")
    if args.print_report:
        print("\n" + (out / "report.md").read_text())


def run_validate(args: argparse.Namespace) -> int:
    from kvwire.validate.prompts import min_haystack_tokens
    from kvwire.validate.sweep import run_sweep

    out = Path(args.out)
    if args.report_only:
        return _report_only(args, out)
    model_config = load_config(args)
    config = sweep_config(args, model_config.max_context)     # bad flags fail before the model loads
    tokenizer = load_tokenizer(args)
    config.check_min_length(min_haystack_tokens(tokenizer, config.questions))
    _check_run_flags(args)
    make_out_dir(out)
    # a results file that cannot be resumed fails here, before a model or router is asked
    resumed = None if args.fresh else check_resumable(out / "results.json", config)
    backend, description = _start_backend(args, config, model_config, tokenizer)
    store = ResultStore.start(out / "results.json", config, _meta(model_config, description), resumed)
    if backend is None:
        from kvwire.validate.parallel import run_parallel
        run_parallel(config, store, args.jobs, args.model, args.device, args.threads or 1,
                     progress=not args.no_progress)
    else:
        try:
            run_sweep(config, backend, tokenizer, store, progress=not args.no_progress)
        finally:
            backend.close()
    store.data["meta"]["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    rec, plots = finish(out, store.data)
    _print_outputs(args, out, store.data, rec, plots)
    return 0
