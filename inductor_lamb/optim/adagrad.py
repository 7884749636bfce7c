"""Adagrad, exactly as torch.optim.Adagrad, with a fused multi-tensor step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor

from ..spec import ADAGRAD
from ._base import FusedOptimizer, check_nonnegative

__all__ = ["Adagrad"]


class Adagrad(FusedOptimizer):
    r"""Adagrad (Duchi et al.) with the semantics and state of ``torch.optim.Adagrad``::

        clr = lr / (1 + (t - 1) lr_decay);  g = grad + wd p  (maximize: -grad + wd p)
        sum = sum + g^2;  p = p - clr g / (sqrt(sum) + eps)

    State per parameter: ``step`` (0-d float32) and ``sum`` (float32), the keys of
    ``torch.optim.Adagrad``: state dicts load from one into the other. Unlike
    torch 2.13's ``Adagrad(fused=True)`` on CPU, non-contiguous gradients are handled
    correctly.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr: learning rate (a 0-d tensor internally).
        lr_decay: learning rate decay.
        weight_decay: L2 penalty.
        initial_accumulator_value: initial value of ``sum``.
        eps: added to the denominator.
        maximize: maximize the objective.
        master_weights: float32 master copies of bfloat16/float16 params.
    """

    _op = ADAGRAD
    _state_keys = ("sum",)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        *,
        maximize: bool = False,
        master_weights: bool = False,
    ) -> None:
        check_nonnegative(lr_decay=lr_decay, weight_decay=weight_decay,
                          initial_accumulator_value=initial_accumulator_value, eps=eps)
        defaults = dict(
            lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value, eps=eps, maximize=maximize,
            master_weights=master_weights,
        )
        super().__init__(params, defaults)

    def _state_fill(self, key: str, group: dict[str, Any]) -> float:
        return float(group.get("initial_accumulator_value", 0.0))
