"""The seeded prompts: deterministic, the right size, and asking what they claim to ask."""
import re

import pytest

from kvwire.validate.config import Task
from kvwire.validate.prompts import first_number, is_correct, make_haystack, make_passkey


@pytest.mark.parametrize("target", [768, 1024, 4096])
def test_haystack_fits_and_fills_its_length(tokenizer, target):
    hay = make_haystack(tokenizer, target, 3, "0:x:0")
    lengths = [len(tokenizer.encode(hay.context + q.suffix)) for q in hay.questions]
    assert max(lengths) <= target
    assert min(lengths) >= 0.85 * target, lengths


def test_haystack_is_deterministic_and_seeded(tokenizer):
    a, b = make_haystack(tokenizer, 1024, 3, "s1"), make_haystack(tokenizer, 1024, 3, "s1")
    c = make_haystack(tokenizer, 1024, 3, "s2")
    assert a == b
    assert a.context != c.context
    # Different seeds never share a first page, so a haystack's first ask is cold.
    assert tokenizer.encode(a.context)[:16] != tokenizer.encode(c.context)[:16]


def test_questions_match_the_facts_and_have_near_duplicates(tokenizer):
    hay = make_haystack(tokenizer, 2048, 3, "q")
    retrieval = [q for q in hay.questions if q.task is Task.RETRIEVAL]
    citation = [q for q in hay.questions if q.task is Task.CITATION]
    assert len(retrieval) == len(citation) == 3
    by_key = {f.key: f for f in hay.facts}
    assert len(by_key) == len(hay.facts), "keys are unique"
    for r, c in zip(retrieval, citation):
        key = re.search(r"secret code of (\w+ \w+)\?", r.suffix).group(1)
        fact = by_key[key]
        assert r.answer == fact.code and c.answer == fact.doc_id
        assert f"is {fact.code} (from Document {fact.doc_id})" in hay.context
        first, last = key.split()
        twins = [k for k in by_key if k != key and (k.startswith(first + " ") or k.endswith(" " + last))]
        assert twins, f"{key} has no near-duplicate distractor"
        assert r.suffix.endswith(" ") and c.suffix.endswith(" "), "the answer's leading space is in the prompt"
    # Asked facts are spread through the context, not bunched at one end.
    keys = [re.search(r"of (\w+ \w+)\?", q.suffix).group(1) for q in retrieval]
    spots = [hay.context.index(f"code of {k} is") / len(hay.context) for k in keys]
    assert spots[0] < 0.35 and spots[-1] > 0.65, spots


def test_haystack_too_short_is_an_error(tokenizer):
    with pytest.raises(ValueError, match="records"):
        make_haystack(tokenizer, 120, 3, "x")


def test_passkey_prompt_size_and_seed(tokenizer):
    p = make_passkey(tokenizer, 1024, 0.5, "a")
    assert 900 <= len(tokenizer.encode(p.text)) <= 1024
    assert p.text.endswith("The pass key is ") and p.passkey in p.text
    assert make_passkey(tokenizer, 1024, 0.5, "a") == p
    assert make_passkey(tokenizer, 1024, 0.5, "b").passkey != p.passkey
    # Same filler before the needle at any depth: shallower prompts reuse deeper ones' pages.
    deep, shallow = make_passkey(tokenizer, 1024, 0.9, "a"), make_passkey(tokenizer, 1024, 0.1, "a")
    assert deep.text[:len(shallow.text) // 10] == shallow.text[:len(shallow.text) // 10]


@pytest.mark.parametrize("text,answer,ok", [
    ("48213.", "48213", True), (" 48213 is it", "48213", True), ("482131", "48213", False),
    ("4821", "48213", False), ("The code is 48213", "48213", False), ("", "48213", False)])
def test_exact_match(text, answer, ok):
    assert is_correct(text, answer) is ok
    assert (first_number(text) is None) == (not re.match(r"\s*\d", text))
