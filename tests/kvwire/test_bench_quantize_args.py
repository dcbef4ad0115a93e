"""`kvwire bench quantize`'s flags: each one does something (``--shapes`` was accepted and ignored;
the token count is ``--tokens``, the shape ``--num-kv-heads``/``--head-dim``/``--page-size``)."""
import pytest

from kvwire.cli import build_parser


def test_shapes_is_not_a_quantize_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["bench", "quantize", "--shapes", "32x32k"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --shapes 32x32k" in capsys.readouterr().err


def test_no_quantize_flag_is_documented_as_ignored(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "quantize", "--help"])
    text = capsys.readouterr().out
    assert "--tokens" in text and "--shapes" not in text and "ignored" not in text
