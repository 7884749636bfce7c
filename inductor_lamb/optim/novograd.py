"""NovoGrad (Ginsburg et al., "Stochastic Gradient Methods with Layer-wise Adaptive Moments for
Training of Deep Networks"), timm's NvNovoGrad semantics, one second moment a layer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor
from typing_extensions import Unpack

from ..spec import NOVOGRAD
from ._base import (
    FusedOptimizer,
    FusedOptions,
    OpFamily,
    check_betas,
    check_nonnegative,
    decoupled_decay_options,
    decoupled_decay_own_options,
)

__all__ = ["NovoGrad"]

# apex FusedNovoGrad's options that change the math, with what this NovoGrad does instead.
_APEX_OPTIONS = {
    "norm_type": (2.0, "only the L2 norm of each layer's grads (apex's norm_type=2)"),
    "bias_correction": (False, "no bias correction, as timm's NvNovoGrad"),
    "init_zero": (False, "v starts at the first step's ||g||^2, as timm's NvNovoGrad"),
    "reg_inside_moment": (None, "weight decay inside the moment by default; decoupled_decay=True applies it "
                                "to the update only, as apex's reg_inside_moment=False"),
}


class NovoGrad(FusedOptimizer):
    r"""NovoGrad with a fused multi-tensor step: one ``torch.ops.lamb.novograd_step_`` call per
    (device, dtype, sharding) bucket of each param group (timm's ``NvNovoGrad``)::

        v = ||g||^2 (first step), then beta2 v + (1 - beta2) ||g||^2   (one number per tensor)
        u = g / (sqrt(v) + eps) + weight_decay p;  u *= 1 - beta1 (grad_averaging)
        m = beta1 m + u;  p = p - lr m

    The second moment is one number per param tensor, from the norm of the whole tensor's grad:
    the state is one tensor a param (``exp_avg``), half of AdamW's. Under FSDP2, DTensor and
    DeepSpeed ZeRO the norm is the whole tensor's, not a shard's.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr: learning rate (kept as a 0-d tensor so schedulers never force a recompile).
        betas: coefficients of the running averages of the update and of the layer's squared
            grad norm.
        eps: term added to the denominator.
        weight_decay: weight decay, part of the update ``u`` (L2).
        grad_averaging: scale ``u`` by ``1 - beta1`` before it enters ``m``.
        amsgrad: divide by the running maximum of ``v`` (``max_exp_avg_sq``).
        decoupled_decay: apply weight decay as ``p *= 1 - lr weight_decay`` outside ``u``
            (AdamW style; apex's ``reg_inside_moment=False``).
        corrected_weight_decay: with ``decoupled_decay``, decay by ``lr^2 / max_lr`` instead
            of ``lr`` (timm's).
        max_lr: the peak lr of ``corrected_weight_decay`` (0: the constructor's lr, as timm's),
            kept in the param groups as ``max_lr_snapshot`` (timm's key: torch's ``OneCycleLR``
            writes its own ``max_lr`` into every group).
        max_lr_snapshot: ``max_lr`` by its group key (what ``type(opt)(params, **opt.defaults)``
            passes).
        norm_type: apex ``FusedNovoGrad``'s option, accepted at its L2 value (2) only.
        bias_correction: apex's option, accepted as ``False`` only.
        init_zero: apex's option, accepted as ``False`` only.
        reg_inside_moment: apex's option, refused (see ``decoupled_decay``).
        master_weights: keep a float32 master copy of bfloat16/float16 params in the state
            (``state["master_param"]``) and update that.
        {param_rounding_args}
        {unscale_in_step_arg}

    State per parameter: ``step`` (0-d float32), ``exp_avg`` (float32, like the param),
    ``exp_avg_sq`` and ``max_exp_avg_sq`` (0-d float32: ``v`` and its running maximum, which the
    denominator reads with ``amsgrad``), and ``master_param`` with ``master_weights``.
    """

    _ops = OpFamily.of(NOVOGRAD)
    _own_options = decoupled_decay_own_options(FusedOptimizer._own_options)
    _state_keys = ("exp_avg",)
    _scalar_state_keys = ("exp_avg_sq", "max_exp_avg_sq")

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.95, 0.98),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        grad_averaging: bool = False,
        amsgrad: bool = False,
        *,
        decoupled_decay: bool = False,
        corrected_weight_decay: bool = False,
        max_lr: float = 0.0,
        max_lr_snapshot: float | None = None,
        norm_type: float = 2.0,
        bias_correction: bool = False,
        init_zero: bool = False,
        reg_inside_moment: bool | None = None,
        **options: Unpack[FusedOptions],
    ) -> None:
        for name, value in (("norm_type", norm_type), ("bias_correction", bias_correction),
                            ("init_zero", init_zero), ("reg_inside_moment", reg_inside_moment)):
            inert, instead = _APEX_OPTIONS[name]
            if value != inert:
                raise ValueError(f"NovoGrad: {name}={value!r} (apex FusedNovoGrad's) is not supported: {instead}")
        check_betas(betas)
        check_nonnegative(eps=eps, weight_decay=weight_decay)
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, grad_averaging=bool(grad_averaging),
            amsgrad=bool(amsgrad), **decoupled_decay_options(lr, decoupled_decay, corrected_weight_decay, max_lr,
                                                                   max_lr_snapshot),
        )
        super().__init__(params, defaults, **options)
