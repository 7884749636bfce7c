"""LAMB16's stochastic rounding to float8 in the backend vocabulary: the same
integer steps as ``csrc/common/rounding.h`` (read it for the why), written once
for the Inductor lowering, the decomposition and the reference.

Integers are int64 tensors holding uint32 values (``[0, 2^32)``): products are
reduced mod 2^32 after every multiply, whose constants are below 2^31 in
magnitude, so nothing overflows int64 on any backend (C++, Triton, eager).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["tensor_key", "stochastic_round", "GRIDS"]

_M32 = 0xFFFFFFFF
_MIX1, _MIX2, _CODE_MUL = 0x7FEB352D, 0x846CA68B, 0x9E3779B9
_GRAD_MASK = 0xFFFF0000  # the gradient truncated to bfloat16 (rounding.h says why)


class _Grid:
    def __init__(self, drop: int, min_normal_bits: int, code_tag: int) -> None:
        self.drop, self.min_normal_bits, self.code_tag = drop, min_normal_bits, code_tag
        self.min_normal = float(torch.tensor(min_normal_bits, dtype=torch.int32).view(torch.float32))


GRIDS = {torch.float8_e4m3fn: _Grid(20, 0x3C800000, 0), torch.float8_e5m2: _Grid(21, 0x38800000, 0x100)}


def _signed(c: int) -> int:
    """A uint32 constant as the int of the same residue mod 2^32 with |c| < 2^31."""
    return c - (1 << 32) if c >= 1 << 31 else c


def _mix(B: Any, x: Any) -> Any:
    x = B.bxor(x, B.shr(x, 16))
    x = B.umul(x, _signed(_MIX1))
    x = B.bxor(x, B.shr(x, 15))
    x = B.umul(x, _signed(_MIX2))
    return B.bxor(x, B.shr(x, 16))


def _mix_int(x: int) -> int:
    """:func:`_mix` on a Python int (host constants)."""
    x ^= x >> 16
    x = (x * _MIX1) & _M32
    x ^= x >> 15
    x = (x * _MIX2) & _M32
    return x ^ (x >> 16)


def tensor_key(B: Any, seed: int, steps: Any) -> Any:
    """The per-tensor part of the hash from the seed (any int) and the step counts
    (0-d float32, below 2^24): ``mix(mix(step ^ mix(seed_hi)) ^ seed_lo)``."""
    seed &= (1 << 64) - 1
    hi, lo = _mix_int(seed >> 32), seed & _M32
    return B.scalar(_mix(B, B.bxor(_mix(B, B.bxor(B.band(B.to_int(steps), _M32), hi)), lo)))


def stochastic_round(B: Any, x: Any, key: Any, grads: Any, codes: Any, dtype: torch.dtype) -> Any:
    """``x`` (float32 lists, finite values within ``dtype``'s range; others pass)
    rounded stochastically onto ``dtype``'s grid; ``grads`` the float32 grads
    divided by grad_scale (``g * (1 / grad_scale)`` in float32), ``codes`` the
    stored float8 list before the step, ``key`` from :func:`tensor_key`."""
    grid = GRIDS[dtype]
    code = B.bor(B.code(codes), grid.code_tag) if grid.code_tag else B.code(codes)
    h = _mix(B, B.bxor(B.bxor(B.band(B.bits(grads), _GRAD_MASK), B.umul(code, _signed(_CODE_MUL))), key))
    dither = B.add(B.shl(B.shr(h, 16), grid.drop - 16), 1 << (grid.drop - 17))
    bits = B.bits(x)
    mag = B.band(bits, 0x7FFFFFFF)
    offset = B.mul(B.to_float(B.less_than(mag, grid.min_normal_bits)), grid.min_normal)  # 2^Emin below it, else 0
    kept = B.band(B.add(B.bits(B.add(B.from_bits(mag), offset)), dither), _M32 & ~((1 << grid.drop) - 1))
    rounded = B.bor(B.bits(B.sub(B.from_bits(kept), offset)), B.band(bits, 0x80000000))
    return B.from_bits(B.select(B.less_than(mag, 0x7F800000), rounded, bits))
