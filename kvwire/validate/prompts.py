"""Seeded prompts for the recall tasks: passkey, multi-document retrieval and citation.

No downloads: every prompt is built from word lists and a seed, so a sweep repeats exactly.

The haystack is many short documents, each stating one fact, ``The secret code of Alice Smith is
48213 (from Document 512).``, followed by a few plain filler sentences. Each asked-for key has a
near-duplicate distractor elsewhere (same first name or same last name, other code, other
document): a key-quantisation error that blurs "Alice Smith" into "Alice Jones" picks the wrong
span, which is exactly the failure a compressed cache can cause while perplexity looks fine.
The wording was chosen so SmolLM2-135M answers in bf16 (it copies spans well, it cannot
reason): the retrieval answer follows the key, the citation answer follows the fact.
"""
from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass

from kvwire.tasks.passkey import PasskeyPrompt, make_passkey_prompt
from kvwire.validate.config import Task

FIRST = ("Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Louis Maria Nathan Olivia Peter "
         "Quinn Rachel Simon Tina Victor Wendy Xavier Yvonne Adam Bella Chris Diana Ethan Fiona George "
         "Hannah Ivan Julia Kevin Laura Mike Nora Oscar Paula Ryan Sarah Tom Uma Vera Will Lucy Omar").split()
LAST = ("Smith Jones Brown Lee Khan Garcia Miller Davis Wilson Moore Taylor Clark Lopez Hill Scott "
        "Young").split()
FILLER = (
    "The weather was mild and the office was quiet that day.",
    "Nobody remembered who had left the lights on in the hall.",
    "The report was filed on time and nobody asked about it again.",
    "A delivery of paper arrived in the afternoon and was stacked by the door.",
    "The meeting ran late, as meetings on Thursdays usually did.",
    "Somebody had watered the plants on the windowsill before noon.",
)
# Every question ends with the space before the answer: SmolLM2 writes " 48213" as a space token
# and one token per digit, so the space in the prompt saves a decode step per answer.
ANSWER_LEAD = " "
# Plain sentences after each record: a document is a short paragraph, not a bare list. Denser
# haystacks (one sentence per record) left bf16 SmolLM2 at 0/3 on retrieval from 2k tokens on.
FILLER_PER_DOC = 4
INTRO = "Below are records of secret codes. Each record names the document it comes from.\n\n"


@dataclass(frozen=True)
class Fact:
    key: str
    code: str
    doc_id: str


@dataclass(frozen=True)
class Question:
    task: Task
    suffix: str        # appended to the shared context
    answer: str        # exact expected answer: the first number the model writes


@dataclass(frozen=True)
class Haystack:
    context: str
    facts: tuple[Fact, ...]
    questions: tuple[Question, ...]   # retrieval questions first, then citation, same facts in order


def record(f: Fact) -> str:
    return f"The secret code of {f.key} is {f.code} (from Document {f.doc_id})."


def retrieval_question(f: Fact) -> Question:
    return Question(Task.RETRIEVAL, f"Question: What is the secret code of {f.key}?\n"
                                    f"Answer: The secret code of {f.key} is ", f.code)


def citation_question(f: Fact) -> Question:
    return Question(Task.CITATION, f"Question: Which document gives the secret code of {f.key}?\n"
                                   f"Answer: The secret code of {f.key} is {f.code} (from Document ", f.doc_id)


def _near_duplicate(key: tuple[str, str], used: set[tuple[str, str]], rng: random.Random) -> tuple[str, str]:
    """Another unused key sharing the first or the last name with ``key``."""
    first, last = key
    options = [(first, x) for x in LAST if x != last] + [(x, last) for x in FIRST if x != first]
    options = [k for k in options if k not in used]
    if not options:
        raise ValueError(f"no unused near-duplicate of {first} {last} left")
    return rng.choice(options)


# The seeded first line at its size (8 digits): its tokens count against the haystack's length.
HEAD_SAMPLE = "Archive 12345678. "
# The record and filler the size estimate assumes; real ones differ by a few tokens.
SAMPLE = Fact("Alice Smith", "48213", "512")


def _document(f: Fact, fillers: tuple[str, ...]) -> str:
    return f"{record(f)} {' '.join(fillers)}\n"


def _sizes(tokenizer, facts: list[Fact], fillers: tuple[str, ...]) -> tuple[int, int]:
    """(tokens per document, tokens outside the documents), the longest over ``facts``: one sample for
    make_haystack's first estimate, every possible key for the guaranteed minimum."""
    per_record = max(len(tokenizer.encode(_document(f, fillers))) for f in facts)
    room = len(tokenizer.encode(HEAD_SAMPLE + INTRO)) + max(len(tokenizer.encode(citation_question(f).suffix))
                                                          for f in facts)
    return per_record, room


