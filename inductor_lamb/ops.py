"""Typed wrappers of ``torch.ops.lamb.*`` and their fake (meta) implementations.

Every op updates lists in place and returns nothing, so a fake implementation
only has to exist (and accept the same arguments): it allocates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["lamb_step_", "lars_step_", "adagrad_step_"]


def lamb_step_(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    steps: Sequence[Tensor],
    lr: Tensor,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    bias_correction: bool = True,
    grad_averaging: bool = True,
    always_adapt: bool = False,
    trust_clip: bool = False,
    max_grad_norm: float = 0.0,
    grad_scale: Tensor | None = None,
    found_inf: Tensor | None = None,
    master_params: Sequence[Tensor] | None = None,
) -> None:
    """One LAMB step over whole lists of tensors, in place (see DESIGN.md for the math).

    ``params``, ``exp_avgs``, ``exp_avg_sqs``, ``steps`` (0-d float32, incremented
    by one before use) and ``master_params`` (optional float32 copies of
    low-precision params) are updated in place; ``grads`` are only read.
    ``lr`` is a 0-d float32 tensor so a changing learning rate never recompiles.
    ``grad_scale``/``found_inf`` follow torch's fused Adam: grads are divided by
    ``grad_scale`` and a nonzero ``found_inf`` skips the step entirely.
    ``max_grad_norm > 0`` clips by the global norm of all ``grads`` of the call.
    """
    torch.ops.lamb.lamb_step_(
        params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay,
        bias_correction, grad_averaging, always_adapt, trust_clip, max_grad_norm,
        grad_scale, found_inf, master_params,
    )


def lars_step_(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    momentum_buffers: Sequence[Tensor],
    lr: Tensor,
    momentum: float = 0.9,
    lars_coeff: float = 0.001,
    eps: float = 0.0,
    rescale_grad: float = 1.0,
    weight_decay: float | Sequence[float] = 5e-4,
    layer_adaptation: bool | Sequence[bool] = True,
    grad_scale: Tensor | None = None,
    found_inf: Tensor | None = None,
    master_params: Sequence[Tensor] | None = None,
) -> None:
    """One LARS step over all layers (PaddlePaddle merged ``lars_momentum`` semantics), in place.

    ``weight_decay`` and ``layer_adaptation`` are one value for every param or one
    per param (layers excluded from decay get 0; from adaptation, False: their
    local lr is ``lr``). Momentum buffers start at zero.
    """
    wd = [float(weight_decay)] if isinstance(weight_decay, (int, float)) else [float(w) for w in weight_decay]
    adapt = [bool(layer_adaptation)] if isinstance(layer_adaptation, bool) else [bool(a) for a in layer_adaptation]
    torch.ops.lamb.lars_step_(
        params, grads, momentum_buffers, lr, momentum, lars_coeff, eps, rescale_grad, wd, adapt,
        grad_scale, found_inf, master_params,
    )


def adagrad_step_(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    state_sums: Sequence[Tensor],
    steps: Sequence[Tensor],
    lr: Tensor,
    lr_decay: float = 0.0,
    weight_decay: float = 0.0,
    eps: float = 1e-10,
    maximize: bool = False,
    grad_scale: Tensor | None = None,
    found_inf: Tensor | None = None,
    master_params: Sequence[Tensor] | None = None,
) -> None:
    """One Adagrad step (exactly ``torch.optim.Adagrad``) over whole lists, in place."""
    torch.ops.lamb.adagrad_step_(
        params, grads, state_sums, steps, lr, lr_decay, weight_decay, eps, maximize,
        grad_scale, found_inf, master_params,
    )


def check_lists(
    op: str,
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    float_lists: dict[str, Sequence[Tensor] | None],
    steps: Sequence[Tensor] | None,
    lr: Tensor,
) -> None:
    """The structural checks of the kernels (lengths, devices, shapes, dtypes),
    for the fake implementations: a bad call fails at trace time with the same
    message, and a call mixing devices never lands silently on the Meta kernel."""

    def fail(msg: str) -> None:
        raise RuntimeError(f"{op}: {msg}")

    n = len(params)
    for name, lst in {"grads": grads, **float_lists, "steps": steps or None}.items():
        if lst is not None and len(lst) != n:
            fail(f"{name} has {len(lst)} tensors but params has {n}")
    if lr.dim() != 0:
        fail(f"lr must be a 0-d tensor, got shape {list(lr.shape)}")
    for i, p in enumerate(params):
        g = grads[i]
        if g.layout != torch.strided:
            fail(f"grads[{i}] has layout {g.layout}; only dense (strided) tensors are supported")
        if g.device != p.device:
            fail(f"grads[{i}] is on {g.device} but expected {p.device}")
        if g.shape != p.shape:
            fail(f"grads[{i}] has shape {list(g.shape)} but params[{i}] has shape {list(p.shape)}")
        if g.dtype != p.dtype:
            fail(f"grads[{i}] has dtype {g.dtype}, expected {p.dtype}")
        for name, lst in float_lists.items():
            if lst is None:
                continue
            t = lst[i]
            if t.device != p.device:
                fail(f"{name}[{i}] is on {t.device} but expected {p.device}")
            if t.shape != p.shape:
                fail(f"{name}[{i}] has shape {list(t.shape)} but params[{i}] has shape {list(p.shape)}")
            if t.dtype != torch.float32:
                fail(f"{name}[{i}] has dtype {t.dtype}, expected torch.float32")
        if steps is not None and (steps[i].dim() != 0 or steps[i].dtype != torch.float32):
            fail(f"steps[{i}] must be a 0-d float32 tensor")


def bind(op: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """An op call's arguments by name, with the schema's defaults filled in."""
    out: dict[str, Any] = {}
    for i, arg in enumerate(op._schema.arguments):
        if i < len(args):
            out[arg.name] = args[i]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            raise TypeError(f"{op}: missing argument {arg.name!r}")
    return out


# The float32 lists of each op (checked like its params) and whether it has steps.
_FLOAT_LISTS = {
    "lamb_step_": ("exp_avgs", "exp_avg_sqs", "master_params"),
    "lars_step_": ("momentum_buffers", "master_params"),
    "adagrad_step_": ("state_sums", "master_params"),
}


def check_fake(name: str, a: dict[str, Any]) -> None:
    """The trace-time checks of op ``name`` on its bound arguments ``a``."""
    check_lists(name, a["params"], a["grads"], {k: a[k] for k in _FLOAT_LISTS[name]}, a.get("steps"), a["lr"])


def _register_fakes() -> None:
    for name in _FLOAT_LISTS:
        op = getattr(torch.ops.lamb, name).default

        def fake(*args: Any, _op=op, _name=name, **kwargs: Any) -> None:
            check_fake(_name, bind(_op, args, kwargs))

        torch.library.register_fake(f"lamb::{name}")(fake)


_register_fakes()
