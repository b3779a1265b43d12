"""Text deltas decode a short window per round: they must spell the output exactly, multi-byte characters split
across byte-level tokens included, and the fast decoder must give the tokenizer's own text."""
import itertools
import random

from backend.engine.modes import get_mode
from backend.engine.recorder import TEXT_WINDOW, RunRecorder
from backend.engine.request import Request
from backend.model.tokenizer import text_decoder

TEXT = "naïve café — 漢字 and emoji 🙂 over a window of " + "many words " * 6 + "∑ ✓"


def test_deltas_spell_text_with_characters_split_across_tokens(loaded):
    tok = loaded.tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert len(ids) > 2 * TEXT_WINDOW and any(tok.decode([i]).endswith("\ufffd") for i in ids)   # split chars
    recorder = RunRecorder(tok, pool_held=lambda rid: [])
    req = Request("r", prompt_ids=[7], mode=get_mode("ar"), params={}, eos_id=None)
    deltas, steps = [], itertools.cycle((1, 2, 1, 3, 1, 1, 5))   # rounds committing 1 to 5 tokens
    while len(req.generated) < len(ids):
        req.tokens = [7, *ids[:len(req.generated) + next(steps)]]
        deltas.append(recorder.text_delta(req))
    assert "".join(deltas) == TEXT and not any("\ufffd" in d for d in deltas)


def test_the_fast_decoder_gives_the_tokenizers_text(loaded):
    tok, decode = loaded.tokenizer, text_decoder(loaded.tokenizer)
    rng = random.Random(0)
    for _ in range(500):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))]
        assert decode(ids) == tok.decode(ids, skip_special_tokens=True)
