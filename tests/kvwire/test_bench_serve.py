"""`kvwire bench serve`'s arguments and exit status, with the router and the load replaced (the real
runs are tests/router/test_serve_e2e.py's and, joining a cluster, test_bench_serve_joins_a_cluster below)."""
import json
import math
from types import SimpleNamespace

import pytest

import kvwire.bench.serve as bench_serve
import router.serve
from kvwire.cli import main


def _row(fmt: str, ok: int, errors: dict) -> dict:
    nan = math.nan
    return {"kv_format": fmt, "requests_ok": ok, "errors": errors, "error_messages": {}, "wall_s": 1.0,
            "ttft_p50_s": nan, "ttft_p90_s": nan, "tpot_p50_s": nan, "tpot_p90_s": nan, "tpot_mean_s": nan,
            "output_tokens_per_s": 0.0, "wire_bytes": 0, "wire_bf16_bytes": 0, "wire_ratio": nan}


@pytest.fixture
def started(monkeypatch):
    """What start_router was asked for; the router it "starts" takes no requests (the load is faked)."""
    calls = []

    def fake_start_router(config, ray_address=None, progress=print, **kw):
        calls.append(SimpleNamespace(config=config, ray_address=ray_address))
        return SimpleNamespace(target="127.0.0.1:1", stop=lambda: None)

    monkeypatch.setattr(router.serve, "start_router", fake_start_router)
    return calls


def _ok(target, fmt, args):
    return _row(fmt, args.requests, {})


SMALL = ["bench", "serve", "--requests", "1", "--concurrency", "1"]


def test_address_is_the_ray_cluster_the_pools_start_on(started, monkeypatch):
    monkeypatch.setattr(bench_serve, "_load", _ok)
    assert main([*SMALL, "--kv-formats", "bf16", "--address", "head-svc:6379"]) == 0
    assert main([*SMALL, "--kv-formats", "bf16"]) == 0
    assert [c.ray_address for c in started] == ["head-svc:6379", None]


def test_model_flags_reach_the_pools_and_default_to_the_pools_own(started, monkeypatch):
    monkeypatch.setattr(bench_serve, "_load", _ok)
    assert main([*SMALL, "--kv-formats", "bf16,nvfp4", "--load-format", "dummy", "--model-shape", "smollm2-135m",
                 "--device", "cpu", "--num-pages", "64"]) == 0
    assert main([*SMALL, "--kv-formats", "bf16"]) == 0
    given, default = started[0].config.pools, started[1].config.pools[0]
    assert [(p.kv_format, p.load_format, p.model_shape, p.device, p.num_pages) for p in given] == \
        [("bf16", "dummy", "smollm2-135m", "cpu", 64), ("nvfp4", "dummy", "smollm2-135m", "cpu", 64)]
    assert (default.model, default.load_format, default.model_shape, default.device) == \
        ("smollm2", "auto", None, "auto")


def test_a_format_with_no_successful_request_exits_1_after_writing_the_json(started, monkeypatch, tmp_path,
                                                                           capsys):
    monkeypatch.setattr(bench_serve, "_load", lambda target, fmt, args:
                        _ok(target, fmt, args) if fmt == "bf16" else _row(fmt, 0, {"INVALID_ARGUMENT": 1}))
    out = tmp_path / "serve.json"
    assert main([*SMALL, "--kv-formats", "bf16,nvfp4", "--out", str(out)]) == 1
    result = json.loads(out.read_text())
    assert [r["requests_ok"] for r in result["results"]] == [1, 0]
    captured = capsys.readouterr()
    assert "| nvfp4 | 0 | INVALID_ARGUMENT 1 |" in captured.out
    assert captured.err.strip().splitlines() == [
        "kvwire bench serve: no request of 1 succeeded for nvfp4; the table lists the errors"]


@pytest.mark.parametrize("args, words", [
    (["--kv-formats", "bf16,bf16"], ["--kv-formats names bf16 more than once"]),
    (["--kv-formats", "nvfp4,fp8-token,nvfp4/nvfp4"], ["--kv-formats names nvfp4 more than once"]),
    (["--router", "127.0.0.1:1", "--model", "/some/model.gguf"], ["--model describe the pools this command starts",
                                                                   "with --router"]),
    (["--router", "127.0.0.1:1", "--address", "auto", "--device", "cpu"], ["--device, --address describe"]),
    (["--router", "127.0.0.1:1", "--num-pages", "8"], ["--num-pages describe"]),
    (["--num-pages", "0"], ["num_pages must be a positive integer"]),
])
def test_bad_arguments_are_one_line_exit_2_before_anything_starts(started, monkeypatch, capsys, args, words):
    monkeypatch.setattr(bench_serve, "_load", _ok)
    assert main(["bench", "serve", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("kvwire bench: error: "), err
    assert all(w in err for w in words), err
    assert not started, "refused before a router started"


@pytest.mark.slow
def test_bench_serve_joins_a_cluster(tmp_path):
    """With --address the pools start on the given cluster (it used to start a nested local Ray, also
    under `ray job submit`); run directly with the head's address, then as docs/deploy.md's job with
    ``--address auto``. The cluster is still up afterwards."""
    import subprocess

    from tests.ray_head import BIN, plain, ray_head, submit_job
    from tests.router.conftest import kvwire_exe

    small = ["--kv-formats", "bf16", "--device", "cpu", "--num-pages", "64", "--requests", "1", "--concurrency", "1",
             "--prompt-tokens", "20", "--output-tokens", "2"]
    with ray_head(num_cpus=4, dashboard=True) as head:
        out = tmp_path / "direct.json"
        run = subprocess.run([kvwire_exe(), "bench", "serve", "--address", head.address, *small, "--out", str(out)],
                             env={**head.env, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=400)
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"[bench serve] joining the Ray cluster at {head.address}" in run.stdout, run.stdout
        assert "starting a local Ray" not in run.stdout, run.stdout
        assert json.loads(out.read_text())["results"][0]["requests_ok"] == 1

        out = tmp_path / "job.json"
        job = submit_job([str(BIN / "ray"), "job", "submit", "--address", head.dashboard_url, "--entrypoint-num-cpus",
                          "1", "--", kvwire_exe(), "bench", "serve", "--address", "auto", *small, "--out", str(out)],
                         env=head.env, timeout=400)
        log = plain(job.stdout + job.stderr)
        assert job.returncode == 0, log
        assert "[bench serve] joining the Ray cluster at auto" in log and "starting a local Ray" not in log, log
        assert json.loads(out.read_text())["results"][0]["requests_ok"] == 1

        status = subprocess.run([str(BIN / "ray"), "status", "--address", head.address], env=head.env,
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, "the cluster should still be up: " + status.stderr
