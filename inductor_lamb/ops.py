"""Typed wrappers of ``torch.ops.lamb.*``, derived from the op descriptions in
:mod:`inductor_lamb.spec`.

Wrappers take the tensor lists positionally and every hyper-parameter by
keyword (``lamb_step_(params, grads, m, v, steps, lr=lr, beta1=0.9)``); Python
floats of scheduled hyper-parameters (``lr``, ``beta1``, ``beta2``,
``momentum``) become 0-d float32 tensors on the params' device.

The ops' fake implementations run the kernels' own argument checks, in C++
(:func:`run_checks`): every compile path rejects a bad call at trace time with
the eager error, before any tensor is touched. Step and
apply ops update lists in place and return nothing; a reduce op returns its
float32 ``[len(params), k]`` reductions (two-phase protocol: :mod:`inductor_lamb.spec`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from . import _private
from .spec import SPECS

__all__ = ["lamb_step_", "lamb16_step_", "lars_step_", "adagrad_step_", "novograd_step_", "lamb_reduce_",
           "lamb_apply_", "lamb16_reduce_", "lamb16_apply_", "lars_reduce", "lars_apply_", "novograd_reduce_",
           "novograd_apply_", "clip_factor", "run_checks"]

lamb_step_ = SPECS["lamb_step_"].wrapper()
lamb16_step_ = SPECS["lamb16_step_"].wrapper()
lars_step_ = SPECS["lars_step_"].wrapper()
adagrad_step_ = SPECS["adagrad_step_"].wrapper()
lamb_reduce_ = SPECS["lamb_reduce_"].wrapper()
lamb_apply_ = SPECS["lamb_apply_"].wrapper()
lamb16_reduce_ = SPECS["lamb16_reduce_"].wrapper()
lamb16_apply_ = SPECS["lamb16_apply_"].wrapper()
lars_reduce = SPECS["lars_reduce"].wrapper()
lars_apply_ = SPECS["lars_apply_"].wrapper()
novograd_step_ = SPECS["novograd_step_"].wrapper()
novograd_reduce_ = SPECS["novograd_reduce_"].wrapper()
novograd_apply_ = SPECS["novograd_apply_"].wrapper()
# (every op of spec.py has its wrapper here: tests/test_spec.py checks it)
for _fn in (lamb_step_, lamb16_step_, lars_step_, adagrad_step_, novograd_step_, lamb_reduce_, lamb_apply_,
            lamb16_reduce_, lamb16_apply_, lars_reduce, lars_apply_, novograd_reduce_, novograd_apply_):
    _fn.__module__ = __name__


def clip_factor(grad_sumsq: Tensor, max_grad_norm: float, grad_scale: Tensor | None = None) -> Tensor:
    """Global grad-norm clipping as a factor to fold into ``grad_scale`` (step 1 of
    the two-phase protocol, and clipping across an optimizer's buckets):
    ``max(1, ||grads / grad_scale|| / max_grad_norm)`` as a 0-d float32 tensor,
    where ``grad_sumsq`` is the sum of squares of all the raw grads (over every
    bucket and, when sharded, every rank). Tensor math only: no host sync.
    Pass ``grad_scale * clip_factor(...)`` as ``grad_scale`` and ``max_grad_norm=0``."""
    norm = grad_sumsq.double().sqrt()
    if grad_scale is not None:
        norm = norm / grad_scale.to(norm.device).double().reshape(())
    return (norm / max_grad_norm).clamp(min=1.0).float()


# The C++ checks of every op, alone (csrc/ops.cpp): a kernel registered for a
# dispatch key no tensor has, reached only by redispatching to it.
_CHECKS = _private.CHECK_KEYS


def run_checks(op: _private.OpOverload, *args: Any, **kwargs: Any) -> Tensor | None:
    """Runs op ``op``'s argument checks, the kernels' own, on any tensors (fake
    ones included; nothing is read or written) and raises their error for a bad
    call; returns what the op would (a reduce op: an empty [n, k] tensor)."""
    return op.redispatch(_CHECKS, *args, **kwargs)


# Called before an op is first traced: installs its compile paths (inductor_lamb._inductor
# sets it, so that importing the package imports no Inductor).
before_trace: Callable[[], None] = lambda: None


def _register_fakes() -> None:
    for name, spec in SPECS.items():

        def fake(*args: Any, _op: _private.OpOverload = spec.op, **kwargs: Any) -> Tensor | None:
            before_trace()
            return run_checks(_op, *args, **kwargs)

        torch.library.register_fake(f"lamb::{name}")(fake)


_register_fakes()
