"""LAMB step (docs/design.md) in the backend vocabulary, in the eager in-place order,
as its two phases (the one-call step is reduce then apply).

IR shape on CPU: one loop per tensor updates m, v and reduces ||p||^2, ||u||^2;
the trust ratios are 0-d buffers computed once; a second loop re-reads
p, m, v, recomputes u and writes p (the 40 bytes/param of the CPU kernel).
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
GROUPED_LAUNCHES = 6


def _step_scalars(B: Backend, a: SimpleNamespace, t: list[Any]) -> SimpleNamespace:
    """The per-tensor scalars of both passes at steps ``t``: 1 - beta1, 1 - beta2 and
    the inverse bias corrections, one buffer per tensor (``B.scalars``)."""
    inv_bc1 = inv_bc2 = 1.0
    if a.bias_correction:
        inv_bc1 = B.to_float(B.reciprocal(B.one_minus(B.pow_scalar(a.beta1, t))))
        inv_bc2 = B.to_float(B.reciprocal(B.one_minus(B.pow_scalar(a.beta2, t))))
    values = B.scalars(B.one_minus(a.beta1), B.one_minus(a.beta2), inv_bc1, inv_bc2)
    return SimpleNamespace(**dict(zip(("one_minus_beta1", "one_minus_beta2", "inv_bc1", "inv_bc2"), values)))


def _update(B: Backend, a: SimpleNamespace, p: list[Any], m: list[Any], v: list[Any], s: SimpleNamespace) -> list[Any]:
    """u = (m / bc1) / (sqrt(v / bc2) + eps) + wd p (no wd p under decoupled decay), with the
    step's scalars ``s``."""
    if a.bias_correction:
        m, v = B.mul(m, s.inv_bc1), B.mul(v, s.inv_bc2)
    u = B.div(m, B.add(B.sqrt(v), a.eps))
    return B.add(u, B.mul(p, a.weight_decay)) if a.weight_decay != 0 and not a.decoupled_decay else u


def lamb_reduce(B: Backend, a: SimpleNamespace) -> list[list[Any]]:
    """Pass 1: steps += 1, m and v updated; returns [||p||^2, ||u||^2] per tensor.
    Leaves the step's scalars in ``a.step_scalars`` for the apply phase of a
    one-call step (a separate apply op recomputes them from the steps)."""
    t = increment_steps(B, a.steps)
    s = a.step_scalars = _step_scalars(B, a, t)
    g = scaled_grads(B, a.grads, a.grad_scale, max_grad_norm=a.max_grad_norm)
    beta3 = s.one_minus_beta1 if a.grad_averaging else 1.0
    m = B.add(B.mul(a.exp_avgs, a.beta1), B.mul(g, beta3))
    v = B.add(B.mul(a.exp_avg_sqs, a.beta2), B.mul(B.mul(g, g), s.one_minus_beta2))
    B.assign(a.exp_avgs, m)
    B.assign(a.exp_avg_sqs, v)
    p = master_or_params(B, a.params, a.master_params)
    # u from the state as written (what the apply phase reads): with found_inf the assign
    # writes a select of old and new, and m, v, if read again, would be recomputed from the
    # state they were just written into (the IR re-reads an unrealized value's inputs)
    return B.reductions(("sumsq", p), ("sumsq", _update(B, a, p, list(a.exp_avgs), list(a.exp_avg_sqs), s)))


def lamb_apply(B: Backend, a: SimpleNamespace, reductions: list[list[Any]]) -> None:
    """Pass 2: p = keep p - lr * r * u with r = ||keep p|| / ||u|| from the reductions (keep:
    decoupled decay's factor, else 1)."""
    p = master_or_params(B, a.params, a.master_params)
    keep = decay_keep(B, a)
    if a.weight_decay != 0 or a.always_adapt:
        p_norm, u_norm = B.sqrt(reductions[0]), B.sqrt(reductions[1])
        if keep is not None:
            p_norm = B.mul(p_norm, B.maximum(keep, B.mul(keep, -1.0)))
        ratio = B.where_positive(p_norm, u_norm, B.div(p_norm, u_norm), 1.0)
        if a.trust_clip:
            ratio = B.minimum(ratio, 1.0)
        step_size = B.scalar(B.mul(ratio, a.lr))
    else:
        step_size = a.lr
    # Re-reads the m, v (and steps) the reduce phase wrote (recomputing u beats storing it).
    s = getattr(a, "step_scalars", None) or _step_scalars(B, a, list(a.steps))
    m = list(a.exp_avgs)
    u = _update(B, a, p, m, list(a.exp_avg_sqs), s)
    # (a rounded param hashes the new m, as the kernels' pass 2, which reads no grad)
    assign_params(B, a.params, a.master_params, B.sub(p if keep is None else B.mul(p, keep), B.mul(u, step_size)),
                  param_rounding(B, a, m, list(a.steps)))
