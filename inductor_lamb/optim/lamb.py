"""LAMB (You et al., "Large Batch Optimization for Deep Learning"), apex FusedLAMB semantics."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor
from typing_extensions import Unpack

from ..spec import LAMB
from ._base import (
    FusedOptimizer,
    FusedOptions,
    OpFamily,
    check_betas,
    check_nonnegative,
    decoupled_decay_options,
    decoupled_decay_own_options,
)

__all__ = ["Lamb"]


class Lamb(FusedOptimizer):
    r"""LAMB with a fused multi-tensor step: one ``torch.ops.lamb.lamb_step_``
    call per (device, dtype, sharding) bucket of each param group.

    Update (t = step, bias corrections as in Adam, ``u`` the AdamW direction)::

        m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
        u = (m / bc1) / (sqrt(v / bc2) + eps) + weight_decay p
        p = p - lr * (||p|| / ||u||) * u

    The trust ratio ``||p|| / ||u||`` is per parameter tensor; it is 1 when a
    norm is zero, or when ``weight_decay == 0`` and ``always_adapt`` is False. With
    ``decoupled_decay`` (timm's option) the decay leaves ``u`` and scales the param first,
    ``p *= 1 - lr weight_decay``, and the trust ratio reads that decayed ``p``.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr: learning rate (kept as a 0-d tensor so schedulers never force a recompile).
        betas: coefficients of the running averages of the gradient and its square.
        eps: term added to the denominator.
        weight_decay: AdamW-style weight decay, part of the update ``u`` (scaled by the trust
            ratio), or applied to the param before it with ``decoupled_decay``.
        bias_correction: apply Adam's bias correction.
        grad_averaging: ``m`` accumulates ``(1 - beta1) g`` (else ``g``).
        always_adapt: use the trust ratio even when ``weight_decay == 0``.
        trust_clip: clip the trust ratio at 1.
        max_grad_norm: if > 0, first clip the gradients by their global norm
            over the param group.
        decoupled_decay: ``p *= 1 - lr weight_decay`` before the update, outside ``u`` and
            the trust ratio (timm's ``decoupled_decay``).
        corrected_weight_decay: with ``decoupled_decay``, decay by ``lr^2 / max_lr`` instead
            of ``lr`` (timm's).
        max_lr: the peak lr of ``corrected_weight_decay`` (0: the constructor's lr, as timm's),
            kept in the param groups as ``max_lr_snapshot`` (timm's key: torch's ``OneCycleLR``
            writes its own ``max_lr`` into every group).
        max_lr_snapshot: ``max_lr`` by its group key (what ``type(opt)(params, **opt.defaults)``
            passes).
        master_weights: keep a float32 master copy of bfloat16/float16 params
            in the state (``state["master_param"]``) and update that.
        {param_rounding_args}
        {unscale_in_step_arg}

    State per parameter: ``step`` (0-d float32), ``exp_avg``, ``exp_avg_sq``
    (float32), and ``master_param`` with ``master_weights``.
    """

    _ops = OpFamily.of(LAMB)
    _own_options = decoupled_decay_own_options(FusedOptimizer._own_options)
    _state_keys = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        *,
        bias_correction: bool = True,
        grad_averaging: bool = True,
        always_adapt: bool = False,
        trust_clip: bool = False,
        max_grad_norm: float = 0.0,
        decoupled_decay: bool = False,
        corrected_weight_decay: bool = False,
        max_lr: float = 0.0,
        max_lr_snapshot: float | None = None,
        **options: Unpack[FusedOptions],
    ) -> None:
        check_betas(betas)
        check_nonnegative(eps=eps, weight_decay=weight_decay, max_grad_norm=max_grad_norm)
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
            grad_averaging=grad_averaging, always_adapt=always_adapt, trust_clip=trust_clip,
            max_grad_norm=max_grad_norm, **decoupled_decay_options(lr, decoupled_decay, corrected_weight_decay, max_lr,
                                                                   max_lr_snapshot),
        )
        super().__init__(params, defaults, **options)

    def _adopt_foreign_group(self, group: dict[str, Any], num_groups: int) -> list[str]:
        """timm's ``Lamb`` and apex's ``FusedLAMB`` groups: the same hyper-parameters
        (apex FusedLAMB semantics), plus options this Lamb does not have."""
        notes = []
        if group.get("max_grad_norm") is None:  # timm: None disables clipping
            group["max_grad_norm"] = 0.0
        elif group["max_grad_norm"] > 0 and num_groups > 1:
            notes.append("max_grad_norm clips by the grad norm of each param group here, of all groups in "
                         "timm and apex")
        if group.pop("caution", False):
            notes.append("caution=True (cautious masking) is not supported: the steps go on without it")
        max_lr = group.get("max_lr_snapshot")
        group["decoupled_decay"] = bool(group.get("decoupled_decay", False))
        group["corrected_weight_decay"] = bool(group.get("corrected_weight_decay")) and group["decoupled_decay"]
        group["max_lr_snapshot"] = float(max_lr) if group["corrected_weight_decay"] and max_lr else 0.0
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        return notes
