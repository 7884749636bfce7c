"""The numerical contract of DESIGN.md in plain torch: the spec in code.

Runs in the dtype of the tensors it is given; tests give it float64 copies and
compare every backend against it. Per-tensor loops, no fusion: clarity first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["lamb_step"]


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
    lr = float(lr)
    inv_scale = 1.0 / float(grad_scale) if grad_scale is not None else 1.0
    gs = [g * inv_scale for g in grads]
    if max_grad_norm > 0:
        norm = torch.sqrt(sum((g * g).sum() for g in gs)) if gs else 0.0
        clip = max(1.0, float(norm) / max_grad_norm)
        gs = [g / clip for g in gs]
    beta3 = 1.0 - beta1 if grad_averaging else 1.0
    for p, g, m, v, step in zip(params, gs, exp_avgs, exp_avg_sqs, steps):
        step += 1
        t = float(step)
        bc1 = 1.0 - beta1**t if bias_correction else 1.0
        bc2 = 1.0 - beta2**t if bias_correction else 1.0
        m.mul_(beta1).add_(g, alpha=beta3)
        v.mul_(beta2).add_(g * g, alpha=1.0 - beta2)
        u = (m / bc1) / ((v / bc2).sqrt() + eps) + weight_decay * p
        p_norm, u_norm = float(p.norm()), float(u.norm())
        ratio = 1.0
        if (weight_decay != 0 or always_adapt) and p_norm > 0 and u_norm > 0:
            ratio = p_norm / u_norm
        if trust_clip:
            ratio = min(ratio, 1.0)
        p.sub_(u, alpha=lr * ratio)
