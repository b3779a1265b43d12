"""Why two stored runs of one prompt differ. The first output position where their tokens part; each run's row for
that position re-scored in its own configuration (the weights and adapter, the matmul precision, and the forward
its mode ran there: the prefill's last row, a decode row, a row of a causal verify or refresh chunk, a row of a
denoise or draft block as the stored rounds show its state); then the same row re-scored with one difference
changed at a time, to name the one that moves the argmax. A side's resolution is what its precision can tell
apart on this row: twice the largest |logit difference| between it and float32 (a float32 run: against the
eager backend's float32 GEMMs, another summation order); a margin under it is a near-tie.

`diverge` plans and reports in plain data (the server does it in its own process); `rescore` runs the probes on
the engine's thread (the worker's, or the CLI's own engine)."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

import torch
from torch import Tensor

from specscope.backend.engine.lossless import Outcome, claim_of, first_difference, temperature, verdict
from specscope.backend.engine.modes import baseline
from specscope.backend.engine.request import Request
from specscope.backend.engine.runtime import Runtime
from specscope.backend.engine.sampling import allowed
from specscope.backend.forward.fused_step import CAUSAL, MatmulUnavailable, fused_decode
from specscope.backend.forward.plan import ForwardBackend, ForwardPlan, ForwardResult

TOP_K = 5
CHUNK = 16
"""Prefix rows a forward writes after the prompt's prefill: a written causal chunk, the decode steps' numbers."""
MASK = -1
"""A masked position in a site's ids; the engine puts its own mask token there."""
REFERENCE = "float32"
EAGER = "eager"
"""A float32 run's reference for its resolution: the eager backend (float32 GEMMs, another summation order)."""
CAUSAL_KINDS = ("verify", "decode", "refresh")
Row = dict[str, Any]

if TYPE_CHECKING:
    from specscope.backend.engine.engine import Engine


@dataclass(frozen=True)
class RunConfig:
    """One stored run as its run_start, run_end and rounds record it."""
    run_id: str
    mode: str
    params: Mapping[str, Any]
    model: str
    weights: str | None
    matmul: str
    status: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    rounds: tuple[Mapping[str, Any], ...] = ()
    forward: str | None = None

    @classmethod
    def from_events(cls, run_id: str, start: Row, end: Row, rounds: Sequence[Row] = ()) -> RunConfig:
        """From the stored run_start and run_end events and round payloads (a run older than the matmul field
        counts as float32; one older than the forward field ran on an unknown backend)."""
        return cls(run_id, start["mode"], dict(start.get("params") or {}), start.get("model", ""),
                   start.get("model_hash"), start.get("matmul", REFERENCE), end.get("status", "done"),
                   tuple(start.get("prompt_ids") or ()), tuple(end.get("output_ids") or ()), tuple(rounds),
                   start.get("forward"))

    def outcome(self) -> Outcome:
        return Outcome(self.mode, self.output_ids, self.params, self.status, self.weights, self.matmul,
                       self.prompt_ids, self.forward)

    @property
    def context(self) -> tuple[int, ...]:
        return self.prompt_ids + self.output_ids


@dataclass(frozen=True)
class Site:
    """The forward whose row picked a position: its kind and attention, its first row's position (the KV prefix
    ends there), its query ids (MASK where masked) and the row; `lora` as the run's forward asked for it."""
    kind: str
    attn: str
    start: int
    ids: tuple[int, ...]
    row: int
    lora: bool = False

    def describe(self) -> str:
        """E.g. 'decode row 1 of 1 (causal)', 'denoise row 7 of 32 (block, 25 masked)'."""
        masked = f", {sum(i == MASK for i in self.ids)} masked" if self.attn == "block" else ""
        return f"{self.kind} row {self.row + 1} of {len(self.ids)} ({self.attn}{masked})"

    def to_json(self) -> Row:
        return {"kind": self.kind, "attn": self.attn, "start": self.start, "rows": len(self.ids), "row": self.row,
                "lora": self.lora}


@dataclass(frozen=True)
class Config:
    """How a row is computed: the matmul precision (a fused step's, or EAGER) and the adapter on or off."""
    matmul: str
    adapter: bool


@dataclass(frozen=True)
class Probe:
    """One re-scoring: the prefix's KV (the prompt's prefill, then causal chunks), then the site's forward."""
    prefix: tuple[int, ...]
    prompt_len: int
    site: Site
    config: Config


@dataclass(frozen=True)
class Rescored:
    """A probe's row of logits [V] (float32, MASK at -inf), or why it could not run here."""
    logits: Tensor | None
    unavailable: str | None = None


