"""LAMB step (DESIGN.md) in the backend vocabulary, in the eager in-place order.

IR shape on CPU: one loop per tensor updates m, v and reduces ||p||, ||u||;
the trust ratios are 0-d buffers computed once; a second loop re-reads
p, m, v, recomputes u and writes p (the 40 bytes/param of the CPU kernel).
"""

from __future__ import annotations

from typing import Any

from .backends import Backend, assign_params, increment_steps, master_or_params, scaled_grads


def lamb_step(
    B: Backend, params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay,
    bias_correction, grad_averaging, always_adapt, trust_clip, max_grad_norm, grad_scale, found_inf,
    master_params,
) -> None:
    if not params:
        return
    B.found_inf = found_inf
    t = increment_steps(B, steps)
    g = scaled_grads(B, grads, grad_scale, max_grad_norm=max_grad_norm)
    m = B.add(B.mul(exp_avgs, beta1), B.mul(g, 1.0 - beta1 if grad_averaging else 1.0))
    v = B.add(B.mul(exp_avg_sqs, beta2), B.mul(B.mul(g, g), 1.0 - beta2))
    B.assign(exp_avgs, m)
    B.assign(exp_avg_sqs, v)
    p = master_or_params(B, params, master_params)
    if bias_correction:
        inv_bc1 = B.scalar(B.to_float(B.reciprocal(B.one_minus(B.pow_scalar(beta1, t)))))
        inv_bc2 = B.scalar(B.to_float(B.reciprocal(B.one_minus(B.pow_scalar(beta2, t)))))

    def update(m: list[Any], v: list[Any]) -> list[Any]:
        if bias_correction:
            m, v = B.mul(m, inv_bc1), B.mul(v, inv_bc2)
        u = B.div(m, B.add(B.sqrt(v), eps))
        return B.add(u, B.mul(p, weight_decay)) if weight_decay != 0 else u

    if weight_decay != 0 or always_adapt:
        p_norm, u_norm = B.sqrt(B.sumsq(p)), B.sqrt(B.sumsq(update(m, v)))
        ratio = B.where_positive(p_norm, u_norm, B.div(p_norm, u_norm), 1.0)
        if trust_clip:
            ratio = B.minimum(ratio, 1.0)
        step_size = B.scalar(B.mul(ratio, lr))
    else:
        step_size = lr
    # Re-reads the m, v just written (recomputing u beats storing it: same bytes, no temporary).
    assign_params(B, params, master_params, B.sub(p, B.mul(update(exp_avgs, exp_avg_sqs), step_size)))
