"""Kernel 7, the I-DLM fused verify: for K specs, from the clean logits (target p) and the draft logits
(proposal q) of each position, one pass of online dual softmax gives p(x) and q(x); the specs are checked
left to right and the loop exits at the first reject. Greedy (T = 0): accept iff x = argmax p, correction
argmax p. Sampling: accept iff α q(x) > 0 and u < p(x) / (α q(x)) (the reference's
where(α q > 0, p / (α q), 0)); the correction is a Gumbel-max draw from
norm(max(0, p − q)) (argmax of log(max(0, p − q)) + g), falling back to p when p ≤ q everywhere.
The noise (u [K], g [K, V]) is an input, so the kernel and its twin decide identically for a seed."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from specscope.kernels import on_triton, tile


@dataclass
class Verdict:
    accepted: int               # specs accepted before the first reject (all K if none)
    correction: int | None      # replacement token at the first reject
    p: list[float]              # p(spec) and q(spec) of every checked position
    q: list[float]


TINY: tl.constexpr = tl.constexpr(1.1754943508222875e-38)   # smallest normal float32 (1e-38 would be fp64)


@triton.jit
def _banned_logits(ptr, v, V, banned, temperature):
    """Logits of the vocabulary tile v, / T, -inf past V and at the banned (MASK) id; the ban is applied after
    an unmasked-by-ban load so the load stays vectorised."""
    x = tl.load(ptr + v, mask=v < V, other=float("-inf")).to(tl.float32)
    return tl.where(v != banned, x, float("-inf")) / temperature


@triton.jit
def _online_softmax(m, z, x):
    """Running (max, denominator) after one more tile x; safe while everything so far is -inf."""
    m_new = tl.maximum(m, tl.max(x, axis=0))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, z * tl.exp(m - m_use) + tl.sum(tl.exp(x - m_use), axis=0)


@triton.jit
def _isd_verify_kernel(clean_ptr, draft_ptr, spec_ptr, u_ptr, g_ptr, out_ptr, px_ptr, qx_ptr, K, V, banned,
                       temperature, alpha, GREEDY: tl.constexpr, BLOCK_V: tl.constexpr):
    done = tl.zeros([], dtype=tl.int32)
    accepted = tl.zeros([], dtype=tl.int32) + K
    correction = tl.zeros([], dtype=tl.int32) - 1
    for j in range(K):
        if done == 0:
            spec = tl.load(spec_ptr + j)
            mp = tl.full([], float("-inf"), dtype=tl.float32)
            mq = tl.full([], float("-inf"), dtype=tl.float32)
            zp = tl.zeros([], dtype=tl.float32)
            zq = tl.zeros([], dtype=tl.float32)
            best = tl.full([], float("-inf"), dtype=tl.float32)
            best_at = tl.zeros([], dtype=tl.int32)
            for v0 in range(0, V, BLOCK_V):
                v = v0 + tl.arange(0, BLOCK_V)
                c = _banned_logits(clean_ptr + j * V, v, V, banned, temperature)
                d = _banned_logits(draft_ptr + j * V, v, V, banned, temperature)
                tile_best = tl.max(c, axis=0)
                tile_at = tl.min(tl.where(c == tile_best, v, V), axis=0)
                best_at = tl.where(tile_best > best, tile_at, best_at)
                best = tl.maximum(best, tile_best)
                mp, zp = _online_softmax(mp, zp, c)
                mq, zq = _online_softmax(mq, zq, d)
            allowed = spec != banned
            p_x = tl.where(allowed, tl.exp(tl.load(clean_ptr + j * V + spec).to(tl.float32) / temperature - mp) / zp,
                           0.0)
            q_x = tl.where(allowed, tl.exp(tl.load(draft_ptr + j * V + spec).to(tl.float32) / temperature - mq) / zq,
                           0.0)
            tl.store(px_ptr + j, p_x)
            tl.store(qx_ptr + j, q_x)
            if GREEDY:
                rejected = spec != best_at
            else:
                rejected = (alpha * q_x <= 0.0) | ((p_x < alpha * q_x) & (tl.load(u_ptr + j) * alpha * q_x >= p_x))
            if rejected:
                done += 1
                accepted = accepted * 0 + j
                correction = best_at
                if not GREEDY:
                    res_best = tl.full([], float("-inf"), dtype=tl.float32)
                    res_at = tl.zeros([], dtype=tl.int32)
                    p_best = tl.full([], float("-inf"), dtype=tl.float32)
                    p_at = tl.zeros([], dtype=tl.int32)
                    for v0 in range(0, V, BLOCK_V):
                        v = v0 + tl.arange(0, BLOCK_V)
                        p = tl.exp(_banned_logits(clean_ptr + j * V, v, V, banned, temperature) - mp) / zp
                        q = tl.exp(_banned_logits(draft_ptr + j * V, v, V, banned, temperature) - mq) / zq
                        g = tl.load(g_ptr + j * V + v, mask=v < V, other=0.0)
                        s_res = tl.where(p > q, tl.log(tl.maximum(p - q, TINY)) + g, float("-inf"))
                        s_p = tl.where(p > 0, tl.log(tl.maximum(p, TINY)) + g, float("-inf"))
                        t_res = tl.max(s_res, axis=0)
                        t_p = tl.max(s_p, axis=0)
                        res_at = tl.where(t_res > res_best, tl.min(tl.where(s_res == t_res, v, V), axis=0), res_at)
                        p_at = tl.where(t_p > p_best, tl.min(tl.where(s_p == t_p, v, V), axis=0), p_at)
                        res_best = tl.maximum(res_best, t_res)
                        p_best = tl.maximum(p_best, t_p)
                    correction = tl.where(res_best > float("-inf"), res_at, p_at)
    tl.store(out_ptr, accepted)
    tl.store(out_ptr + 1, correction)


def isd_verify_triton(clean: Tensor, draft: Tensor, specs: Tensor, temperature: float, alpha: float, banned: int,
                      uniforms: Tensor | None, gumbel: Tensor | None) -> Verdict:
    """clean / draft logits [K, V] (row j scores spec j); specs [K]; noise u [K], g [K, V] when T > 0."""
    k, v = clean.shape
    greedy = temperature <= 0
    out = torch.empty(2, dtype=torch.int32, device=clean.device)
    px, qx = (torch.empty(k, dtype=torch.float32, device=clean.device) for _ in range(2))
    noise_u = uniforms if uniforms is not None else px
    noise_g = gumbel if gumbel is not None else px
    _isd_verify_kernel[(1,)](clean.contiguous(), draft.contiguous(), specs.int().contiguous(), noise_u, noise_g,
                             out, px, qx, k, v, banned, 1.0 if greedy else float(temperature), float(alpha),
                             GREEDY=greedy, BLOCK_V=tile(v, 1024))
    accepted, correction = out.tolist()
    checked = k if correction < 0 else accepted + 1
    return Verdict(accepted, None if correction < 0 else correction, px[:checked].tolist(), qx[:checked].tolist())


def isd_verify_torch(clean: Tensor, draft: Tensor, specs: Tensor, temperature: float, alpha: float, banned: int,
                     uniforms: Tensor | None, gumbel: Tensor | None, probabilities: bool = True) -> Verdict:
    """The kernel's twin; greedy with `probabilities` off, it checks argmaxes alone (p, q come back empty)."""
    greedy = temperature <= 0
    t = 1.0 if greedy else temperature
    c = clean.float().clone()
    c[:, banned] = float("-inf")
    best = c.max(-1).indices.tolist() if greedy else []
    if greedy and not probabilities:   # the first spec that is not its row's argmax, if any
        accepted = next((j for j, spec in enumerate(specs.tolist()) if spec != best[j]), len(best))
        return Verdict(accepted, best[accepted] if accepted < len(best) else None, [], [])
    d = draft.float().clone()
    d[:, banned] = float("-inf")
    if not greedy:
        c, d = c / t, d / t
    at = specs.long()[:, None]   # p(x), q(x) of every spec from its logit and its row's logsumexp: no softmax rows
    ps = (c.gather(1, at)[:, 0] - torch.logsumexp(c, -1)).exp().tolist()
    qs = (d.gather(1, at)[:, 0] - torch.logsumexp(d, -1)).exp().tolist()
    for j, spec in enumerate(specs.tolist()):
        p_x, q_x = ps[j], qs[j]
        if greedy:
            ok = spec == best[j]
        else:
            assert uniforms is not None and gumbel is not None, "sampling needs noise"
            ok = alpha * q_x > 0 and (p_x >= alpha * q_x or float(uniforms[j]) * alpha * q_x < p_x)
        if not ok:
            if greedy:
                return Verdict(j, best[j], ps[:j + 1], qs[:j + 1])
            residual = (torch.softmax(c[j], -1) - torch.softmax(d[j], -1)).clamp(min=0)
            dist = residual if bool((residual > 0).any()) else torch.softmax(c[j], -1)
            assert gumbel is not None
            return Verdict(j, int((dist.log() + gumbel[j]).argmax()), ps[:j + 1], qs[:j + 1])
    return Verdict(len(ps), None, ps, qs)


def isd_verify(clean: Tensor, draft: Tensor, specs: Tensor, temperature: float, alpha: float, banned: int,
               uniforms: Tensor | None, gumbel: Tensor | None, probabilities: bool = True) -> Verdict:
    """The verdict; `probabilities` off lets a greedy check skip p and q where they cost a pass (the torch twin)."""
    if on_triton(clean):
        return isd_verify_triton(clean, draft, specs, temperature, alpha, banned, uniforms, gumbel)
    return isd_verify_torch(clean, draft, specs, temperature, alpha, banned, uniforms, gumbel, probabilities)
