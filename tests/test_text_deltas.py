"""Text deltas stream each round's new ids through the tokenizer's incremental decoder: they must spell the output
exactly, multi-byte characters split across byte-level tokens included, as the whole-output fallback does, and
the fast decoder must give the tokenizer's own text."""
import itertools
import random

from specscope.backend.engine.modes import get_mode
from specscope.backend.engine.recorder import RunRecorder
from specscope.backend.engine.request import Request
from specscope.backend.model.tokenizer import (
    ByteText,
    PieceTable,
    RedecodedText,
    StreamedText,
    byte_table,
    text_decoder,
    text_stream,
    token_pieces,
)

TEXT = "naïve café — 漢字 and emoji 🙂 over a window of " + "many words " * 6 + "∑ ✓"


def test_deltas_spell_text_with_characters_split_across_tokens(loaded):
    tok = loaded.tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert any(tok.decode([i]).endswith("\ufffd") for i in ids)   # characters split across tokens
    assert isinstance(text_stream(tok), StreamedText)
    recorder = RunRecorder(tok, pool_held=lambda rid: [], policy=get_mode)
    assert isinstance(text_stream(tok, recorder.bytes_of), ByteText)   # the shipped tokenizer is byte-level BPE
    req = Request("r", prompt_ids=[7], mode="ar", params={}, eos_id=1)
    deltas, steps, at = [], itertools.cycle((1, 2, 1, 3, 1, 1, 5)), 0   # rounds emitting 1 to 5 tokens
    while at < len(ids):
        step = next(steps)
        deltas.append(recorder.text_delta(req, ids[at:at + step]))
        at += step
    deltas.append(recorder.text_delta(req, [1, 42]))              # EOS ends the text: nothing after it shows
    assert "".join(deltas) == TEXT and not any("\ufffd" in d for d in deltas)


def test_streamed_and_redecoded_deltas_spell_text(loaded):
    """The byte table, the incremental decoder and the whole-output fallback: the same text in any round sizes on
    real text; on random ids (invalid bytes included) a prefix of the tokenizer's text, where what follows an unfinished
    character may wait for good (random ids often end inside one; run_end's text has it all)."""
    tok = loaded.tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    rng = random.Random(1)
    table = byte_table(tok)
    for stream in (ByteText(table), StreamedText(tok.backend_tokenizer), RedecodedText(text_decoder(tok))):
        pieces, at = [], 0
        while at < len(ids):
            step = rng.randrange(1, 6)
            pieces.append(ids[at:at + step])
            at += step
        assert "".join(stream.push(p) for p in pieces) == TEXT
    for _ in range(200):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))]
        full = tok.decode(ids, skip_special_tokens=True)
        for stream in (ByteText(table), StreamedText(tok.backend_tokenizer), RedecodedText(text_decoder(tok))):
            assert full.startswith("".join(stream.push(ids[i:i + 3]) for i in range(0, len(ids), 3)))


def test_the_fast_decoder_gives_the_tokenizers_text(loaded):
    tok, decode = loaded.tokenizer, text_decoder(loaded.tokenizer)
    rng = random.Random(0)
    for _ in range(500):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))]
        assert decode(ids) == tok.decode(ids, skip_special_tokens=True)


def test_token_pieces_are_each_ids_own_text(loaded):
    """The run_start pieces: every id decoded alone, special tokens included, as the tokenizer's own decode."""
    tok = loaded.tokenizer
    ids = list(range(len(tok)))   # every id: bytes of split characters, special tokens, plain words
    assert token_pieces(tok, ids) == [tok.decode([i]) for i in ids]


def test_the_piece_table_gives_the_pieces_it_remembers(loaded):
    """Engine.pieces keeps each id's text once made: prompts with repeated and shared ids get token_pieces."""
    tok, rng = loaded.tokenizer, random.Random(3)
    table = PieceTable(tok)
    for _ in range(20):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 30))] * rng.randrange(1, 3)
        assert table(ids) == token_pieces(tok, ids)
    assert 0 < len(table.known) < len(tok)


def test_byte_table_only_for_byte_level_bpe(loaded):
    """Every id's bytes decode to the tokenizer's own text for that id; a tokenizer with another decoder gets no
    table (its deltas go through the incremental decoder)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast
    tok, table = loaded.tokenizer, byte_table(loaded.tokenizer)
    assert len(table) == len(tok) and table[tok.eos_token_id] == b""
    assert [t.decode("utf-8", "replace") for t in table] == [tok.decode([i], skip_special_tokens=True)
                                                            for i in range(len(tok))]
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    wordpiece.decoder = decoders.WordPiece()
    assert byte_table(PreTrainedTokenizerFast(tokenizer_object=wordpiece)) is None


def test_byte_deltas_after_an_unfinished_character_decode_it_first():
    """An all-ASCII push skips the incremental decoder only when it holds no bytes of an unfinished character."""
    table = [b"a", b"\xc3", b"\xa9", b" b", b"\xff", b"\xe2\x82"]
    for pushes in ([[0], [1], [2, 3]], [[1], [0]], [[5], [3], [4], [0]], [[1], [2], [0], [5], [2]]):
        stream = ByteText(table)
        whole = b"".join(table[i] for push in pushes for i in push).decode("utf-8", "replace")
        deltas = [stream.push(push) for push in pushes]
        assert whole.startswith("".join(deltas)) and "".join(deltas) + stream.utf8.decode(b"", final=True) == whole
