"""Typed wrappers of ``torch.ops.lamb.*`` and their fake (meta) implementations.

Every op updates lists in place and returns nothing, so a fake implementation
only has to exist (and accept the same arguments): it allocates nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["lamb_step_", "lamb16_step_", "lars_step_", "adagrad_step_"]


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


def lamb16_step_(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    exp_avg_scales: Sequence[Tensor],
    exp_avg_sq_scales: Sequence[Tensor],
    steps: Sequence[Tensor],
    lr: Tensor,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    trust_scale: float = 0.382,
    grad_scale: Tensor | None = None,
    found_inf: Tensor | None = None,
    master_params: Sequence[Tensor] | None = None,
) -> None:
    """One LAMB16 step (LAMB with float8 moments, see DESIGN.md) over whole lists, in place.

    ``exp_avgs`` are ``float8_e4m3fn`` and ``exp_avg_sqs`` ``float8_e5m2``
    tensors shaped like the params, holding ``m / exp_avg_scales[i]`` and
    ``v / exp_avg_sq_scales[i]`` (0-d float32 scales, rewritten every step from
    the amax of the new moments). No bias correction; the trust ratio is
    ``clamp((||p|| / ||u|| * 1e-3 / lr) ** trust_scale, 0, 2)`` (1 when a norm is 0).
    Other arguments as in :func:`lamb_step_`.
    """
    torch.ops.lamb.lamb16_step_(
        params, grads, exp_avgs, exp_avg_sqs, exp_avg_scales, exp_avg_sq_scales, steps, lr, beta1, beta2,
        eps, weight_decay, trust_scale, grad_scale, found_inf, master_params,
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
    state_lists: dict[str, tuple[Sequence[Tensor] | None, torch.dtype]],
    scalar_lists: dict[str, Sequence[Tensor]],
    lr: Tensor,
) -> None:
    """The structural checks of the kernels (lengths, devices, shapes, dtypes),
    for the fake implementations: a bad call fails at trace time with the same
    message, and a call mixing devices never lands silently on the Meta kernel."""

    def fail(msg: str) -> None:
        raise RuntimeError(f"{op}: {msg}")

    n = len(params)
    lists = {"grads": grads, **{k: v for k, (v, _) in state_lists.items()}, **scalar_lists}
    for name, lst in lists.items():
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
        for name, (lst, dtype) in state_lists.items():
            if lst is None:
                continue
            t = lst[i]
            if t.device != p.device:
                fail(f"{name}[{i}] is on {t.device} but expected {p.device}")
            if t.shape != p.shape:
                fail(f"{name}[{i}] has shape {list(t.shape)} but params[{i}] has shape {list(p.shape)}")
            if t.dtype != dtype:
                fail(f"{name}[{i}] has dtype {t.dtype}, expected {dtype}")
        for name, lst in scalar_lists.items():
            if lst[i].dim() != 0 or lst[i].dtype != torch.float32:
                fail(f"{name}[{i}] must be a 0-d float32 tensor")


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


_F32 = torch.float32
# Per op: the lists shaped like the params (with their dtype) and the lists of
# 0-d float32 tensors, checked by the fake implementations.
_STATE_LISTS: dict[str, dict[str, torch.dtype]] = {
    "lamb_step_": {"exp_avgs": _F32, "exp_avg_sqs": _F32, "master_params": _F32},
    "lamb16_step_": {"exp_avgs": torch.float8_e4m3fn, "exp_avg_sqs": torch.float8_e5m2, "master_params": _F32},
    "lars_step_": {"momentum_buffers": _F32, "master_params": _F32},
    "adagrad_step_": {"state_sums": _F32, "master_params": _F32},
}
_SCALAR_LISTS: dict[str, tuple[str, ...]] = {
    "lamb_step_": ("steps",),
    "lamb16_step_": ("exp_avg_scales", "exp_avg_sq_scales", "steps"),
    "lars_step_": (),
    "adagrad_step_": ("steps",),
}


def check_fake(name: str, a: dict[str, Any]) -> None:
    """The trace-time checks of op ``name`` on its bound arguments ``a``."""
    states = {k: (a[k], dtype) for k, dtype in _STATE_LISTS[name].items()}
    check_lists(name, a["params"], a["grads"], states, {k: a[k] for k in _SCALAR_LISTS[name]}, a["lr"])


def _register_fakes() -> None:
    for name in _STATE_LISTS:
        op = getattr(torch.ops.lamb, name).default

        def fake(*args: Any, _op=op, _name=name, **kwargs: Any) -> None:
            check_fake(_name, bind(_op, args, kwargs))

        torch.library.register_fake(f"lamb::{name}")(fake)


_register_fakes()
