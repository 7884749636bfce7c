"""The pieces of a step every op shares, on the :class:`~.backend.Backend` vocabulary: the grads
as the math reads them, the params the math reads and writes, their stochastic rounding, the
step counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..rounding import PARAM_GRIDS, key_of, round_param, tensor_key
from .backend import Backend

__all__ = ["scaled_grads", "master_or_params", "assign_params", "param_rounding", "increment_steps", "decay_keep"]


def scaled_grads(B: Backend, grads: list[Any], grad_scale: Any, factor: float = 1.0, max_grad_norm: float = 0.0):
    """float32 ``grads * factor / grad_scale``, clipped by their global norm when
    ``max_grad_norm > 0`` (the grad handling every op shares)."""
    g = B.to_float(grads)
    mul = None if grad_scale is None else B.scalar(B.mul(B.reciprocal(grad_scale), factor))
    if factor != 1.0 and mul is None:
        g = B.mul(g, factor)
    if mul is not None:
        g = B.mul(g, mul)
    if max_grad_norm > 0:
        total = None
        for sq in B.sumsq(g):
            total = sq if total is None else B.add(total, sq)
        (clip,) = B.per_tensor([B.scalar(B.maximum(B.div(B.sqrt(total), max_grad_norm), 1.0))], len(g))
        g = B.div(g, clip)
    return g


def decay_keep(B: Backend, a: Any) -> Any | None:
    """The param's factor before the update under decoupled weight decay, ``1 - s wd`` with
    ``s = lr``, or ``lr^2 / max_lr`` where ``max_lr > 0`` (csrc/common/math.h decay_keep); None
    without decoupled decay or weight decay."""
    if not a.decoupled_decay or a.weight_decay == 0:
        return None
    s = B.div(B.mul(a.lr, a.lr), a.max_lr) if a.max_lr > 0 else a.lr
    return B.scalar(B.one_minus(B.mul(s, a.weight_decay)))


def master_or_params(B: Backend, params: list[Any], master_params: list[Any] | None):
    """The float32 params the math reads: the master copies when given."""
    return list(master_params) if master_params is not None else B.to_float(params)


def assign_params(B: Backend, params: list[Any], master_params: list[Any] | None, new: list[Any],
                  rounding: Callable[[int, Any, Any, torch.dtype], Any] | None = None) -> None:
    """The new params (float32): into the master copies if any, then into the params.
    ``rounding`` (:func:`param_rounding`): bf16 / fp16 params without master copies are
    rounded stochastically onto their grid first, as the kernels do. (The params take the
    masters as written: with ``found_inf`` the masters' assign writes a select of old and new,
    and an unrealized ``new`` read after it would step from the new masters a second time.)"""
    if master_params is not None:
        B.assign(master_params, new)
        new = list(master_params)
    if rounding is not None and master_params is None:
        p0 = B.to_float(params)
        new = [rounding(i, x, p0[i], B.dtype(p)) if B.dtype(p) in PARAM_GRIDS else x
               for i, (p, x) in enumerate(zip(params, new))]
    B.assign(params, new)


def param_rounding(B: Backend, a: Any, hash_in: list[Any] | None = None, steps: list[Any] | None = None,
                   hashes: list[Any] | None = None) -> Callable[[int, Any, Any, torch.dtype], Any] | None:
    """How :func:`assign_params` rounds param ``i`` when the op rounds params stochastically:
    with the per-tensor keys from ``steps`` as this step counts them (None: LARS, step 0) and
    ``hash_in``, the op's per-element hash input; or with LAMB16's element ``hashes``
    (csrc/common/rounding.h param_hash)."""
    if not a.stochastic_rounding or a.master_params is not None:
        return None
    if hashes is not None:
        return lambda i, x, p0, dtype: round_param(B, dtype, x, p0, hashes=hashes[i])
    if hash_in is None:
        raise ValueError("param_rounding: give hash_in or hashes")
    keys = key_of(a.seed) if steps is None else tensor_key(B, a.seed, steps)
    inputs = hash_in
    return lambda i, x, p0, dtype: round_param(B, dtype, x, p0, key=B.item(keys, i), hash_in=inputs[i])


def increment_steps(B: Backend, steps: list[Any]) -> list[Any]:
    """``steps += 1`` in place (skipped with ``found_inf``, like everything); returns the
    steps as written. (Not ``steps + 1``: with ``found_inf`` the assign writes a select of
    old and new, and an unrealized ``steps + 1`` read after it would add to the new steps.)"""
    B.assign(steps, B.add(steps, 1.0))
    return list(steps)
