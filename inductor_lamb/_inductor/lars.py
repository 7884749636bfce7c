"""LARS step (docs/design.md) in the backend
vocabulary, as its two phases (the one-call step is reduce then apply)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from .backend import Backend
from .step_parts import assign_params, master_or_params, param_rounding, scaled_grads

# The fewest kernels Inductor's foreach groups of this lowering launch per call on CUDA (its
# element-wise passes, step counts and per-tensor scalars; more tensors per call take more):
# what the launch model of cost.py adds to the reductions' kernels. tests/test_cuda_codegen.py
# checks it against the code generated for a described H100.
GROUPED_LAUNCHES = 2


def per_param(values, n: int, if_empty):
    """A per-parameter option given as no value, one value, or one per param."""
    values = list(values)
    if not values:
        return [if_empty] * n
    return values * n if len(values) == 1 else values


def _grads(B: Backend, a: SimpleNamespace) -> list[Any]:
    return scaled_grads(B, a.grads, a.grad_scale, factor=a.rescale_grad)


def lars_reduce(B: Backend, a: SimpleNamespace) -> list[list[Any]]:
    """Layer norms (nothing written): [||p||^2, ||g||^2] per tensor."""
    return B.reductions(("sumsq", master_or_params(B, a.params, a.master_params)), ("sumsq", _grads(B, a)))


def lars_apply(B: Backend, a: SimpleNamespace, reductions: list[list[Any]]) -> None:
    """Local learning rates from the reductions; v = mu v + local_lr (g + wd p); p -= v, or
    without ``lr_in_momentum`` the local lr taken at lr 1 and p -= lr v."""
    n = len(a.params)
    wds = [float(w) for w in per_param(a.weight_decay, n, 0.0)]
    adapts = per_param(a.layer_adaptation, n, True)
    g = _grads(B, a)
    p = master_or_params(B, a.params, a.master_params)
    local_lr = []  # (None: 1, without the lr in the momentum and no adaptation)
    for i in range(n):
        lr = B.item(a.lr, i) if a.lr_in_momentum else 1.0
        if adapts[i] and wds[i] > 0:
            p_norm, g_norm = B.sqrt(reductions[0][i]), B.sqrt(reductions[1][i])
            trust = B.div(B.mul(B.mul(p_norm, a.lars_coeff), lr), B.add(B.add(g_norm, B.mul(p_norm, wds[i])), a.eps))
            local_lr.append(B.scalar(B.where_positive(p_norm, g_norm, trust, lr)))
        else:
            local_lr.append(lr if a.lr_in_momentum else None)
    decayed = [B.add(g[i], B.mul(p[i], wds[i])) if wds[i] else g[i] for i in range(n)]
    if a.lr_in_momentum:
        scaled = B.mul(decayed, local_lr)
    else:
        scaled = [d if k is None else B.mul(d, k) for d, k in zip(decayed, local_lr)]
    B.assign(a.momentum_buffers, B.add(B.mul(a.momentum_buffers, a.momentum), scaled))
    step = a.momentum_buffers if a.lr_in_momentum else B.mul(a.momentum_buffers, [B.item(a.lr, i) for i in range(n)])
    assign_params(B, a.params, a.master_params, B.sub(p, step),
                  param_rounding(B, a, B.to_float(a.grads), None))  # (the grad as stored; no steps: step 0)
