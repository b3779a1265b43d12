"""Byte-level BPE tokenizer trained on the offline corpus, with our special tokens and chat template."""
from __future__ import annotations

import codecs
import functools
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol, cast

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

MASK, EOS, PAD, USER, ASSISTANT = "<|mask|>", "<|eos|>", "<|pad|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = [PAD, EOS, MASK, USER, ASSISTANT]
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}" + USER + "{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}" + ASSISTANT + "{{ m['content'] }}" + EOS + "{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (digits split one per token) and wrap it for transformers."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return wrap(tok)


def _rust_backend(tok: Any) -> Tokenizer | None:
    """The Rust tokenizer behind tok where decoding through it gives tok.decode's text (no space clean-up)."""
    backend = getattr(tok, "backend_tokenizer", None)
    return None if backend is None or getattr(tok, "clean_up_tokenization_spaces", False) else backend


def text_decoder(tok: Any) -> Callable[[list[int]], str]:
    """`tok.decode(ids, skip_special_tokens=True)`, through the Rust tokenizer directly where that is the same
    text: transformers' wrapper costs several times the decode itself."""
    backend = _rust_backend(tok)
    if backend is not None:
        return functools.partial(backend.decode, skip_special_tokens=True)
    return functools.partial(tok.decode, skip_special_tokens=True)


def token_pieces(tok: Any, ids: list[int]) -> list[str]:
    """Each id's own text, special tokens included (`tok.decode([i])` for each id: the prompt as the UI lays it
    out), through the Rust tokenizer where that is the same text (a sixth of the time)."""
    backend = _rust_backend(tok)
    if backend is None:
        return [tok.decode([i]) for i in ids]
    return [backend.decode([i], skip_special_tokens=False) for i in ids]


class PieceTable:
    """`token_pieces` with each id's text kept once made: a prompt's pieces cost ~1 us an id through the Rust
    tokenizer, and prompts share most of their ids."""

    def __init__(self, tok: Any):
        self.tok = tok
        self.known: dict[int, str] = {}

    def __call__(self, ids: list[int]) -> list[str]:
        known = self.known
        missing = [i for i in dict.fromkeys(ids) if i not in known]
        if missing:
            known.update(zip(missing, token_pieces(self.tok, missing), strict=True))
        return [known[i] for i in ids]


class TextStream(Protocol):
    def push(self, ids: list[int]) -> str:
        """The text the output gained with these new ids. A character split across byte-level tokens waits for
        its last byte, so the deltas never show half a character and join to the decoded output."""
        ...


class StreamedText:
    """Text deltas through the Rust tokenizer's incremental decoder (~1 us a token, whatever the length)."""

    def __init__(self, backend: Tokenizer):
        self.backend, self.stream = backend, decoders.DecodeStream(skip_special_tokens=True)

    def push(self, ids: list[int]) -> str:
        return "".join(piece for i in ids if (piece := self.stream.step(self.backend, i)) is not None)


class ByteText:
    """Text deltas of a byte-level BPE tokenizer from a table of each id's bytes (`byte_table`) and an incremental
    UTF-8 decoder: what the tokenizer's own decoder does to the whole output (join the ids' bytes, decode
    replacing bad bytes), one token at a time, in a few hundred nanoseconds of C instead of a call into Rust."""

    def __init__(self, table: list[bytes]):
        self.table, self.utf8 = table, codecs.getincrementaldecoder("utf-8")("replace")
        self.pending = False
        """Whether the decoder may hold the first bytes of a character (its buffer is Python: skipped otherwise)."""

    def push(self, ids: list[int]) -> str:
        table, size = self.table, len(self.table)
        data = b"".join([table[i] if 0 <= i < size else b"" for i in ids])
        if not self.pending and data.isascii():
            return data.decode("ascii")
        text = self.utf8.decode(data)
        self.pending = bool(self.utf8.getstate()[0])
        return text


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the character each byte is written as in the vocabulary -> the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def byte_table(tok: Any) -> list[bytes] | None:
    """Each id's bytes as a byte-level BPE tokenizer's decoder joins them (none for special tokens, which decoding
    with skip_special_tokens drops), or None where the tokenizer is not plain byte-level BPE, or where any single
    id decodes to other text than its bytes (every id is checked)."""
    backend = _rust_backend(tok)
    if backend is None or not isinstance(backend.decoder, decoders.ByteLevel) or not isinstance(backend.model,
                                                                                             models.BPE):
        return None
    special = {i for i, added in backend.get_added_tokens_decoder().items() if added.special}
    alphabet, table = _byte_alphabet(), []
    for i in range(backend.get_vocab_size(with_added_tokens=True)):
        token = backend.id_to_token(i)
        if token is None or i in special:
            table.append(b"")
        elif all(c in alphabet for c in token):
            table.append(bytes(alphabet[c] for c in token))
        else:   # an added token outside the byte alphabet: its own text, as the decoder keeps it
            table.append(token.encode())
    alone = backend.decode_batch([[i] for i in range(len(table))], skip_special_tokens=True)
    if any(data.decode("utf-8", "replace") != text for data, text in zip(table, alone, strict=True)):
        return None
    return table


class RedecodedText:
    """Text deltas of a tokenizer the incremental decoder cannot stand in for: the whole output decoded again."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode, self.ids, self.shown = decode, list[int](), ""

    def push(self, ids: list[int]) -> str:
        self.ids += ids
        text = self.decode(self.ids)
        if text.endswith("\ufffd") or len(text) <= len(self.shown):
            return ""
        delta, self.shown = text[len(self.shown):], text
        return delta


def text_stream(tok: Any, table: list[bytes] | None = None) -> TextStream:
    """A fresh text-delta stream for one run's output: from the tokenizer's `byte_table` when given, else through
    its incremental decoder, else by decoding the whole output again."""
    if table is not None:
        return ByteText(table)
    backend = _rust_backend(tok)
    return RedecodedText(text_decoder(tok)) if backend is None else StreamedText(backend)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, mask_token=MASK,
                                   additional_special_tokens=[USER, ASSISTANT])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def chat_prompt(user_text: str) -> str:
    """The model-facing text for one user turn, ready for the assistant's answer."""
    return f"{USER}{user_text}{ASSISTANT}"


def load_tokenizer(folder: str | Path) -> PreTrainedTokenizerFast:
    from transformers import AutoTokenizer
    return cast(PreTrainedTokenizerFast, AutoTokenizer.from_pretrained(str(folder)))


MASK_NAMES = ("<|MASK|>", "<|mask|>", "<|mdm_mask|>", "[MASK]", "<mask>")


def mask_token_id(tok: PreTrainedTokenizerFast) -> int | None:
    """The tokenizer's mask token: its declared mask_token, else a special token with a known mask name."""
    if tok.mask_token is not None:
        return tok.mask_token_id
    vocab = tok.get_vocab()
    return next((vocab[name] for name in MASK_NAMES if name in vocab), None)


def ensure_chat_template(tok: PreTrainedTokenizerFast, folder: Path) -> None:
    """Fill in a chat template shipped only as chat_template.json (processor layout) or chat_template.jinja."""
    if tok.chat_template:
        return
    if (folder / "chat_template.jinja").exists():
        tok.chat_template = (folder / "chat_template.jinja").read_text()
    elif (folder / "chat_template.json").exists():
        tok.chat_template = json.loads((folder / "chat_template.json").read_text()).get("chat_template")
