"""Context lengths too short for the haystack are refused before anything runs, naming the smallest
length that works for the --questions given."""
import pytest

from kvwire.cli import main
from kvwire.validate import prompts

SEEDS = [f"{s}:n:0" for s in range(20)]


@pytest.fixture()
def no_model(monkeypatch):
    """Loading the model's weights fails the test: the refusal must come first."""
    from kvwire.model import registry

    def refuse(*args, **kwargs):
        raise AssertionError("the model loaded before the lengths were checked")

    monkeypatch.setattr(registry, "load_model", refuse)


@pytest.mark.parametrize("questions,length", [(3, 512), (1, 256), (2, 300)])
def test_short_lengths_are_refused_before_the_model_loads(no_model, tokenizer, tmp_path, capsys,
                                                          questions, length):
    code = main(["validate", "--formats", "nvfp4", "--lengths", f"{length},1024", "--questions", str(questions),
                 "--prefix-cold", "1", "--no-progress", "--out", str(tmp_path / "v")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("kvwire validate: error: ")
    need = prompts.min_haystack_tokens(tokenizer, questions)
    assert f"context length {length} is too short" in err and f"smallest that works is {need} tokens" in err
    assert not (tmp_path / "v" / "results.json").exists()


@pytest.mark.parametrize("questions", [1, 3, 5])
def test_the_named_minimum_fits_every_seed(tokenizer, questions):
    """The minimum is what make_haystack's own sizing needs at worst, so every seed fits there."""
    need = prompts.min_haystack_tokens(tokenizer, questions)
    for seed in SEEDS:
        hay = prompts.make_haystack(tokenizer, need, questions, seed)
        assert max(len(tokenizer.encode(hay.context + q.suffix)) for q in hay.questions) <= need
        assert len(hay.questions) == 2 * questions


def test_minimum_grows_with_questions(tokenizer):
    one, three = prompts.min_haystack_tokens(tokenizer, 1), prompts.min_haystack_tokens(tokenizer, 3)
    assert 256 < one < three < 1024, "the default lengths and the tiny test sweep (320 with 1 question) fit"
    assert one <= 320
