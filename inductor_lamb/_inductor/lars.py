"""LARS step (DESIGN.md, PaddlePaddle merged lars_momentum) in the backend vocabulary."""

from __future__ import annotations

from .backends import Backend, assign_params, master_or_params, scaled_grads


def per_param(values, n: int, if_empty):
    """A per-parameter option given as no value, one value, or one per param."""
    values = list(values)
    if not values:
        return [if_empty] * n
    return values * n if len(values) == 1 else values


def lars_step(
    B: Backend, params, grads, momentum_buffers, lr, momentum, lars_coeff, eps, rescale_grad, weight_decay,
    layer_adaptation, grad_scale, found_inf, master_params,
) -> None:
    n = len(params)
    if n == 0:
        return
    B.found_inf = found_inf
    wds = [float(w) for w in per_param(weight_decay, n, 0.0)]
    adapts = per_param(layer_adaptation, n, True)
    g = scaled_grads(B, grads, grad_scale, factor=rescale_grad)
    p = master_or_params(B, params, master_params)
    local_lr = []
    for i in range(n):
        if adapts[i] and wds[i] > 0:
            p_norm, g_norm = B.sqrt(B.sumsq(p[i])), B.sqrt(B.sumsq(g[i]))
            trust = B.div(B.mul(B.mul(p_norm, lars_coeff), lr), B.add(B.add(g_norm, B.mul(p_norm, wds[i])), eps))
            local_lr.append(B.scalar(B.where_positive(p_norm, g_norm, trust, lr)))
        else:
            local_lr.append(lr)
    decayed = [B.add(g[i], B.mul(p[i], wds[i])) if wds[i] else g[i] for i in range(n)]
    B.assign(momentum_buffers, B.add(B.mul(momentum_buffers, momentum), B.mul(decayed, local_lr)))
    assign_params(B, params, master_params, B.sub(p, momentum_buffers))