@dataclass(frozen=True)
class Served:
    """The engine that re-scores: its model's name ('+adapter' when it has one) and weights hash."""
    name: str
    weights: str


Score = Callable[[list[Probe]], list[Rescored]]


# ---- the engine's side ----

_built: WeakKeyDictionary[Runtime, dict[str, ForwardBackend]] = WeakKeyDictionary()


@dataclass(frozen=True)
class AdapterOff:
    """A backend whose forwards run with the adapter off."""
    inner: ForwardBackend

    def run(self, plan: ForwardPlan) -> ForwardResult:
        return self.inner.run(replace(plan, adapter=False))


def backend_for(rt: Runtime, matmul: str) -> ForwardBackend:
    """The runtime's backend in that precision: its own, its eager one, or a fused step built once in `matmul`;
    MatmulUnavailable where it cannot run here."""
    if matmul == rt.matmul:
        return rt.backend
    if matmul == EAGER:
        return rt.eager
    built = _built.setdefault(rt, {})
    if matmul not in built:
        fused = fused_decode(rt.model, rt.pool.memory, rt.eager, matmul)
        if fused is None or fused.matmul != matmul:
            raise MatmulUnavailable(f"{matmul} matmuls do not run here (this engine's are {rt.matmul})")
        built[matmul] = fused
    return built[matmul]


def write_prefix(rt: Runtime, req: Request, probe: Probe, backend: ForwardBackend) -> None:
    """The prefix's KV as a run writes it: the prompt in one prefill, then causal chunks of CHUNK rows."""
    n = len(probe.prefix)
    bounds = sorted({0, min(probe.prompt_len, n), *range(probe.prompt_len + CHUNK, n, CHUNK), n})
    for start, stop in zip(bounds, bounds[1:], strict=False):
        slots = rt.alloc(req, list(range(start, stop)))
        rt.score(req, list(probe.prefix[start:stop]), start, "causal", kind="prefill", write=slots, backend=backend)
        rt.commit(req, slots)


def rescore_one(rt: Runtime, probe: Probe) -> Rescored:
    """One probe's row. Its forwards count as prefills: no run's NFE or round."""
    try:
        backend = backend_for(rt, probe.config.matmul)
    except MatmulUnavailable as e:
        return Rescored(None, str(e))
    if not probe.config.adapter:
        backend = AdapterOff(backend)
    site = probe.site
    ids = [rt.mask if i == MASK else i for i in site.ids]
    req = Request(rid="diverge", prompt_ids=list(probe.prefix[:probe.prompt_len]), mode=baseline(), params={},
                  eos_id=rt.eos_id)
    try:
        write_prefix(rt, req, probe, backend)
        slots = None if site.attn == "block" else rt.alloc(req, list(range(site.start, site.start + len(ids))))
        scores = rt.score(req, ids, site.start, site.attn, kind="prefill", write=slots, lora=site.lora,
                          backend=backend)
    finally:
        rt.release_all(req, "scored")
    return Rescored(allowed(scores.logits[site.row], rt.mask_id).cpu())


def rescore(engine: Engine, probes: list[Probe]) -> list[Rescored]:
    """Each probe's row, computed on the engine's own thread."""
    with torch.inference_mode():
        return [rescore_one(engine.rt, p) for p in probes]


# ---- where a run's token came from ----

def site_of(run: RunConfig, position: int) -> Site:
    """The forward whose row picked the run's token at output `position`, as its stored rounds show it (a decode
    row where they do not)."""
    n_prompt, ctx = len(run.prompt_ids), run.context
    t = n_prompt + position
    if position == 0:
        return Site("prefill", "causal", 0, run.prompt_ids, n_prompt - 1)
    for i, r in enumerate(run.rounds):
        states, j = r.get("states") or [], t - r["block_start"]
        if r["round"] > 0 and 0 <= j < len(states) and states[j] in ("accepted", "bonus"):
            found = round_site(run.rounds, i, ctx, t, states[j])
            if found is not None:
                return found
    return Site("decode", "causal", t - 1, (ctx[t - 1],), 0)


def round_site(rounds: Sequence[Mapping[str, Any]], i: int, ctx: tuple[int, ...], t: int,
               state: str) -> Site | None:
    """The site of a token round `i` emitted: a denoise (or block draft) row for a block mode's accepted token,
    else the round's causal verify, decode or refresh row."""
    phases = rounds[i].get("phases") or []
    causal = [ph for ph in phases if ph["kind"] in CAUSAL_KINDS and ph["attn"] in CAUSAL]
    block = [ph for ph in phases if ph["attn"] == "block"]
    if state == "accepted" and block and all(ph["kind"] == "refresh" for ph in causal):
        return denoise_site(rounds, i, t, block[0])
    return causal_site(ctx, t, rounds[i]["block_start"], causal[-1]) if causal else None


