"""`kvwire bench NAME --out PATH`: a path that cannot take the JSON is one line and exit 2 before the
benchmark runs (it used to be found after the run, often as a traceback, losing the result)."""
import json
import subprocess
import sys

import pytest

from kvwire.cli import main
from kvwire.commands.bench_cmd import BENCHES


def _no_run(args):
    raise AssertionError("the benchmark ran before --out was checked")


def _bad_outs(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    return {"a directory": (tmp_path, "is a directory"),
            "under a file": (a_file / "x.json", "is a file, not a directory"),
            "uncreatable": ("/proc/kvwire-no-such/y.json", "cannot create its directory")}


@pytest.mark.parametrize("bench", sorted(BENCHES))
@pytest.mark.parametrize("case", ["a directory", "under a file", "uncreatable"])
def test_bad_out_is_one_line_exit_2_before_the_run(bench, case, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(__import__(BENCHES[bench], fromlist=["run"]), "run", _no_run)
    out, words = _bad_outs(tmp_path)[case]
    assert main(["bench", bench, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"kvwire bench: error: --out {out}"), err
    assert words in err, err


def test_good_out_gets_its_directory_and_the_json(tmp_path, monkeypatch, capsys):
    import kvwire.bench.decode_step as mod
    monkeypatch.setattr(mod, "run", lambda args: {"rows": [], "answer": 42})
    monkeypatch.setattr(mod, "format_table", lambda result: "a table")
    out = tmp_path / "new" / "dir" / "step.json"
    assert main(["bench", "decode-step", "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == {"rows": [], "answer": 42}
    assert capsys.readouterr().out.splitlines() == ["a table", f"wrote {out}"]


def test_python_m_bench_checks_out_too(tmp_path):
    """`python -m kvwire.bench.NAME` (scripts/gpu/) takes --out the same way: a directory is refused at once."""
    r = subprocess.run([sys.executable, "-m", "kvwire.bench.decode_step", "--device", "cpu", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"decode_step.py: error: --out {tmp_path}: is a directory; name a file, "
                                             f"e.g. {tmp_path / 'result.json'}"], r.stderr