def fewest_records(questions: int) -> int:
    """Each asked fact, its near-duplicate distractor, and one more so the asked ones are not the edges."""
    return 2 * questions + 1


def min_haystack_tokens(tokenizer, questions: int) -> int:
    """The smallest ``target_tokens`` make_haystack fills for every seed: its fewest records, each as long
    as a record can be (longest key, longest filler sentences), plus the longest question and the blank
    line before it. Checked before a sweep starts, so a short --lengths fails before any prompt runs."""
    fillers = tuple(sorted(FILLER, key=lambda s: len(tokenizer.encode(s)))[-FILLER_PER_DOC:])
    # Codes and document ids have fixed digit counts; SmolLM2 spends one token per digit.
    facts = [Fact(f"{a} {b}", "12345", "123") for a in FIRST for b in LAST]
    per_record, room = _sizes(tokenizer, facts, fillers)
    return room + fewest_records(questions) * per_record + 1


def make_haystack(tokenizer, target_tokens: int, questions: int, seed: str) -> Haystack:
    """A context of at most ``target_tokens`` (longest question included) with ``questions``
    asked-for facts spread evenly through it, each with one near-duplicate distractor at a
    random place."""
    if questions < 1:
        raise ValueError("a haystack needs at least one question")
    per_record, room = _sizes(tokenizer, [SAMPLE], FILLER[:FILLER_PER_DOC])
    fewest = fewest_records(questions)
    n = int((target_tokens - room) / per_record)
    while n >= fewest:
        hay = _build(n, questions, seed)
        longest = max(len(tokenizer.encode(hay.context + q.suffix)) for q in hay.questions)
        if longest <= target_tokens:
            return hay
        if n == fewest:
            break
        # Never skip past the fewest records: they fit whenever min_haystack_tokens does.
        n = max(fewest, n - 1 - int((longest - target_tokens) / per_record))
    raise ValueError(f"{target_tokens} tokens hold fewer than {fewest} records, needed for {questions} "
                     f"questions and their distractors; give at least {min_haystack_tokens(tokenizer, questions)}")


def _build(n: int, questions: int, seed: str) -> Haystack:
    rng = random.Random(f"haystack:{seed}")
    keys = [(a, b) for a in FIRST for b in LAST]
    if n > min(len(keys), 900):
        raise ValueError(f"{n} records exceed what the word lists allow ({min(len(keys), 900)})")
    rng.shuffle(keys)
    targets = [keys.pop() for _ in range(questions)]
    used = set(targets)
    distractors = []
    for t in targets:
        d = _near_duplicate(t, used, rng)
        used.add(d)
        distractors.append(d)
    others = [k for k in keys if k not in used][:n - 2 * questions]
    slots: list = [None] * n
    target_slots = [int((i + 0.5) * n / questions) for i in range(questions)]
    for i, s in enumerate(target_slots):
        slots[s] = targets[i]
    free = [i for i in range(n) if slots[i] is None]
    for d, s in zip(distractors, rng.sample(free, len(distractors))):
        slots[s] = d
    rest = iter(others)
    slots = [s if s is not None else next(rest) for s in slots]
    codes = rng.sample(range(10000, 100000), n)
    ids = rng.sample(range(100, 1000), n)
    facts = [Fact(f"{a} {b}", str(c), str(i)) for (a, b), c, i in zip(slots, codes, ids)]
    body = "".join(f"{record(f)} {' '.join(rng.sample(FILLER, FILLER_PER_DOC))}\n" for f in facts)
    asked = [facts[s] for s in target_slots]
    qs = tuple([retrieval_question(f) for f in asked] + [citation_question(f) for f in asked])
    # A seeded first line: no two haystacks share a first page, so a first ask is really cold.
    head = f"Archive {rng.randrange(10**7, 10**8)}. "
    return Haystack(head + INTRO + body + "\n", tuple(facts), qs)


def make_passkey(tokenizer, target_tokens: int, depth: float, seed: str) -> PasskeyPrompt:
    """kvwire.tasks.passkey's prompt, with a number seed derived from the sweep's seed string."""
    p = make_passkey_prompt(tokenizer, target_tokens, depth, seed=random.Random(f"passkey:{seed}").randrange(2**31))
    return dataclasses.replace(p, text=p.text + ANSWER_LEAD)


_NUMBER = re.compile(r"\s*(\d+)")


def first_number(text: str) -> str | None:
    """The number the answer starts with (leading spaces allowed), or None."""
    m = _NUMBER.match(text)
    return m.group(1) if m else None


def is_correct(text: str, answer: str) -> bool:
    """Exact match: the completion starts with exactly this number (no extra digits)."""
    return first_number(text) == answer