def causal_site(ctx: tuple[int, ...], t: int, block_start: int, phase: Mapping[str, Any]) -> Site:
    """The row at t - 1 of the round's causal chunk of `n_query` rows (starting at the round's block where the
    row falls in it); rows past the context repeat its last token (later rows never reach this one)."""
    n = max(int(phase["n_query"]), 1)
    start = block_start if block_start <= t - 1 < block_start + n else t - 1
    ids = ctx[start:start + n]
    return Site(phase["kind"], phase["attn"], start, ids + ids[-1:] * (n - len(ids)), t - 1 - start,
                bool(phase.get("lora")))


def denoise_site(rounds: Sequence[Mapping[str, Any]], i: int, t: int, phase: Mapping[str, Any]) -> Site:
    """Row t - 1 of the block as it stood before round `i` denoised it: the previous round's state of the same
    block, or a fresh block [seed, MASK, ...]."""
    r = rounds[i]
    start, size = r["block_start"], r.get("block_size") or len(r["tokens"])
    prev = rounds[i - 1] if i > 0 else None
    same = (prev is not None and prev["round"] > 0 and prev["block_start"] == start and prev.get("block_size")
            and not any(ph["kind"] == "refresh" for ph in prev.get("phases") or []))
    before: tuple[int, ...] = (r["tokens"][0], *[MASK] * (size - 1))
    if prev is not None and same:
        tokens, states = prev["tokens"][:size], prev["states"][:size]
        before = tuple(MASK if state == "mask" else tok for tok, state in zip(tokens, states, strict=True))
    return Site(phase["kind"], "block", start, before, t - start - 1, bool(phase.get("lora")))


def adapter_of(run: RunConfig, served: Served) -> bool | str:
    """Whether the run's rows need the served adapter on (True) or off (False: the run had none); a string saying
    why the engine cannot re-score the run (other weights)."""
    base, plus, _ = served.name.partition("+")
    if (run.weights == served.weights) if run.weights else run.model == served.name:
        return bool(plus)
    if plus and run.model == base:
        return False
    return f"made by {run.model}; the engine that re-scores serves {served.name}"


# ---- the report ----

@dataclass
class Side:
    """One run at the position: where its token came from, how to recompute it, and what the re-scoring found."""
    name: str
    run: RunConfig
    position: int | None
    site: Site | None = None
    config: Config | None = None
    why_not: str | None = None
    logits: Tensor | None = None
    resolution: float | None = None
    resolution_note: str = ""

    @property
    def token(self) -> int | None:
        outputs, at = self.run.output_ids, self.position
        return outputs[at] if at is not None and at < len(outputs) else None

    @property
    def argmax(self) -> int | None:
        return None if self.logits is None else int(self.logits.argmax())

    @property
    def margin(self) -> float | None:
        if self.logits is None:
            return None
        top2 = self.logits.topk(2).values
        return float(top2[0] - top2[1])

    def top(self, k: int) -> list[Row]:
        if self.logits is None:
            return []
        best = self.logits.topk(k)
        return [{"id": int(i), "logit": float(v)} for i, v in zip(best.indices, best.values, strict=True)]

    @property
    def reference(self) -> Config | None:
        """The configuration its resolution is measured against."""
        if self.config is None:
            return None
        return Config(EAGER if self.config.matmul == REFERENCE else REFERENCE, self.config.adapter)

    def to_json(self, k: int) -> Row:
        return {"run_id": self.run.run_id, "mode": self.run.mode, "model": self.run.model,
                "matmul": self.run.matmul, "adapter": None if self.config is None else self.config.adapter,
                "temperature": temperature(self.run.params), "token": self.token,
                "ended": self.position is not None and self.token is None,
                "path": None if self.site is None else self.site.describe(),
                "site": None if self.site is None else self.site.to_json(), "top": self.top(k),
                "margin": self.margin, "argmax": self.argmax, "reproduced": self.reproduced,
                "resolution": self.resolution, "resolution_note": self.resolution_note,
                "near_tie": self.near_tie, "not_rescored": self.why_not}

    @property
    def reproduced(self) -> bool | None:
        """Whether its own configuration, re-scored alone, picks its token (None: not re-scored, sampled or
        ended)."""
        if self.argmax is None or self.token is None or temperature(self.run.params) > 0:
            return None
        return self.argmax == self.token

    @property
    def near_tie(self) -> bool:
        return self.margin is not None and self.resolution is not None and self.margin < self.resolution


