"""Stochastic rounding (LAMB16's moments to float8; bfloat16 / float16 params without
master copies to their storage type), the same integer steps as
``csrc/common/rounding.h`` (read it for the why), written once as a per-element
function over an operations namespace: the Inductor lowering runs it inside one
element-wise IR node (every input loaded once, every intermediate reused, so
the generated code stays small), the decomposition and the reference on tensors.

Integers are int64 values holding uint32 ones (``[0, 2^32)``): products are
reduced mod 2^32 after every multiply, whose constants are below 2^31 in
magnitude, so nothing overflows int64 on any backend (C++, Triton, eager).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["tensor_key", "key_of", "element_hash", "stochastic_round", "round_param", "GRIDS", "PARAM_GRIDS",
           "FP8_MAX", "TensorOps", "TENSORS"]

# Largest finite value of each float8 format LAMB16 stores (448 and 57344; csrc/common/lamb16.h
# holds the C++ constants, and tests/test_lamb16_op.py checks that they agree).
FP8_MAX = {dt: float(torch.finfo(dt).max) for dt in (torch.float8_e4m3fn, torch.float8_e5m2)}

_M32 = 0xFFFFFFFF
_MIX1, _MIX2, _CODE_MUL = 0x7FEB352D, 0x846CA68B, 0x9E3779B9
_GRAD_MASK = 0xFFFF0000  # the gradient truncated to bfloat16 (rounding.h says why)


class _Grid:
    def __init__(self, drop: int, min_normal_bits: int, hash_shift: int) -> None:
        self.drop, self.min_normal_bits, self.hash_shift = drop, min_normal_bits, hash_shift
        self.min_normal = float(torch.tensor(min_normal_bits, dtype=torch.int32).view(torch.float32))


# m (e4m3) takes the hash's high 16 bits, v (e5m2) its low 16 bits
GRIDS = {torch.float8_e4m3fn: _Grid(20, 0x3C800000, 16), torch.float8_e5m2: _Grid(21, 0x38800000, 0)}
# bf16 / fp16 params take the low 16 bits of a hash of their own
PARAM_GRIDS = {torch.bfloat16: _Grid(16, 0x00800000, 0), torch.float16: _Grid(13, 0x38800000, 0)}


def _signed(c: int) -> int:
    """A uint32 constant as the int of the same residue mod 2^32 with |c| < 2^31."""
    return c - (1 << 32) if c >= 1 << 31 else c


def _mix(o: Any, x: Any) -> Any:
    x = o.xor(x, o.shr(x, 16))
    x = o.umul(x, _signed(_MIX1))
    x = o.xor(x, o.shr(x, 15))
    x = o.umul(x, _signed(_MIX2))
    return o.xor(x, o.shr(x, 16))


def _mix_int(x: int) -> int:
    """:func:`_mix` on a Python int (host constants)."""
    x ^= x >> 16
    x = (x * _MIX1) & _M32
    x ^= x >> 15
    x = (x * _MIX2) & _M32
    return x ^ (x >> 16)


def _key(o: Any, step: Any, hi: int, lo: int) -> Any:
    return _mix(o, o.xor(_mix(o, o.xor(o.band(o.to_int(step), _M32), hi)), lo))


def _hash(o: Any, g: Any, m_code: Any, v_code: Any, key: Any) -> Any:
    """One element's 32 random bits from (key, g, its stored m and v codes)."""
    codes = o.bor(m_code, o.shl(v_code, 8))
    return _mix(o, o.xor(o.xor(o.band(o.bits(g), _GRAD_MASK), o.umul(codes, _signed(_CODE_MUL))), key))


def _param_base(o: Any, key: Any, x: Any) -> Any:
    """The base of a param's hash from the key and x, the op's per-element float32 input
    (rounding.h param_base)."""
    return o.xor(o.band(o.bits(x), _GRAD_MASK), key)


def _param_hash(o: Any, base: Any, p0: Any) -> Any:
    """A param's random bits from its base and p0, the param before the step (float32)."""
    h = o.xor(base, o.shr(o.bits(p0), 13))
    h = o.umul(o.xor(h, o.shr(h, 16)), _signed(_MIX1))  # half of _mix (rounding.h says why)
    return o.xor(h, o.shr(h, 15))


def _round(o: Any, grid: _Grid, x: Any, h: Any) -> Any:
    """One element: ``x`` (float32) rounded onto the grid with its 16 bits of the hash ``h``."""
    bits16 = o.band(o.shr(h, grid.hash_shift), 0xFFFF)
    if grid.drop > 16:  # centred: 16 bits below more dropped ones
        dither = o.add(o.shl(bits16, grid.drop - 16), 1 << (grid.drop - 17))
    else:  # the top `drop` of the 16 bits: exactly uniform
        dither = o.shr(bits16, 16 - grid.drop)
    bits = o.bits(x)
    mag = o.band(bits, 0x7FFFFFFF)
    offset = o.mul(o.to_float(o.less_than(mag, grid.min_normal_bits)), grid.min_normal)  # 2^Emin below it, else 0
    kept = o.band(o.add(o.bits(o.add(o.from_bits(mag), offset)), dither), _M32 & ~((1 << grid.drop) - 1))
    rounded = o.bor(o.bits(o.sub(o.from_bits(kept), offset)), o.band(bits, 0x80000000))
    return o.from_bits(o.where(o.less_than(mag, 0x7F800000), rounded, bits))


