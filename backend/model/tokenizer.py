"""Byte-level BPE tokenizer trained on the offline corpus, with our special tokens and chat template."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

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
    return AutoTokenizer.from_pretrained(str(folder))
