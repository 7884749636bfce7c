"""The numerical contract of DESIGN.md in plain torch: the spec in code.

Runs in the dtype of the tensors it is given; tests give it float64 copies and
compare every backend against it. Per-tensor loops, no fusion: clarity first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["lamb_step", "lamb16_step", "lars_step", "adagrad_step", "FP8_MAX", "fp8_scale", "fp8_encode"]

# Largest finite value of each float8 format LAMB16 stores.
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_FLT_MIN = torch.finfo(torch.float32).tiny


@torch.no_grad()
def lamb_step(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    steps: Sequence[Tensor],
    lr: float | Tensor,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.01,
    bias_correction: bool = True,
    grad_averaging: bool = True,
    always_adapt: bool = False,
    trust_clip: bool = False,
    max_grad_norm: float = 0.0,
    grad_scale: float | Tensor | None = None,
    found_inf: float | Tensor | None = None,
) -> None:
    """LAMB (NVIDIA apex FusedLAMB semantics, adam_w_mode=True), in place.

    Same arguments as ``torch.ops.lamb.lamb_step_`` except master params: give
    the reference the high-precision params directly.
    """
    if found_inf is not None and float(found_inf) != 0.0:
        return
    # Only tensor ops past this point (no host syncs): the reference also serves as
    # the "plain torch" baseline that benchmarks run eagerly and under torch.compile.
    gs = list(grads)
    if grad_scale is not None:
        gs = [g / grad_scale for g in gs]
    if max_grad_norm > 0 and gs:
        norm = torch.stack([(g.to(torch.float64) ** 2).sum() for g in gs]).sum().sqrt()
        clip = (norm / max_grad_norm).clamp(min=1.0)
        gs = [g / clip.to(g.dtype) for g in gs]
    beta3 = 1.0 - beta1 if grad_averaging else 1.0
    adapt = weight_decay != 0 or always_adapt
    for p, g, m, v, step in zip(params, gs, exp_avgs, exp_avg_sqs, steps):
        step += 1
        m.mul_(beta1).add_(g, alpha=beta3)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        if bias_correction:
            bc1 = 1.0 - torch.pow(beta1, step).to(p.dtype)
            bc2 = 1.0 - torch.pow(beta2, step).to(p.dtype)
            u = (m / bc1) / ((v / bc2).sqrt() + eps)
        else:
            u = m / (v.sqrt() + eps)
        if weight_decay != 0:
            u = u + weight_decay * p
        if adapt:
            p_norm, u_norm = p.norm(), u.norm()
            ratio = torch.where((p_norm > 0) & (u_norm > 0), p_norm / u_norm, torch.ones_like(p_norm))
            if trust_clip:
                ratio = ratio.clamp(max=1.0)
            u = u * ratio
        p.sub_(lr * u)


def fp8_scale(x: Tensor, dtype: torch.dtype) -> Tensor:
    """The per-tensor float32 scale LAMB16 stores ``x`` with: ``amax(|x|)`` maps to
    the largest finite value of ``dtype`` (so nothing saturates and the bulk of a
    heavy-tailed tensor stays in float8's normal range), floored at FLT_MIN so an
    all-zero tensor still gets a finite, nonzero scale."""
    amax = x.abs().amax() if x.numel() else x.new_zeros(())
    return (amax.float() / FP8_MAX[dtype]).clamp(min=_FLT_MIN)


def fp8_encode(x: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """``dtype(clamp(x * (1 / scale)))``: saturating, round to nearest even, never inf/NaN
    for finite ``x``."""
    hi = FP8_MAX[dtype]
    inv = (1.0 / scale.float()).to(x.dtype)
    return (x * inv).clamp(-hi, hi).to(dtype)


@torch.no_grad()
def lamb16_step(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    exp_avgs: Sequence[Tensor],
    exp_avg_sqs: Sequence[Tensor],
    exp_avg_scales: Sequence[Tensor],
    exp_avg_sq_scales: Sequence[Tensor],
    steps: Sequence[Tensor],
    lr: float | Tensor,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: float = 0.0,
    trust_scale: float = 0.382,
    grad_scale: float | Tensor | None = None,
    found_inf: float | Tensor | None = None,
) -> None:
    """LAMB16 (LAMB with float8 moments), in place; same arguments as
    ``torch.ops.lamb.lamb16_step_`` without master params.

    The math runs in the params' dtype; ``exp_avgs`` (float8_e4m3fn),
    ``exp_avg_sqs`` (float8_e5m2) and their 0-d float32 scales are updated in place.
    """
    if found_inf is not None and float(found_inf) != 0.0:
        return
    for p, g, m8, v8, sm, sv, step in zip(params, grads, exp_avgs, exp_avg_sqs, exp_avg_scales,
                                          exp_avg_sq_scales, steps):
        step += 1
        g = g.to(p.dtype)
        if grad_scale is not None:
            g = g * (1.0 / grad_scale)
        # beta * old scale is one float32 per tensor, as in the kernels.
        m = m8.to(p.dtype) * (beta1 * sm).to(p.dtype) + (1.0 - beta1) * g
        v = v8.to(p.dtype) * (beta2 * sv).to(p.dtype) + (1.0 - beta2) * (g * g)
        u = m / (v.sqrt() + eps) + weight_decay * p
        p_norm, u_norm = p.norm(), u.norm()
        ratio = (p_norm / u_norm * 1e-3 / lr).pow(trust_scale).clamp(0.0, 2.0)
        ratio = torch.where((p_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio))
        p.sub_(lr * ratio * u)
        sm.copy_(fp8_scale(m, m8.dtype))
        sv.copy_(fp8_scale(v, v8.dtype))
        m8.copy_(fp8_encode(m, sm, m8.dtype))
        v8.copy_(fp8_encode(v, sv, v8.dtype))


@torch.no_grad()
def lars_step(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    momentum_buffers: Sequence[Tensor],
    lr: float | Tensor,
    momentum: float = 0.9,
    lars_coeff: float = 0.001,
    eps: float = 0.0,
    rescale_grad: float = 1.0,
    weight_decay: float | Sequence[float] = 5e-4,
    layer_adaptation: bool | Sequence[bool] = True,
    grad_scale: float | Tensor | None = None,
    found_inf: float | Tensor | None = None,
) -> None:
    """LARS (You et al. 2017; PaddlePaddle ``lars_momentum``), in place."""
    if found_inf is not None and float(found_inf) != 0.0:
        return
    n = len(params)
    wds = [weight_decay] * n if isinstance(weight_decay, (int, float)) else list(weight_decay)
    adapts = [layer_adaptation] * n if isinstance(layer_adaptation, bool) else list(layer_adaptation)
    if len(wds) == 1:
        wds = wds * n
    if len(adapts) == 1:
        adapts = adapts * n
    for p, g, v, wd, adapt in zip(params, grads, momentum_buffers, wds, adapts):
        g = g * rescale_grad
        if grad_scale is not None:
            g = g / grad_scale
        local_lr = lr * torch.ones((), dtype=p.dtype)
        if adapt and wd > 0:
            p_norm, g_norm = p.norm(), g.norm()
            trust = lr * lars_coeff * p_norm / (g_norm + wd * p_norm + eps)
            local_lr = torch.where((p_norm > 0) & (g_norm > 0), trust, local_lr)
        v.mul_(momentum).add_(local_lr * (g + wd * p))
        p.sub_(v)


@torch.no_grad()
def adagrad_step(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    state_sums: Sequence[Tensor],
    steps: Sequence[Tensor],
    lr: float | Tensor,
    lr_decay: float = 0.0,
    weight_decay: float = 0.0,
    eps: float = 1e-10,
    maximize: bool = False,
    grad_scale: float | Tensor | None = None,
    found_inf: float | Tensor | None = None,
) -> None:
    """Adagrad, exactly as ``torch.optim.Adagrad`` (state ``sum``), in place."""
    if found_inf is not None and float(found_inf) != 0.0:
        return
    for p, g, s, step in zip(params, grads, state_sums, steps):
        if grad_scale is not None:
            g = g / grad_scale
        if maximize:
            g = -g
        step += 1
        clr = lr / (1 + (step - 1) * lr_decay)
        if weight_decay != 0:
            g = g + weight_decay * p
        s.addcmul_(g, g)
        p.sub_(clr * g / (s.sqrt() + eps))
