"""The numerical contract of docs/design.md in torch ops: the spec in code.

Runs in the dtype of the tensors it is given; tests give it float64 copies and
compare every backend against it. Per-tensor loops, no fusion: clarity first.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

import torch
from torch import Tensor

from .rounding import FP8_MAX, TENSORS, element_hash, stochastic_round, tensor_key
from .spec import SPECS, Role

__all__ = ["lamb_step", "lamb16_step", "lars_step", "adagrad_step", "novograd_step", "lamb_reduce", "lamb_apply",
           "lamb16_reduce", "lamb16_apply", "lars_reduce", "lars_apply", "novograd_reduce", "novograd_apply", "FP8_MAX", "fp8_scale", "fp8_scale_of_amax", "fp8_encode",
           "fp8_decode"]

_FLT_MIN = torch.finfo(torch.float32).tiny


def _reference(op: str):
    """Gives the math below the signature of ``op`` (spec.py) minus master params:
    give the reference the high-precision params directly. ``lr`` and the
    scheduled hyper-parameters may be floats or 0-d tensors; the ops take them as
    float32 tensors, so a float is first rounded to float32 (``1 - beta2`` of
    0.999 and of float32(0.999) differ by 1e-5 relative)."""
    spec = SPECS[op]
    scheduled = [a.name for a in spec.of(Role.TENSOR)]

    def decorate(body):
        def run(a):
            for name in scheduled:
                value = getattr(a, name)
                if isinstance(value, (int, float)):
                    setattr(a, name, struct.unpack("f", struct.pack("f", value))[0])
            return body(a)

        return torch.no_grad()(spec.function(run, body.__name__, master=False, doc=body.__doc__))

    return decorate


def _two_phase(step_op: str, reduce_body, apply_body):
    """The reference one-call step, reduce and apply functions of a layer-wise op
    from its two phases: ``reduce_body(a)`` returns the [n, k] reductions,
    ``apply_body(a, reductions)`` finishes; the step is one then the other.
    When ``found_inf`` is set, reduce returns zeros and nothing is written."""
    spec = SPECS[step_op]
    k = len(spec.reductions)

    def skipped(a) -> bool:
        return a.found_inf is not None and float(a.found_inf) != 0.0

    def reduce(a):
        if skipped(a):
            dtype = a.params[0].dtype if len(a.params) else torch.float32
            return torch.zeros((len(a.params), k), dtype=dtype)
        if not len(a.params):
            return torch.zeros((0, k))
        return torch.stack([torch.stack(list(col)) for col in reduce_body(a)], dim=1)

    def apply(a, reductions):
        if not skipped(a) and len(a.params):
            apply_body(a, reductions.unbind(1))

    base = step_op.removesuffix("_step_")
    step = _reference(step_op)(_named(lambda a: apply(a, reduce(a)), f"{base}_step", apply_body.__doc__))
    red = _reference(spec.reduce_op)(_named(reduce, f"{base}_reduce", reduce_body.__doc__))
    app = _reference(spec.apply_op)(_named(lambda a: apply(a, a.reductions), f"{base}_apply", apply_body.__doc__))
    return step, red, app


def _named(f, name: str, doc: str | None):
    f.__name__ = f.__qualname__ = name
    f.__doc__ = doc
    return f


def _lamb_grads(a) -> list[Tensor]:
    gs = list(a.grads)
    if a.grad_scale is not None:
        gs = [g / a.grad_scale for g in gs]
    if a.max_grad_norm > 0 and gs:
        norm = torch.stack([(g.to(torch.float64) ** 2).sum() for g in gs]).sum().sqrt()
        clip = (norm / a.max_grad_norm).clamp(min=1.0)
        gs = [g / clip.to(g.dtype) for g in gs]
    return gs


def _decay_keep(a):
    """The param's factor before an update under decoupled weight decay: ``1 - s wd`` with
    ``s = lr``, or ``lr^2 / max_lr`` where ``max_lr > 0`` (timm's ``corrected_weight_decay``);
    ``None`` without decoupled decay or weight decay."""
    if not a.decoupled_decay or a.weight_decay == 0:
        return None
    s = a.lr * a.lr / a.max_lr if a.max_lr > 0 else a.lr
    return 1.0 - s * a.weight_decay


def _lamb_update(a, p: Tensor, m: Tensor, v: Tensor, step: Tensor) -> Tensor:
    """u = (m / bc1) / (sqrt(v / bc2) + eps) + wd p (no wd p under decoupled decay)."""
    if a.bias_correction:
        bc1 = 1.0 - torch.pow(a.beta1, step).to(p.dtype)
        bc2 = 1.0 - torch.pow(a.beta2, step).to(p.dtype)
        u = (m / bc1) / ((v / bc2).sqrt() + a.eps)
    else:
        u = m / (v.sqrt() + a.eps)
    return u + a.weight_decay * p if a.weight_decay != 0 and not a.decoupled_decay else u


def _lamb_reduce(a):
    """LAMB pass 1 (apex FusedLAMB, adam_w_mode=True): steps, m, v updated in place;
    per tensor ||p||^2 and ||u||^2."""
    # Only tensor ops past the found_inf check (no host syncs): the reference also
    # serves as the torch-ops baseline that benchmarks run eagerly and under torch.compile.
    beta1, beta2 = a.beta1, a.beta2
    beta3 = 1.0 - beta1 if a.grad_averaging else 1.0
    p_sq, u_sq = [], []
    for p, g, m, v, step in zip(a.params, _lamb_grads(a), a.exp_avgs, a.exp_avg_sqs, a.steps):
        step += 1
        m.mul_(beta1).add_(g * beta3)
        v.mul_(beta2).add_(g * g * (1.0 - beta2))
        u = _lamb_update(a, p, m, v, step)
        p_sq.append((p * p).sum())
        u_sq.append((u * u).sum())
    return p_sq, u_sq


def _lamb_apply(a, reductions) -> None:
    """LAMB (NVIDIA apex FusedLAMB semantics, adam_w_mode=True), in place. With
    ``decoupled_decay`` (timm's), p *= keep first and the trust ratio reads the decayed p."""
    adapt = a.weight_decay != 0 or a.always_adapt
    keep = _decay_keep(a)
    for p, m, v, step, p_sq, u_sq in zip(a.params, a.exp_avgs, a.exp_avg_sqs, a.steps, *reductions):
        u = _lamb_update(a, p, m, v, step)
        if keep is not None:
            p.mul_(keep)
            p_sq = p_sq * keep * keep
        if adapt:
            p_norm, u_norm = p_sq.sqrt().to(p.dtype), u_sq.sqrt().to(p.dtype)
            ratio = torch.where((p_norm > 0) & (u_norm > 0), p_norm / u_norm, torch.ones_like(p_norm))
            if a.trust_clip:
                ratio = ratio.clamp(max=1.0)
            u = u * ratio
        p.sub_(a.lr * u)


lamb_step, lamb_reduce, lamb_apply = _two_phase("lamb_step_", _lamb_reduce, _lamb_apply)


def fp8_scale_of_amax(amax: Tensor, dtype: torch.dtype) -> Tensor:
    """The per-tensor float32 scale LAMB16 stores a tensor whose largest magnitude
    is ``amax`` with: ``amax`` maps to the largest finite value of ``dtype`` (so
    nothing saturates and the bulk of a heavy-tailed tensor stays in float8's
    normal range), floored at FLT_MIN so an all-zero tensor still gets a finite,
    nonzero scale."""
    return (amax.float() / FP8_MAX[dtype]).clamp(min=_FLT_MIN)


def fp8_scale(x: Tensor, dtype: torch.dtype) -> Tensor:
    """:func:`fp8_scale_of_amax` of ``x``."""
    return fp8_scale_of_amax(x.abs().amax() if x.numel() else x.new_zeros(()), dtype)


def fp8_encode(x: Tensor, scale: Tensor, dtype: torch.dtype, hashes: Tensor | None = None) -> Tensor:
    """``dtype(clamp(x * (1 / scale)))``: saturating, never inf/NaN for finite ``x``;
    round to nearest even, or with the random bits ``hashes``
    (:func:`inductor_lamb.rounding.element_hash`) stochastically
    (:func:`inductor_lamb.rounding.stochastic_round` of the float32 value)."""
    hi = FP8_MAX[dtype]
    inv = (1.0 / scale.float()).to(x.dtype)
    y = (x * inv).clamp(-hi, hi)
    if hashes is not None:
        y = stochastic_round(TENSORS, y.float(), hashes, dtype)
    # Through float32, as the kernels round: Triton has no float64 <-> float8 conversion.
    return y.float().to(dtype)


def fp8_decode(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Float8 codes ``x`` as ``dtype``, exactly (every float8 value is a float32, and a
    bf16 / fp16 one). Through float32: Triton has no float8 -> float64 conversion, which a
    compiled step of float64 params on CUDA would need. torch 2.11's Inductor folds
    float8 -> float32 -> float64 back into one conversion; an (exact) negation on each
    side of the second keeps them apart."""
    y = x.float()
    return -((-y).to(dtype)) if dtype == torch.float64 else y.to(dtype)


def _lamb16_moments(a):
    """Per tensor (p, m, v, u, step) of this step in the params' dtype, from the
    stored float8 moments and the old scales."""
    beta1, beta2 = a.beta1, a.beta2
    for p, g, m8, v8, sm, sv in zip(a.params, a.grads, a.exp_avgs, a.exp_avg_sqs, a.exp_avg_scales,
                                    a.exp_avg_sq_scales):
        g = g.to(p.dtype)
        if a.grad_scale is not None:
            g = g * (1.0 / a.grad_scale)
        # beta * old scale is one float32 per tensor, as in the kernels.
        m = fp8_decode(m8, p.dtype) * (beta1 * sm).to(p.dtype) + (1.0 - beta1) * g
        v = fp8_decode(v8, p.dtype) * (beta2 * sv).to(p.dtype) + (1.0 - beta2) * (g * g)
        yield p, m, v, m / (v.sqrt() + a.eps) + a.weight_decay * p


def _lamb16_reduce(a):
    """LAMB16 pass 1 (steps += 1, nothing else written): per tensor ||p||^2,
    ||u||^2, max |m|, max v."""
    for step in a.steps:
        step += 1
    cols = ([], [], [], [])
    for p, m, v, u in _lamb16_moments(a):
        for col, x in zip(cols, ((p * p).sum(), (u * u).sum(), m.abs().amax() if m.numel() else m.new_zeros(()),
                                 v.abs().amax() if v.numel() else v.new_zeros(()))):
            col.append(x)
    return cols


def _lamb16_apply(a, reductions) -> None:
    """LAMB16 (LAMB with float8 moments), in place.

    The math runs in the params' dtype; ``exp_avgs`` (float8_e4m3fn),
    ``exp_avg_sqs`` (float8_e5m2) and their 0-d float32 scales are updated in place.
    The moments are rounded to float8 stochastically (:mod:`inductor_lamb.rounding`)
    unless ``stochastic_rounding`` is False.
    """
    lr = a.lr
    rows = list(zip(_lamb16_moments(a), a.grads, a.steps, a.exp_avgs, a.exp_avg_sqs, a.exp_avg_scales,
                    a.exp_avg_sq_scales, *reductions))
    for (p, m, v, u), g, step, m8, v8, sm, sv, p_sq, u_sq, m_amax, v_amax in rows:
        p_norm, u_norm = p_sq.sqrt().to(p.dtype), u_sq.sqrt().to(p.dtype)
        ratio = (p_norm / u_norm * 1e-3 / lr).pow(a.trust_scale).clamp(0.0, 2.0)
        ratio = torch.where((p_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio))
        p.sub_(lr * ratio * u)
        sm.copy_(fp8_scale_of_amax(m_amax, m8.dtype))
        sv.copy_(fp8_scale_of_amax(v_amax, v8.dtype))
        key = tensor_key(TENSORS, a.seed, step) if a.stochastic_rounding else None
        if key is not None:  # the hash reads the float32 grads / grad_scale the kernels compute
            g = g.float() if a.grad_scale is None else g.float() * (1.0 / a.grad_scale.float())
        hashes = None if key is None else element_hash(TENSORS, key, g, m8, v8)
        m_new = fp8_encode(m, sm, m8.dtype, hashes)
        v_new = fp8_encode(v, sv, v8.dtype, hashes)
        m8.copy_(m_new)
        v8.copy_(v_new)


lamb16_step, lamb16_reduce, lamb16_apply = _two_phase("lamb16_step_", _lamb16_reduce, _lamb16_apply)


def _per_param(values, n: int, if_empty) -> list:
    """A per-parameter option given as one value, or none / one / one per param in a list."""
    values = list(values) if isinstance(values, (list, tuple)) else [values]
    return [if_empty] * n if not values else (values * n if len(values) == 1 else values)


def _lars_grads(a):
    for g in a.grads:
        g = g * a.rescale_grad
        yield g / a.grad_scale if a.grad_scale is not None else g


def _lars_reduce(a):
    """LARS layer norms (nothing written): per tensor ||p||^2 and ||g||^2."""
    return [(p * p).sum() for p in a.params], [(g * g).sum() for g in _lars_grads(a)]


def _lars_apply(a, reductions) -> None:
    """LARS (You et al. 2017; PaddlePaddle ``lars_momentum``, or torch SGD's momentum without
    ``lr_in_momentum``), in place."""
    n, lr = len(a.params), a.lr
    wds, adapts = _per_param(a.weight_decay, n, 0.0), _per_param(a.layer_adaptation, n, True)
    for p, g, v, wd, adapt, p_sq, g_sq in zip(a.params, _lars_grads(a), a.momentum_buffers, wds, adapts, *reductions):
        in_v = lr if a.lr_in_momentum else 1.0  # (the lr in the velocity, or in the param update)
        local_lr = in_v * torch.ones((), dtype=p.dtype)
        if adapt and wd > 0:
            p_norm, g_norm = p_sq.sqrt().to(p.dtype), g_sq.sqrt().to(p.dtype)
            trust = in_v * a.lars_coeff * p_norm / (g_norm + wd * p_norm + a.eps)
            local_lr = torch.where((p_norm > 0) & (g_norm > 0), trust, local_lr)
        v.mul_(a.momentum).add_(local_lr * (g + wd * p))
        p.sub_(v if a.lr_in_momentum else lr * v)


lars_step, lars_reduce, lars_apply = _two_phase("lars_step_", _lars_reduce, _lars_apply)


@_reference("adagrad_step_")
def adagrad_step(a: SimpleNamespace) -> None:
    """Adagrad, exactly as ``torch.optim.Adagrad`` (state ``sum``), in place."""
    if a.found_inf is not None and float(a.found_inf) != 0.0:
        return
    for p, g, s, step in zip(a.params, a.grads, a.state_sums, a.steps):
        if a.grad_scale is not None:
            g = g / a.grad_scale
        if a.maximize:
            g = -g
        step += 1
        t = step.to(torch.promote_types(step.dtype, p.dtype))  # (float32 steps of float64 params)
        clr = a.lr / (1 + (t - 1) * a.lr_decay)
        if a.weight_decay != 0:
            g = g + a.weight_decay * p
        s.addcmul_(g, g)
        p.sub_(clr * g / (s.sqrt() + a.eps))


def _novograd_reduce(a):
    """NovoGrad pass 1: the steps counted; per tensor ||g / grad_scale||^2 (nothing else written)."""
    g_sq = []
    for g, step in zip(a.grads, a.steps):
        step += 1
        g = g / a.grad_scale if a.grad_scale is not None else g
        g_sq.append((g * g).sum())
    return (g_sq,)


def _novograd_apply(a, reductions) -> None:
    """NovoGrad (Ginsburg et al. 2019; timm's ``NvNovoGrad``), in place: per tensor its second
    moment v = ||g||^2 on the first step (unless v > 0), else beta2 v + (1 - beta2) ||g||^2 (its running
    max, kept either way, is the denominator's with ``amsgrad``); u = g / (sqrt(v) + eps) + wd p, times 1 - beta1 with
    ``grad_averaging``; m = beta1 m + u; p -= lr m (with ``decoupled_decay`` wd leaves u and
    p *= :func:`_decay_keep` first)."""
    beta1, beta2 = a.beta1, a.beta2
    keep = _decay_keep(a)
    for p, g, m, v, v_max, g_sq in zip(a.params, a.grads, a.exp_avgs, a.exp_avg_sqs, a.max_exp_avg_sqs,
                                       *reductions):
        g = g / a.grad_scale if a.grad_scale is not None else g
        g_sq = g_sq.to(v.dtype)
        v.copy_(torch.where(v > 0, beta2 * v + (1.0 - beta2) * g_sq, g_sq))
        v_max.copy_(torch.where(v_max < v, v, v_max))  # (kept either way; read with amsgrad)
        denom = ((v_max if a.amsgrad else v).sqrt() + a.eps).to(p.dtype)
        u = g / denom
        if a.weight_decay != 0 and not a.decoupled_decay:
            u = u + a.weight_decay * p
        if a.grad_averaging:
            u = u * (1.0 - beta1)
        m.mul_(beta1).add_(u)
        if keep is not None:
            p.mul_(keep)
        p.sub_(a.lr * m)


novograd_step, novograd_reduce, novograd_apply = _two_phase("novograd_step_", _novograd_reduce, _novograd_apply)
