"""The fused step's weight formats (kernels/cpu_decode.c's enum), and how a float32 weight is packed into the
narrowest one that holds it exactly.

Besides float16 / bfloat16, a weight dequantized from a GGUF Q4_1 or Q8_0 tensor (the real default model's) is
found again in its float32 values: per block of 32 values along a row, Q4_1 is d * q + m with q in 0..15 (m the
block's minimum, where q = 0), Q8_0 is d * q with |q| <= 127 (d the block's largest magnitude over 127). d, m
are float16 in the file; d * q is exact in float32, so the one rounding of + m is the dequantizer's own. A block
is packed only when every value comes back bit for bit, so a packed weight is the float32 weight: a fifth of the
bytes to stream for Q4_1, and the same sums."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

FORMATS = ("f32", "f16", "bf16", "q4_1", "q8_0", "amx_bf16", "amx_q4_1", "i8_q4_1", "i8_q8_0")
"""The C kernels' weight formats, by their enum value (kernels/amx.h). The first five hold the float32 weights
exactly; the AMX formats hold them rounded to bfloat16 (amx_q4_1 as Q4_1 blocks, widened to bfloat16 on the fly);
the int8 formats hold GGUF blocks, 16 outputs interleaved (kernels/int8.h), for the int8 linears."""
BLOCK = 32
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def f16_neighbours(x: Tensor) -> Tensor:
    """[3, ...] float32: x rounded to float16, and the float16 values just below and above it."""
    bits = x.to(torch.float16).view(torch.int16)
    return torch.stack([(bits + k).view(torch.float16) for k in (0, -1, 1)]).float()


def exact_codes(blocks: Tensor, scales: Tensor, low: Tensor, lo: int, hi: int) -> tuple[Tensor, Tensor, Tensor]:
    """For blocks [B, 32] and candidate scales [C, B]: per block the first candidate d whose codes
    q = round((x - low) / d) in lo..hi give back every value as d * q + low: (d [B], q [B, 32] int32, found [B]
    bool). Each candidate is tried on the blocks still open only."""
    d, codes = scales[0].clone(), torch.zeros(blocks.shape, dtype=torch.int32)
    found = torch.zeros(blocks.shape[0], dtype=torch.bool)
    for candidate in scales:
        open_ = (~found).nonzero()[:, 0]
        if open_.numel() == 0:
            break
        x, c, base = blocks[open_], candidate[open_, None], low[open_, None]
        q = torch.round((x - base) / torch.where(c == 0, torch.ones_like(c), c)).clamp(lo, hi)
        q = torch.where(c == 0, torch.zeros_like(q), q)
        ok = (c * q + base == x).all(-1)
        hit = open_[ok]
        d[hit], codes[hit], found[hit] = candidate[hit], q[ok].to(torch.int32), True
    return d, codes, found


def q4_1(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [out, in] as Q4_1 blocks (uint8 [out, in / 32 * 24]: d, m float32, 16 code bytes), and which rows
    [out] bool it holds exactly."""
    blocks = w.reshape(-1, BLOCK)
    low = blocks.amin(-1)
    d, q, found = exact_codes(blocks, f16_neighbours((blocks.amax(-1) - low) / 15), low, 0, 15)
    nibbles = (q[:, :16] | (q[:, 16:] << 4)).to(torch.uint8)
    packed = torch.cat([torch.stack([d, low], -1).view(torch.uint8), nibbles], -1)
    return packed.reshape(w.shape[0], -1), found.view(w.shape[0], -1).all(-1)


def q8_0(w: Tensor) -> tuple[Tensor, Tensor]:
    """w [out, in] as Q8_0 blocks (uint8 [out, in / 32 * 36]: d float32, 32 int8 codes), and which rows [out]
    bool it holds exactly."""
    blocks = w.reshape(-1, BLOCK)
    d, q, found = exact_codes(blocks, f16_neighbours(blocks.abs().amax(-1) / 127), torch.zeros(blocks.shape[0]),
                              -127, 127)
    packed = torch.cat([d[:, None].view(torch.uint8), q.to(torch.int8).view(torch.uint8)], -1)
    return packed.reshape(w.shape[0], -1), found.view(w.shape[0], -1).all(-1)


