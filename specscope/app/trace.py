"""A stored or streamed run as the UI sees it: its events split into start, rounds and end (pure data, no I/O)."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from specscope.backend.engine.draft_tiers import tier_cut, tier_note

Event = Mapping[str, Any]
Piece = Callable[[int], str]
Cell = tuple[int, int, str]  # (position, token id, state)


def id_piece(token: int) -> str:
    """The display of a token whose text is unknown."""
    return f"#{token}"


def make_piece(vocab: Sequence[str] | None, known: Mapping[int, str] | None = None) -> Piece:
    """Token id -> display text: pieces the trace itself recorded, else the vocabulary, else `#id`."""
    known = dict(known or {})

    def piece(token: int) -> str:
        if token in known:
            return known[token]
        if vocab is not None and 0 <= token < len(vocab):
            return vocab[token]
        return id_piece(token)

    return piece


@dataclass
class RunTrace:
    """One run's events, ordered; rounds sorted by round number. `kv` holds stored KV intervals, if loaded."""
    run_id: str
    mode: str = ""
    model: str = ""
    prompt: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    prompt_ids: list[int] = field(default_factory=list)
    prompt_pieces: list[str] = field(default_factory=list)
    tiers: list[list[int]] = field(default_factory=list)    # block_size_tiers in force: [max_running, size]
    model_hash: str = ""
    matmul: str = ""    # the precision of its forwards' matmuls ("" for runs that did not record it)
    forward: str = ""   # the forward backend that ran it, fused or torch ("" for runs that did not record it)
    cost_curve: dict[str, Any] | None = None   # what a forward cost by its rows on the engine that ran it
    rounds: list[Event] = field(default_factory=list)
    end: Event | None = None
    error: str | None = None
    kv: list[Event] = field(default_factory=list)
    next_seq: int = 0  # the seq after the last event taken (where a live follow resumes)

    @classmethod
    def from_events(cls, events: Iterable[Event], kv: Sequence[Event] = ()) -> RunTrace:
        trace: RunTrace | None = None
        for event in events:
            if trace is None:
                trace = cls(run_id=str(event.get("run_id", "")))
            trace.add(event)
        if trace is None:
            raise ValueError("a run needs at least one event")
        trace.kv = list(kv)
        trace.rounds.sort(key=lambda e: e["round"])
        return trace

    def add(self, event: Event) -> None:
        """Take one more event of this run (as streamed or stored: a round with its KV operations folded in, or a
        run stored before the folding, with kv events of their own; the KV figures read the stored intervals)."""
        self.next_seq = max(self.next_seq, int(event.get("seq", -1)) + 1)
        kind = event.get("type")
        if kind == "run_start":
            self.mode, self.model = event.get("mode") or "", event.get("model") or ""
            self.prompt = event.get("prompt") or ""
            self.params = dict(event.get("params") or {})
            self.prompt_ids = list(event.get("prompt_ids") or [])
            self.prompt_pieces = list(event.get("pieces") or [])
            self.tiers = list(event.get("block_size_tiers") or [])
            self.model_hash = event.get("model_hash") or ""
            self.matmul = event.get("matmul") or ""
            self.forward = event.get("forward") or ""
            self.cost_curve = event.get("cost_curve")
        elif kind == "round":   # less the KV operations folded in (a run stored before the folding has none)
            self.rounds.append({k: v for k, v in event.items() if k != "kv"} if "kv" in event else event)
        elif kind == "run_end":
            self.end = event
        elif kind == "error":
            self.error = f"{event.get('code', 'error')}: {event.get('message', '')}"

    @property
    def status(self) -> str:
        if self.end is not None:
            return str(self.end.get("status"))
        return "error" if self.error else "running"

    @property
    def cancel_reason(self) -> str | None:
        """Who cancelled a cancelled run (run_end's reason: client, model_switch, shutdown)."""
        return None if self.end is None else self.end.get("reason")

    @property
    def metrics(self) -> dict[str, Any]:
        return dict((self.end or {}).get("metrics") or {})

    @property
    def tier_note(self) -> str:
        """How many of its rounds so far a load tier drafted less than its own parameters, and why ('' for none)."""
        return tier_note(tier_cut(((r.get("extra") or {}).get("tier") for r in self.rounds), self.params))

    @property
    def committed(self) -> list[int]:
        """Every token committed so far, in order."""
        return [t for r in self.rounds for t in r.get("committed") or []]

    @property
    def output_ids(self) -> list[int]:
        if self.end is not None and self.end.get("output_ids") is not None:
            return list(self.end["output_ids"])
        return self.committed

    @property
    def text(self) -> str:
        if self.end is not None and self.end.get("text") is not None:
            return str(self.end["text"])
        return "".join(r.get("text_delta") or "" for r in self.rounds)

    @property
    def known_pieces(self) -> dict[int, str]:
        """Token texts the trace itself shows: the prompt pieces, and round pieces when rounds carry them."""
        known = dict(zip(self.prompt_ids, self.prompt_pieces, strict=False))
        for r in self.rounds:
            known.update(zip(r.get("tokens") or [], r.get("pieces") or [], strict=False))
        return known

    @property
    def accepted_lens(self) -> list[int]:
        return [int(r.get("accepted_len") or 0) for r in self.rounds]

    def progress(self) -> tuple[list[int], list[int]]:
        """(cumulative NFE, cumulative committed tokens) after each round, starting from (0, 0)."""
        nfe = list(accumulate((int(r.get("nfe") or 0) for r in self.rounds), initial=0))
        tokens = list(accumulate((len(r.get("committed") or []) for r in self.rounds), initial=0))
        return nfe, tokens

    def context(self, index: int) -> list[Cell]:
        """The sequence before round `index`'s block: prompt then committed tokens, as (pos, id, state)."""
        block_start = int(self.rounds[index].get("block_start") or 0)
        before = [t for r in self.rounds[:index] for t in r.get("committed") or []]
        sequence = (self.prompt_ids + before)[:block_start]
        n_prompt = len(self.prompt_ids)
        return [(pos, tok, "prompt" if pos < n_prompt else "committed") for pos, tok in enumerate(sequence)]
