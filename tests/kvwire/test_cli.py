"""The `kvwire` CLI as a user runs it: real subprocesses, real model (in this process only where a
signal's timing would be a race)."""
import socket
import subprocess
import sys

import pytest


def kvwire(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvwire.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def assert_one_line_error(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0]


def test_unknown_format_is_one_line_exit_2():
    assert_one_line_error(kvwire("generate", "--kv-format", "fp4", "hello"), "fp4", "fp8-token", "nvfp4")


def test_serve_with_a_bad_metrics_port_is_one_line_exit_2():
    assert_one_line_error(kvwire("serve", "--metrics-port", "70000"), "metrics_port", "'any'", "70000")


def test_empty_prompt_is_one_line_exit_2():
    assert_one_line_error(kvwire("generate", "   "), "empty")


NO_ROUTER = "127.0.0.1:1"     # nothing listens: these mistakes are caught before connecting


@pytest.mark.parametrize("args, words", [
    (["--max-tokens", "0"], ["--max-tokens must be at least 1", "got 0"]),
    (["--router", NO_ROUTER, "--max-tokens", "0"], ["--max-tokens must be at least 1", "got 0"]),
    (["--router", NO_ROUTER, "--max-tokens", "-1"], ["--max-tokens must be at least 1", "got -1"]),
    (["--router", NO_ROUTER, "--repeat", "0"], ["--repeat must be at least 1"]),
    (["--router", NO_ROUTER, "--max-tokens", "5000000000"], ["max_tokens", "between 1 and 4294967295"]),
    (["--router", NO_ROUTER, "--seed", "-1"], ["seed", "between 0 and 18446744073709551615", "-1"]),
    (["--temperature", "nan"], ["temperature", "finite", "nan"]),
    (["--temperature", "inf"], ["temperature", "finite", "inf"]),
    (["--seed", "-1"], ["seed", "between 0 and 18446744073709551615"]),
])
def test_out_of_range_generate_options_are_one_line_exit_2(args, words):
    assert_one_line_error(kvwire("generate", *args, "hi"), *words)


def test_serve_on_a_taken_port_is_one_line_exit_2_before_ray_starts():
    """One stderr line means no "[kvwire] starting a local Ray cluster" line: the check came first."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        r = kvwire("serve", "--port", str(port), "--metrics-port", "0", timeout=120)
    assert_one_line_error(r, f"127.0.0.1:{port}", "already in use")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
@pytest.mark.parametrize("bench", ["attention", "quantize", "chunk"])
def test_gpu_bench_without_a_gpu_is_one_line_exit_2(bench):
    assert_one_line_error(kvwire("bench", bench), "needs a CUDA GPU")


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly():
    # `kvwire formats | head -0`: the reader is gone before the first write
    p = subprocess.Popen([sys.executable, "-m", "kvwire.cli", "formats"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


@pytest.mark.parametrize("size", ["0", "-16"])
def test_formats_with_a_bad_page_size_is_one_line_exit_2(size):
    assert_one_line_error(kvwire("formats", "--page-size", size), "--page-size must be at least 1", size)


SMALL_SWEEP = ["--formats", "bf16", "--lengths", "320", "--questions", "1", "--prefix-cold", "1", "--no-progress"]


def test_validate_without_a_router_is_one_line_exit_2_promptly():
    """It waited 120 s, then printed a grpc.FutureTimeoutError traceback."""
    r = kvwire("validate", "--backend", "router", "--target", NO_ROUTER, *SMALL_SWEEP, "--out", "/nonexistent/x",
               timeout=60)
    assert_one_line_error(r, f"no router answering at {NO_ROUTER}", "kvwire serve", "--target")


@pytest.mark.parametrize("out, words", [
    ("{file}", ["is a file, not a directory"]),
    ("{file}/sub", ["cannot create the directory", "Not a directory"]),
    ("/sys/kernel/kvwire-test", ["cannot create the directory", "/sys/kernel/kvwire-test"]),
])
def test_validate_out_that_cannot_be_a_directory_is_one_line_exit_2(tmp_path, out, words):
    (tmp_path / "file").write_text("not a directory\n")
    out = out.format(file=tmp_path / "file")
    assert_one_line_error(kvwire("validate", *SMALL_SWEEP, "--out", out, timeout=120), "--out", *words)


def test_validate_out_that_cannot_be_written_is_one_line_exit_2():
    """An existing directory nothing can be written to (a read-only filesystem; /proc here, as root passes
    permission checks) was a traceback from the first write of results.json, after the model loaded."""
    assert_one_line_error(kvwire("validate", *SMALL_SWEEP, "--out", "/proc", timeout=120),
                          "--out /proc", "cannot write a file there")


def test_validate_report_only_refuses_the_flags_of_a_run(tmp_path):
    """--report-only redraws results.json as it was run; `--formats bogus` beside it was silently ignored."""
    r = kvwire("validate", "--report-only", "--formats", "bogus", "--max-length", "512", "--out", str(tmp_path),
               timeout=60)
    assert_one_line_error(r, "--report-only", "drop --formats, --max-length")


def test_validate_records_the_command_as_typed():
    """Under `python -m kvwire.validate` (a Ray job) the report said the command was `__main__.py ...`."""
    from kvwire.validate.main import command_line

    assert command_line(["/w/kvwire/validate/__main__.py", "--out", "a b"]) == "python -m kvwire.validate --out 'a b'"
    assert command_line(["/w/kvwire/cli.py", "validate"]) == "python -m kvwire.cli validate"
    assert command_line(["/venv/bin/kvwire", "validate", "--fresh"]) == "kvwire validate --fresh"


def test_validate_resume_with_another_backend_kind_is_one_line_exit_2(tmp_path):
    """In-process results (fidelity, cold answers) must not be mixed with routed ones in one report."""
    from kvwire.model.registry import load_model_config
    from kvwire.validate.cli import build_parser
    from kvwire.validate.main import sweep_config
    from kvwire.validate.results import ResultStore

    args = build_parser().parse_args(SMALL_SWEEP)
    config = sweep_config(args, load_model_config(args.model).max_context)
    ResultStore.open(tmp_path / "results.json", config, {"backend": "in-process engine (cpu)"})
    r = kvwire("validate", "--backend", "router", "--target", NO_ROUTER, *SMALL_SWEEP, "--out", str(tmp_path),
               timeout=60)
    assert_one_line_error(r, "backend 'inprocess' there, 'routed' now", "--fresh", "another --out")


def test_validate_interrupted_says_the_finished_cells_are_kept(monkeypatch, capsys):
    """In this process: a real Ctrl-C's moment would race the imports. `kvwire validate` answered with
    the generic "kvwire: interrupted" of the top-level handler."""
    import kvwire.validate.main
    from kvwire.cli import main

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(kvwire.validate.main, "run_validate", interrupted)
    assert main(["validate", *SMALL_SWEEP]) == 130
    assert capsys.readouterr().err.strip() == ("kvwire validate: interrupted (finished cells are saved; "
                                               "run again to resume)")


def test_help_lists_commands():
    r = kvwire("--help")
    assert r.returncode == 0 and "formats" in r.stdout and "generate" in r.stdout


@pytest.mark.slow
def test_prompt_over_context_is_one_line_exit_2(tmp_path):
    f = tmp_path / "long.txt"
    f.write_text("word " * 9000 + "\n")
    assert_one_line_error(kvwire("generate", "--prompts-file", str(f)), "8191", "tokens")


@pytest.mark.slow
def test_formats_table_for_smollm2():
    r = kvwire("formats", "--json")
    assert r.returncode == 0, r.stderr
    import json
    rows = {row["name"]: row for row in json.loads(r.stdout)["formats"]}
    assert rows["bf16"]["bytes_per_token"] == 23040
    assert all(0.50 <= rows[f"fp8-{g}"]["ratio_to_bf16"] <= 0.54 for g in ("tensor", "head", "page", "token"))
    assert 0.28 <= rows["nvfp4"]["ratio_to_bf16"] <= 0.29
    assert rows["nvfp4"]["ratio_to_bf16"] < rows["fp8-token/nvfp4"]["ratio_to_bf16"] < rows["fp8-token"]["ratio_to_bf16"]


@pytest.mark.slow
def test_generate_streams_paris_and_reuses_prefix_on_repeat():
    r = kvwire("generate", "--kv-format", "fp8-token", "--max-tokens", "4", "--repeat", "2",
               "Here is a list of countries and their capitals. Germany: Berlin. Spain: Madrid. Italy: Rome. France:")
    assert r.returncode == 0, r.stderr
    summaries = [ln for ln in r.stdout.splitlines() if ln.startswith("[kvwire]")]
    assert len(summaries) == 2
    assert "Paris" in r.stdout
    assert "pages written 1 " in summaries[0] and "prefix pages reused 0 " in summaries[0]
    assert "pages written 0 " in summaries[1] and "prefix pages reused 1 " in summaries[1]


def test_a_cuda_device_number_past_the_machine_is_a_usage_error(monkeypatch):
    """`--device cuda:5` on a one-GPU machine passed the check and failed deep in the first allocation.
    The GPU count is faked: this machine has none, and the check is the arithmetic on it."""
    import torch

    from kvwire.commands.model_args import resolve_device
    from kvwire.errors import UsageError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    assert resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(UsageError, match=r"--device cuda:5: this machine has 1 CUDA device"):
        resolve_device("cuda:5")


@pytest.mark.parametrize("args, words", [
    (("--prompts-file", "{tmp}"), ("--prompts-file", "cannot read it as text")),   # a directory: was a traceback
    (("--page-size", "0", "hi"), ("page_size must be at least 1",)),                # named chunk_size instead
])
def test_generate_argument_mistakes_are_one_line(tmp_path, args, words):
    r = kvwire("generate", "--load-format", "dummy", "--model-shape", "smollm2-135m",
               *(a.format(tmp=tmp_path) for a in args))
    assert_one_line_error(r, *words)