PACKERS = {"q4_1": q4_1, "q8_0": q8_0}
BLOCK_FORMATS = tuple(PACKERS)


@dataclass
class Packed:
    """A weight group in one format: each weight's row-major copy, and for each the rows [k] (int64) that the
    format does not hold, with their float32 values [k, in] (a block format's few odd rows; empty otherwise)."""
    format: str
    copies: list[Tensor]
    odd_rows: list[Tensor]
    odd_values: list[Tensor]
    rounded: bool = False
    """Whether an int8 format had to round the weights themselves (weights that are no GGUF blocks)."""


def pack(weights: list[Tensor], spare_rows: int = 0) -> Packed:
    """The narrowest format that holds every weight of the group exactly, but for at most `spare_rows` rows of
    each (the head's: an adapter's trained MASK row is no GGUF block). The block formats need rows of a multiple
    of 32 values; the first weight that fails a format is the last one tried in it."""
    weights = [w.detach().float().contiguous() for w in weights]
    if all(w.shape[-1] % BLOCK == 0 for w in weights):
        for name, packer in PACKERS.items():
            copies, odd = [], []
            for w in weights:
                packed, exact = packer(w)
                if int((~exact).sum()) > spare_rows:
                    break
                copies.append(packed)
                odd.append((~exact).nonzero()[:, 0])
            else:
                return Packed(name, copies, odd, [w[rows].contiguous() for w, rows in zip(weights, odd, strict=True)])
    none = [torch.zeros(0, dtype=torch.long)] * len(weights)
    empty = [w[:0] for w in weights]
    for name, dtype in DTYPES.items():
        if all(torch.equal(w.to(dtype).float(), w) for w in weights):
            return Packed(name, [w.to(dtype) for w in weights], none, empty)
    return Packed("f32", weights, none, empty)


def amx_fits(weights: list[Tensor]) -> bool:
    """Whether every weight has the AMX formats' shape: outputs a multiple of 16, inputs of 32."""
    return all(w.shape[0] % 16 == 0 and w.shape[1] % BLOCK == 0 for w in weights)


