"""NovoGrad step (docs/design.md) in the backend vocabulary, as its two phases (the one-call step
is reduce then apply).

IR shape: pass 1 reduces ||g||^2 per tensor (reading g); the second moments and the grads'
multipliers are 0-d buffers; pass 2 reads p, g, m and writes m, p (the 24 bytes/param of the CPU
kernel).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from .backend import Backend
from .step_parts import assign_params, decay_keep, increment_steps, master_or_params, param_rounding, scaled_grads

# The fewest kernels Inductor's foreach groups of this lowering launch per call on CUDA (its
# element-wise passes, step counts and per-tensor scalars; more tensors per call take more):
# what the launch model of cost.py adds to the reductions' kernels. tests/test_cuda_codegen.py
# checks it against the code generated for a described H100.
GROUPED_LAUNCHES = 2


def novograd_reduce(B: Backend, a: SimpleNamespace) -> list[list[Any]]:
    """Pass 1 (writes only the steps): [||g / grad_scale||^2] per tensor."""
    increment_steps(B, a.steps)
    return B.reductions(("sumsq", scaled_grads(B, a.grads, a.grad_scale)))


def novograd_apply(B: Backend, a: SimpleNamespace, reductions: list[list[Any]]) -> None:
    """Pass 2: each tensor's second moment v (||g||^2 unless v > 0, else its EMA) and its running
    max (the denominator's with amsgrad) from the reductions, then m = beta1 m + u, p = keep p - lr m."""
    (g_sq,) = reductions
    v_old, v_max_old = list(a.exp_avg_sqs), list(a.max_exp_avg_sqs)
    ema = B.add(B.mul(v_old, a.beta2), B.mul(g_sq, B.one_minus(a.beta2)))
    v = B.scalar(B.where_positive(v_old, v_old, ema, g_sq))
    grew = B.sub(v, v_max_old)
    v_max = B.scalar(B.where_positive(grew, grew, v, v_max_old))  # (kept either way; read with amsgrad)
    inv_denom = B.scalar(B.reciprocal(B.add(B.sqrt(v_max if a.amsgrad else v), a.eps)))
    B.assign(a.exp_avg_sqs, v)
    B.assign(a.max_exp_avg_sqs, v_max)
    g = scaled_grads(B, a.grads, a.grad_scale)
    p = master_or_params(B, a.params, a.master_params)
    u = B.mul(g, inv_denom)
    if a.weight_decay != 0 and not a.decoupled_decay:
        u = B.add(u, B.mul(p, a.weight_decay))
    if a.grad_averaging:
        u = B.mul(u, B.one_minus(a.beta1))
    B.assign(a.exp_avgs, B.add(B.mul(a.exp_avgs, a.beta1), u))
    m = list(a.exp_avgs)
    keep = decay_keep(B, a)
    p_new = B.sub(p if keep is None else B.mul(p, keep), B.mul(m, a.lr))
    assign_params(B, a.params, a.master_params, p_new,
                  param_rounding(B, a, B.to_float(a.grads), list(a.steps)))  # (the grad as stored)