def key_of(seed: int, step: int = 0) -> int:
    """:func:`tensor_key` of one step count as a Python int (LARS, which counts no steps: 0)."""
    seed &= (1 << 64) - 1
    hi, lo = _mix_int(seed >> 32), seed & _M32
    return _mix_int(_mix_int((step & _M32) ^ hi) ^ lo)


def round_param(B: Any, dtype: torch.dtype, x: Any, p0: Any, *, key: Any = None, hash_in: Any = None,
                hashes: Any = None) -> Any:
    """A bf16 / fp16 param's new value ``x`` (float32) rounded stochastically onto ``dtype``'s
    grid, one hash per element of its base and ``p0``, the param before the step; the store's
    round to nearest then keeps it (``csrc/common/rounding.h`` round_param). The base: from
    ``key`` (a per-tensor key, or a Python int) and ``hash_in`` (the op's per-element input),
    or LAMB16's element ``hashes`` of its moments."""
    grid = PARAM_GRIDS[dtype]
    round_ = _round_bf16 if dtype == torch.bfloat16 else _round
    if hashes is not None:  # (the xor of its m and v halves: rounding.h param_hash_of_element)
        return B.elementwise(lambda o, x_, h_: round_(o, grid, x_, o.xor(h_, o.shr(h_, 16))), [x, hashes],
                             torch.float32)
    if isinstance(key, int):  # (a constant: folded in by its own operation, never an operation of constants)
        return B.elementwise(lambda o, x_, p_, h_: round_(o, grid, x_, _param_hash(o, _param_base(o, key, h_), p_)),
                             [x, p0, hash_in], torch.float32)
    return B.elementwise(lambda o, x_, p_, h_, k: round_(o, grid, x_, _param_hash(o, _param_base(o, k, h_), p_)),
                         [x, p0, hash_in, key], torch.float32)


def _round_bf16(o: Any, grid: _Grid, x: Any, h: Any) -> Any:
    """:func:`_round` onto bfloat16's grid (float32's exponent range): the bits themselves
    are in magnitude order, so the dither is added to them (rounding.h round_param)."""
    return o.from_bits(o.band(o.add(o.bits(x), o.band(h, 0xFFFF)), 0xFFFF0000))


def tensor_key(B: Any, seed: int, steps: Any) -> Any:
    """The per-tensor part of the hash (int64, one per step tensor) from the seed
    (any int) and the step counts (0-d float32, below 2^24):
    ``mix(mix(step ^ mix(seed_hi)) ^ seed_lo)``."""
    seed &= (1 << 64) - 1
    hi, lo = _mix_int(seed >> 32), seed & _M32
    return B.scalar(B.elementwise(lambda o, step: _key(o, step, hi, lo), [steps], torch.int64))


def element_hash(B: Any, key: Any, grads: Any, m_codes: Any, v_codes: Any) -> Any:
    """The random bits (int64 lists holding uint32) of both moments, one hash per
    element: ``grads`` the float32 grads divided by grad_scale (``g * (1 / grad_scale)``
    in float32), ``m_codes`` / ``v_codes`` the stored float8 lists before the step,
    ``key`` from :func:`tensor_key`. Computed once (``B.shared``): both roundings read
    it, the second after the first moment's store."""
    return B.shared(B.elementwise(
        lambda o, g, m, v, k: _hash(o, g, o.code(m, torch.float8_e4m3fn), o.code(v, torch.float8_e5m2), k),
        [grads, m_codes, v_codes, key], torch.int64))


def stochastic_round(B: Any, x: Any, hashes: Any, dtype: torch.dtype) -> Any:
    """``x`` (float32 lists, finite values within ``dtype``'s range; others pass)
    rounded stochastically onto ``dtype``'s grid with :func:`element_hash`'s bits."""
    grid = GRIDS[dtype]
    return B.elementwise(lambda o, x_, h: _round(o, grid, x_, h), [x, hashes], torch.float32)


# ---- on tensors --------------------------------------------------------------------------

class TensorOps:
    """The per-element operations on tensors (int64 holding uint32): the namespace
    the functions above get when run as torch ops (the decomposition, the reference)."""

    @staticmethod
    def bits(x): return x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    @staticmethod
    def from_bits(a): return (a - ((a >> 31) << 32)).to(torch.int32).view(torch.float32)
    @staticmethod
    def code(x, dtype): return x.view(torch.uint8).to(torch.int64)
    @staticmethod
    def to_int(x): return x.to(torch.int64)
    @staticmethod
    def to_float(x): return x.to(torch.float32)
    @staticmethod
    def umul(a, c): return (a * c) & 0xFFFFFFFF
    @staticmethod
    def shl(a, k): return (a << k) & 0xFFFFFFFF
    xor, band, bor = staticmethod(lambda a, b: a ^ b), staticmethod(lambda a, b: a & b), staticmethod(lambda a, b: a | b)
    shr, add, sub = staticmethod(lambda a, k: a >> k), staticmethod(lambda a, b: a + b), staticmethod(lambda a, b: a - b)
    mul, less_than = staticmethod(lambda a, b: a * b), staticmethod(lambda a, c: a < c)
    where = staticmethod(torch.where)


class _Tensors:
    """The backend argument of the functions above for single tensors as torch
    ops: what the reference (inductor_lamb/reference.py) runs them on."""

    @staticmethod
    def elementwise(fn: Any, inputs: list[Any], dtype: torch.dtype) -> Any:
        return fn(TensorOps, *inputs).to(dtype)

    @staticmethod
    def scalar(a: Any) -> Any:
        return a

    shared = scalar


TENSORS = _Tensors()