def tile_order(blocks: Tensor) -> Tensor:
    """Q4_1 blocks [out, in / 32 * 24] (uint8) in amx_q4_1's order: per 16 rows and block column, the 16 rows'
    blocks in a run."""
    out = blocks.shape[0]
    return blocks.reshape(out // 16, 16, -1, 24).permute(0, 2, 1, 3).contiguous().reshape(out, -1)


def pack_amx(weights: list[Tensor]) -> Packed:
    """The group for the AMX linears: as Q4_1 blocks (amx_q4_1) where every weight is one exactly, else in
    bfloat16, row-major (amx_bf16). Both are the weights rounded to bfloat16: the same numbers."""
    weights = [w.detach().float().contiguous() for w in weights]
    none = [torch.zeros(0, dtype=torch.long)] * len(weights)
    empty = [w[:0] for w in weights]
    packer, blocks = PACKERS.get("q4_1"), []
    for w in weights:
        if packer is None:
            break
        packed, exact = packer(w)
        if not bool(exact.all()):
            break
        blocks.append(tile_order(packed))
    else:
        return Packed("amx_q4_1", blocks, none, empty)
    return Packed("amx_bf16", [w.to(torch.bfloat16) for w in weights], none, empty)


INT8_GROUP = 16
"""Outputs an int8 weight group interleaves (kernels/int8.h's I8_GROUP)."""


def interleave(codes: Tensor, scales: list[Tensor]) -> Tensor:
    """Per-block code bytes [out, blocks, n] (n = 16 for Q4_1, 32 for Q8_0) and per-block float32 scales ([out,
    blocks] each) in the int8 linears' layout: per group of 16 outputs and block, each scale's 16 values, then
    the codes as n / 4 vectors of 16 lanes x 4 bytes (lane o, byte k of vector p: byte 4p + k of output o). Outputs
    past the last are zero."""
    out, blocks, n = codes.shape
    pad = -out % INT8_GROUP
    codes = torch.nn.functional.pad(codes, (0, 0, 0, 0, 0, pad))
    scales = [torch.nn.functional.pad(v, (0, 0, 0, pad)) for v in scales]
    groups = (out + pad) // INT8_GROUP
    lanes = codes.view(groups, INT8_GROUP, blocks, n // 4, 4).permute(0, 2, 3, 1, 4).reshape(groups, blocks, -1)
    heads = [v.view(groups, INT8_GROUP, blocks).transpose(1, 2).contiguous().view(torch.uint8) for v in scales]
    return torch.cat([*heads, lanes], -1).contiguous()


def int8_q4_1(packed: Tensor) -> Tensor:
    """Q4_1 blocks [out, in / 32 * 24] (q4_1's) in the i8_q4_1 layout: the nibble byte j of a block holds codes j
    and j + 16, so lane o's byte k of vector p holds codes 4p + k and 16 + 4p + k, as cpu_int8.c reads them."""
    blocks = packed.view(packed.shape[0], -1, 24)
    d, m = (blocks[..., i * 4:(i + 1) * 4].contiguous().view(torch.float32)[..., 0] for i in (0, 1))
    return interleave(blocks[..., 8:], [d, m])


def int8_q8_0(packed: Tensor) -> Tensor:
    """Q8_0 blocks [out, in / 32 * 36] (q8_0's) in the i8_q8_0 layout."""
    blocks = packed.view(packed.shape[0], -1, 36)
    d = blocks[..., :4].contiguous().view(torch.float32)[..., 0]
    return interleave(blocks[..., 4:], [d])


def nearest_q8_0(w: Tensor) -> Tensor:
    """w [out, in] rounded to Q8_0 blocks (scale max |w| / 127 rounded to float16, as GGUF stores it): the float32
    values a Q8_0 quantization of w holds."""
    blocks = w.reshape(-1, BLOCK)
    d = (blocks.abs().amax(-1, keepdim=True) / 127).to(torch.float16).float()
    q = torch.round(blocks / torch.where(d == 0, torch.ones_like(d), d)).clamp(-127, 127)
    return (q * d).reshape(w.shape)


def pack_int8(weights: list[Tensor], spare_rows: int = 0) -> Packed:
    """The group for the int8 linears: as Q4_1 blocks where every weight is one exactly, else as Q8_0 blocks, a
    weight that is no Q8_0 rounded to the nearest (weights not from a GGUF: the int8 precision rounds them), but
    for at most `spare_rows` rows of each (as `pack`), kept float32. Inputs must be a multiple of 32."""
    weights = [w.detach().float().contiguous() for w in weights]
    odd = [torch.zeros(0, dtype=torch.long)] * len(weights)
    fours = [q4_1(w) for w in weights]
    if all(bool(exact.all()) for _, exact in fours):
        return Packed("i8_q4_1", [int8_q4_1(p) for p, _ in fours], odd, [w[:0] for w in weights])
    copies, rounded = [], False
    for i, w in enumerate(weights):
        packed, exact = q8_0(w)
        if int((~exact).sum()) <= spare_rows:
            odd[i] = (~exact).nonzero()[:, 0]
        else:
            packed, _ = q8_0(nearest_q8_0(w))
            rounded = True
        copies.append(int8_q8_0(packed))
    return Packed("i8_q8_0", copies, odd, [w[rows].contiguous() for w, rows in zip(weights, odd, strict=True)],
                  rounded)
