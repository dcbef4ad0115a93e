"""Tokenizer built from GGUF metadata or a Hugging Face ``tokenizer.json`` (``tokenizers`` library).

The GGUF path rebuilds what llama.cpp does for byte-level BPE vocabularies. For SmolLM2
(``tokenizer.ggml.pre == "smollm"``) that is: isolate every digit, then the GPT-2 split regex,
then byte-level BPE -- identical to the ``Digits(individual_digits=True)`` + ``ByteLevel``
pre-tokenizer of the model's own tokenizer.json. (transformers' GGUF loader omits the digit step,
which changes results for whitespace runs before a digit, e.g. ``"a  1"``.)
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4
_CHATML_SYSTEM = re.compile(r"<\|im_start\|>system(?:\n|\\n)")
_CHATML_END = "<|im_end|>"
_JINJA_CODE = re.compile(r"\{\{|\}\}|\{%|%\}|['\"]\s*[+~]|[+~]\s*['\"]")


def default_system_prompt(chat_template: str) -> str | None:
    r"""The system prompt a ChatML Jinja template inserts when the messages have none: the text of
    its first literal ``<|im_start|>system\n...<|im_end|>``. Text that concatenates strings or holds
    Jinja tags is template code (``'<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>'``),
    not a default, and is skipped; each system header is tried on its own, so a skipped one cannot
    swallow the literal after it."""
    for start in _CHATML_SYSTEM.finditer(chat_template):
        end = chat_template.find(_CHATML_END, start.end())
        if end >= 0 and not _JINJA_CODE.search(chat_template[start.end():end]):
            return chat_template[start.end():end]
    return None


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """Pre-tokenizer for llama.cpp's ``tokenizer.ggml.pre`` name."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx"):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre not in (None, "default", "gpt2"):
        warnings.warn(f"unknown GGUF pre-tokenizer {pre!r}; falling back to GPT-2 splitting", stacklevel=3)
    return byte_level


class Tokenizer:
    """Text <-> token ids, plus the bits of model metadata a server needs (BOS/EOS, chat format)."""

    def __init__(
        self,
        backend: HFTokenizer,
        bos_token_id: int | None,
        eos_token_ids: tuple[int, ...],
        add_bos: bool = False,
        default_system_prompt: str | None = None,
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self.add_bos = add_bos
        self.default_system_prompt = default_system_prompt

    @property
    def eos_token_id(self) -> int | None:
        """The primary EOS id (first of :attr:`eos_token_ids`)."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_gguf(cls, reader) -> Tokenizer:
        """Build from an open ``gguf.GGUFReader``; only byte-level BPE (``gpt2``) vocabularies."""
        from kvwire.model.gguf_loader import field_value

        kind = field_value(reader, "tokenizer.ggml.model")
        if kind != "gpt2":
            raise NotImplementedError(f"GGUF tokenizer model {kind!r} unsupported (only byte-level BPE 'gpt2')")
        tokens = list(field_value(reader, "tokenizer.ggml.tokens"))
        types = list(field_value(reader, "tokenizer.ggml.token_type", []))
        merges = [tuple(m.split(" ", 1)) for m in field_value(reader, "tokenizer.ggml.merges", [])]
        spelling = _bytes_to_unicode()
        alphabet = set(spelling.values())
        spelled = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
        backend = HFTokenizer(
            models.BPE(vocab={t: i for i, t in enumerate(spelled)}, merges=merges, fuse_unk=False, byte_fallback=False)
        )
        backend.pre_tokenizer = _pre_tokenizer(field_value(reader, "tokenizer.ggml.pre"))
        backend.decoder = decoders.ByteLevel()
        # Control (<|im_start|>) and user-defined tokens must match whole in text, never be BPE-split.
        # One whose text had to be re-spelled is a mislabel; adding it would grow the vocabulary.
        whole = [
            (tokens[i], kind == _GGUF_CONTROL)
            for i, kind in enumerate(types)
            if kind in (_GGUF_CONTROL, _GGUF_USER_DEFINED) and spelled[i] == tokens[i]
        ]
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, special in whole if special])
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t, special in whole if not special])
        bos = field_value(reader, "tokenizer.ggml.bos_token_id")
        eos = [field_value(reader, k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
        template = field_value(reader, "tokenizer.chat_template") or ""
        return cls(
            backend,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=tuple(dict.fromkeys(int(e) for e in eos if e is not None)),
            add_bos=bool(field_value(reader, "tokenizer.ggml.add_bos_token", False)),
            default_system_prompt=default_system_prompt(template),
        )

    @classmethod
    def from_file(
        cls, path: str | Path, bos_token_id: int | None, eos_token_ids: tuple[int, ...], add_bos: bool | None = None
    ) -> Tokenizer:
        """Load a Hugging Face ``tokenizer.json``; special ids come from the model config.

        ``add_bos=None`` infers it from the file's post-processor (Llama 3 adds BOS there, and its
        tokenizer_config.json has no ``add_bos_token``), since we encode without special tokens.
        """
        backend = HFTokenizer.from_file(str(path))
        if add_bos is None:
            add_bos = bos_token_id is not None and backend.encode("a").ids[:1] == [bos_token_id]
        return cls(backend, bos_token_id, eos_token_ids, add_bos=add_bos)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text``; special tokens written in the text (``<|im_start|>``) stay whole."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def apply_chat_template(self, user_message: str, system: str | None = None) -> str:
        """Single-turn prompt ending where the assistant's reply starts.

        ChatML (SmolLM2) and Llama 3 formats are recognised from the vocabulary; the model's own
        default system prompt is inserted like its Jinja template does when ``system`` is None.
        Vocabularies with neither format get the bare message (base models have no chat format).
        Llama 3's ``<|begin_of_text|>`` is written only where ``encode`` does not add BOS itself:
        two BOS tokens degrade its output.
        """
        system = self.default_system_prompt if system is None else system
        if self.token_to_id("<|im_start|>") is not None:
            head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
            return f"{head}<|im_start|>user\n{user_message}<|im_end|>\n<|im_start|>assistant\n"
        if self.token_to_id("<|start_header_id|>") is not None:
            head = f"<|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|>" if system else ""
            bos = "" if self.add_bos else "<|begin_of_text|>"
            return (
                f"{bos}{head}<|start_header_id|>user<|end_header_id|>\n\n{user_message}<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n"
            )
        return user_message


class StreamDecoder:
    """Incremental detokenizer: feed generated ids one by one, get printable text deltas.

    Byte-level tokens can end inside a multi-byte UTF-8 character, so decoding each token alone
    would emit U+FFFD; we decode a small window of recent tokens and hold text back until it no
    longer ends in a partial character. Works for any decoder (byte-level or sentencepiece).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def _text(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self._ids[start:end], skip_special_tokens=self.skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Add one token; returns the newly completed text ('' while a character is incomplete)."""
        self._ids.append(int(token_id))
        before = self._text(self._prefix, self._read)
        after = self._text(self._prefix)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before):]

    def flush(self) -> str:
        """Emit whatever is still held back (e.g. a genuinely invalid byte sequence) at stream end."""
        before = self._text(self._prefix, self._read)
        after = self._text(self._prefix)
        self._prefix = self._read = len(self._ids)
        return after[len(before):]