@dataclass
class Swap:
    """One side's row re-scored with one of the other side's settings."""
    factor: str
    side: Side
    other: Side
    probe: Probe
    logits: Tensor | None = None
    why_not: str | None = None

    @property
    def argmax(self) -> int | None:
        return None if self.logits is None else int(self.logits.argmax())

    @property
    def to_other(self) -> bool:
        """The change alone makes this side pick what the other side picks."""
        return self.argmax is not None and self.argmax == self.other.argmax != self.side.argmax

    def to_json(self) -> Row:
        a, b = (self.side, self.other) if self.side.name == "a" else (self.other, self.side)
        return {"factor": self.factor, "a": setting(self.factor, a), "b": setting(self.factor, b),
                "probe": f"{self.side.name}'s row with {self.other.name}'s {self.factor}", "argmax": self.argmax,
                "moves": self.argmax is not None and self.argmax != self.side.argmax, "to_other": self.to_other,
                "not_rescored": self.why_not}


def setting(factor: str, side: Side) -> str | None:
    """The side's value of a factor, in words."""
    if side.config is None or side.site is None:
        return None
    if factor == "matmul":
        return side.config.matmul
    if factor == "adapter":
        return "on" if side.config.adapter else "off"
    return side.site.describe()


def differing(a: Side, b: Side) -> list[str]:
    """The factors whose settings differ between the sides (both re-scorable)."""
    if a.config is None or b.config is None:
        return []
    found = ["matmul"] if a.config.matmul != b.config.matmul else []
    found += ["adapter"] if a.config.adapter != b.config.adapter else []
    return found + (["path"] if a.site != b.site else [])


def swapped(side: Side, other: Side, factor: str) -> Probe:
    """The side's row with the other side's setting of `factor`."""
    assert side.config is not None and other.config is not None
    site, config = side.site, side.config
    if factor == "matmul":
        config = replace(config, matmul=other.config.matmul)
    elif factor == "adapter":
        config = replace(config, adapter=other.config.adapter)
    else:
        site = other.site
    return probe_of(side.run, site, config)


def probe_of(run: RunConfig, site: Site | None, config: Config) -> Probe:
    assert site is not None
    return Probe(run.context[:site.start], len(run.prompt_ids) if site.start else 0, site, config)


def prepare(side: Side, served: Served) -> None:
    """Where the side's token came from and how the served engine recomputes it (or why it cannot)."""
    adapter = adapter_of(side.run, served)
    if isinstance(adapter, str):
        side.why_not = adapter
        return
    assert side.position is not None
    side.site = site_of(side.run, side.position)
    side.config = Config(side.run.matmul, adapter)


def own_probes(side: Side) -> tuple[Probe, Probe] | None:
    """The side's own row and the row its resolution is measured against."""
    if side.config is None or side.reference is None:
        return None
    return probe_of(side.run, side.site, side.config), probe_of(side.run, side.site, side.reference)


def resolve_side(side: Side, own: Rescored, reference: Rescored) -> None:
    """The side's row, and its resolution from the reference row."""
    side.logits, side.why_not = own.logits, own.unavailable
    if own.logits is None or reference.logits is None:
        side.resolution_note = f"not measured: {reference.unavailable or own.unavailable}"
        return
    both = torch.isfinite(own.logits) & torch.isfinite(reference.logits)
    side.resolution = 2 * float((own.logits[both] - reference.logits[both]).abs().max())
    ref = side.reference
    against = "the eager backend's float32" if ref is not None and ref.matmul == EAGER else REFERENCE
    side.resolution_note = f"2 x max |logit difference| of {side.run.matmul} against {against} on this row"


def rescore_sides(a: Side, b: Side, score: Score) -> list[Swap]:
    """Re-score each side's own and reference rows and every differing factor swapped both ways, each distinct
    probe once, in one call to the engine."""
    owns = {side.name: own_probes(side) for side in (a, b)}
    swaps = [Swap(f, s, o, swapped(s, o, f)) for f in differing(a, b) for s, o in ((a, b), (b, a))]
    asked = list(dict.fromkeys([*(p for pair in owns.values() if pair for p in pair), *(w.probe for w in swaps)]))
    results = dict(zip(asked, score(asked), strict=True))
    for side in (a, b):
        if (pair := owns[side.name]) is not None:
            resolve_side(side, results[pair[0]], results[pair[1]])
    for swap in swaps:
        swap.logits, swap.why_not = results[swap.probe].logits, results[swap.probe].unavailable
    return swaps


