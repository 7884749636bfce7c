"""LAMB16 step (docs/design.md: LAMB with float8 moments) in the backend vocabulary,
in the eager in-place order, as its two phases (the one-call step is reduce
then apply).

IR shape: pass 1 reduces ||p||^2, ||u||^2, amax |m|, amax v per tensor (reading
p, g, m8, v8); the trust ratios and new scales are 0-d buffers; pass 2
recomputes m, v, u from the same inputs, writes p and stores m, v in float8
with the new scales (the 26 bytes/param of the CPU kernel), rounded
stochastically by default (``inductor_lamb/rounding.py``). The old scales are
folded into ``beta * scale`` buffers before anything is written, and the scales
are assigned last, so every read sees the values of the start of the step.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from ..rounding import FP8_MAX, element_hash, stochastic_round, tensor_key
from .backend import Backend
from .step_parts import assign_params, increment_steps, master_or_params, param_rounding, scaled_grads

_FLT_MIN = torch.finfo(torch.float32).tiny
_M_MAX = FP8_MAX[torch.float8_e4m3fn]
_V_MAX = FP8_MAX[torch.float8_e5m2]

# The fewest kernels Inductor's foreach groups of this lowering launch per call on CUDA (its
# element-wise passes, step counts and per-tensor scalars; more tensors per call take more):
# what the launch model of cost.py adds to the reductions' kernels. tests/test_cuda_codegen.py
# checks it against the code generated for a described H100.
GROUPED_LAUNCHES = 8


def _scalars(B: Backend, a: SimpleNamespace) -> SimpleNamespace:
    """beta * the old scale and 1 - beta of both moments, one buffer per tensor
    (``B.scalars``), computed before anything is written."""
    values = B.scalars(B.mul(a.exp_avg_scales, a.beta1), B.mul(a.exp_avg_sq_scales, a.beta2),
                       B.one_minus(a.beta1), B.one_minus(a.beta2))
    return SimpleNamespace(**dict(zip(("beta1_scale", "beta2_scale", "one_minus_beta1", "one_minus_beta2"), values)))


def _moments(B: Backend, a: SimpleNamespace, s: SimpleNamespace) -> tuple[list[Any], ...]:
    """This step's float32 g (divided by grad_scale), p, m, v, u from the stored
    float8 moments and the scalars ``s``."""
    g = scaled_grads(B, a.grads, a.grad_scale)
    m = B.add(B.mul(B.to_float(a.exp_avgs), s.beta1_scale), B.mul(g, s.one_minus_beta1))
    v = B.add(B.mul(B.to_float(a.exp_avg_sqs), s.beta2_scale), B.mul(B.mul(g, g), s.one_minus_beta2))
    p = master_or_params(B, a.params, a.master_params)
    u = B.div(m, B.add(B.sqrt(v), a.eps))
    if a.weight_decay != 0:
        u = B.add(u, B.mul(p, a.weight_decay))
    return g, p, m, v, u


def lamb16_reduce(B: Backend, a: SimpleNamespace) -> list[list[Any]]:
    """Pass 1 (writes only the steps): [||p||^2, ||u||^2, amax |m|, amax v] per tensor.
    Leaves its scalars in ``a.moment_scalars`` for the apply phase of a one-call
    step (a separate apply op recomputes them: nothing has changed them)."""
    increment_steps(B, a.steps)
    a.moment_scalars = _scalars(B, a)
    _, p, m, v, u = _moments(B, a, a.moment_scalars)
    return B.reductions(("sumsq", p), ("sumsq", u), ("absmax", m), ("absmax", v))


def lamb16_apply(B: Backend, a: SimpleNamespace, reductions: list[list[Any]]) -> None:
    """Pass 2: p, m8, v8 and the scales written, from the reductions."""
    g, p, m, v, u = _moments(B, a, getattr(a, "moment_scalars", None) or _scalars(B, a))
    # r = clamp((||p|| / ||u|| * 1e-3 / lr) ** trust_scale, 0, 2), 1 when a norm is 0
    p_norm, u_norm = B.sqrt(reductions[0]), B.sqrt(reductions[1])
    scaled = B.pow(B.mul(B.div(B.div(p_norm, u_norm), a.lr), 1e-3), a.trust_scale)
    ratio = B.where_positive(p_norm, u_norm, B.minimum(scaled, 2.0), 1.0)
    # new scales: amax maps to the float8 max (never saturates), FLT_MIN floor
    m_scale = B.maximum(B.div(reductions[2], _M_MAX), _FLT_MIN)
    v_scale = B.maximum(B.div(reductions[3], _V_MAX), _FLT_MIN)
    step_size, m_scale, v_scale, inv_m_scale, inv_v_scale = B.scalars(
        B.mul(ratio, a.lr), m_scale, v_scale, B.reciprocal(m_scale), B.reciprocal(v_scale))

    m_new = B.maximum(B.minimum(B.mul(m, inv_m_scale), _M_MAX), -_M_MAX)
    v_new = B.maximum(B.minimum(B.mul(v, inv_v_scale), _V_MAX), -_V_MAX)
    rounding = None
    if a.stochastic_rounding:  # one hash of both old codes, computed before either assign
        hashes = element_hash(B, tensor_key(B, a.seed, a.steps), g, a.exp_avgs, a.exp_avg_sqs)
        m_new = stochastic_round(B, m_new, hashes, torch.float8_e4m3fn)
        v_new = stochastic_round(B, v_new, hashes, torch.float8_e5m2)
        rounding = param_rounding(B, a, hashes=hashes)  # (a rounded param hashes the element hash)

    assign_params(B, a.params, a.master_params, B.sub(p, B.mul(u, step_size)), rounding)
    B.assign(a.exp_avgs, m_new)
    B.assign(a.exp_avg_sqs, v_new)
    B.assign(a.exp_avg_scales, m_scale)
    B.assign(a.exp_avg_sq_scales, v_scale)