def lossless_claim(a: RunConfig, b: RunConfig) -> Row | None:
    """The verdict on a lossless claim one run's mode makes against the other's, if it makes one."""
    for run, ref in ((a, b), (b, a)):
        claim = claim_of(run.mode)
        if claim is not None and claim.reference == ref.mode:
            found = verdict(run.outcome(), ref.outcome(), claim)
            return {"mode": run.mode, "reference": ref.mode, "checked": found.checked,
                    "blockers": list(found.blockers), "holds": found.holds,
                    "broken": found.checked and not found.identical, "agreement": found.agreement()}
    return None


def stopped(run: RunConfig, position: int) -> str | None:
    """Why a run has no token at `position` without having picked the end of its text: its length limit or its
    status."""
    if position < len(run.output_ids):
        return None
    if run.status != "done":
        return f"it {run.status} after {len(run.output_ids)} tokens"
    if len(run.output_ids) >= int(run.params.get("max_new_tokens") or 0):
        return f"it reached its max_new_tokens {len(run.output_ids)}"
    return None


def cause(a: Side, b: Side, swaps: list[Swap], claim: Row | None) -> str:
    """The finding in words, the decisive part first."""
    parts = [f"lossless claim broken: {claim['mode']} claims {claim['reference']}'s tokens; "
             f"{claim['agreement']}"] if claim and claim["broken"] else []
    for side in (a, b):
        if side.why_not and side.logits is None:
            parts.append(f"{side.name}'s row not re-scored ({side.why_not})")
        elif temperature(side.run.params) > 0 and side.argmax != side.token:
            parts.append(f"{side.name} sampled at T={temperature(side.run.params):g}: its token {side.token} is "
                         f"a draw (argmax {side.argmax})")
        elif side.reproduced is False:
            parts.append(f"{side.name}'s token {side.token} is not what its configuration picks re-scored alone "
                         f"({side.argmax}): the forward it shared or state the re-scoring does not rebuild made it")
    movers = sorted({w.factor for w in swaps if w.to_other})
    if movers:
        parts.append(" and ".join(f"the {f} difference ({setting(f, a)} vs {setting(f, b)})" for f in movers)
                     + " alone moves the argmax")
    elif swaps:
        parts.append("no single difference (" + ", ".join(sorted({w.factor for w in swaps}))
                     + ") moves the argmax alone")
    elif a.logits is not None and b.logits is not None and not parts:
        parts.append("the runs' configurations do not differ here; their rows agree")
    ties = [f"{s.name}'s margin {s.margin:.3g} is below what {s.run.matmul} resolves here ({s.resolution:.3g})"
            for s in (a, b) if s.near_tie]
    return "; ".join(parts + (["a near-tie: " + "; ".join(ties)] if ties else []))


def early_cause(a: RunConfig, b: RunConfig, position: int | None, claim: Row | None) -> str | None:
    """The finding where no row needs re-scoring: identical runs, other prompts, a run that stopped short."""
    if position is None:
        held = f"; the lossless claim ({claim['mode']} = {claim['reference']}) holds" if claim and claim["holds"] \
            else ""
        return f"identical: all {len(a.output_ids)} tokens are the same{held}"
    if a.prompt_ids != b.prompt_ids:
        return "the runs read different prompts"
    for name, run in (("a", a), ("b", b)):
        if why := stopped(run, position):
            return f"{name} has no token at {position}: {why}"
    return None


def diverge(a: RunConfig, b: RunConfig, served: Served, score: Score, k: int = TOP_K) -> Row:
    """The report (the /api/diverge JSON): `position` (the first differing output index, None when identical),
    `a` and `b` (token, top-k logits, margin, path, reproduced, resolution), `cause` in words, `attribution` (each
    differing factor swapped both ways), `near_tie`, `lossless_claim`. `score` runs probes on the engine."""
    position, claim = first_difference(a.output_ids, b.output_ids), lossless_claim(a, b)
    sides = Side("a", a, position), Side("b", b, position)
    found = early_cause(a, b, position, claim)
    swaps: list[Swap] = []
    if found is None:
        for side in sides:
            prepare(side, served)
        swaps = rescore_sides(*sides, score)
        found = cause(*sides, swaps, claim)
    return {"position": position, "prompt_tokens": len(a.prompt_ids), "a": sides[0].to_json(k),
            "b": sides[1].to_json(k), "cause": found, "attribution": [w.to_json() for w in swaps],
            "near_tie": any(s.near_tie for s in sides), "lossless_claim": claim}
