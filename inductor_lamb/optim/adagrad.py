"""Adagrad, exactly as torch.optim.Adagrad, with a fused multi-tensor step."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from typing_extensions import Unpack

from ..spec import ADAGRAD, Arg, Role
from ._base import Bucket, FusedOptimizer, FusedOptions, OpFamily, check_nonnegative

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
        {param_rounding_args}
        {unscale_in_step_arg}
    """

    _ops = OpFamily.of(ADAGRAD)
    _own_options = {**FusedOptimizer._own_options,
                    "initial_accumulator_value": Arg("initial_accumulator_value", Role.FLOAT)}
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
        **options: Unpack[FusedOptions],
    ) -> None:
        check_nonnegative(lr_decay=lr_decay, weight_decay=weight_decay,
                          initial_accumulator_value=initial_accumulator_value, eps=eps)
        defaults = dict(
            lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
            initial_accumulator_value=initial_accumulator_value, eps=eps, maximize=maximize,
        )
        super().__init__(params, defaults, **options)

    def _state_fill(self, key: str, group: dict[str, Any]) -> float:
        return float(group.get("initial_accumulator_value", 0.0))

    # ---- sparse gradients (nn.Embedding(sparse=True)) ------------------------------------

    def _check_sparse(self, p: Tensor, group: dict[str, Any], name: str) -> None:
        if group["weight_decay"] != 0:  # torch.optim.Adagrad's check and message
            raise RuntimeError("weight_decay option is not compatible with sparse gradients")
        if p.is_sparse:
            raise RuntimeError(f"Adagrad: param {name} is sparse; sparse gradients need a dense param")

    @torch.no_grad()
    def _step_sparse(self, group: dict[str, Any], bucket: Bucket, grad_scale: Tensor | None,
                     found_inf: Tensor | None) -> None:
        """torch.optim.Adagrad's sparse update: only the rows a sparse grad touches
        change, in ``sum`` and in the param, at a cost in those rows alone: the
        squared grads added into ``sum``, the new sums gathered, the update added
        into the param (three passes over the touched rows, as torch's own)."""
        if found_inf is not None and bool(found_inf):
            return
        lr, lr_decay, eps = group["lr"], group["lr_decay"], group["eps"]
        masters: list[Tensor | None] = list(bucket.master_params) or [None] * len(bucket.params)
        for p, g, s, step, master in zip(bucket.params, bucket.grads, bucket.lists["state_sums"], bucket.lists["steps"],
                                         masters):
            g = g.coalesce()  # duplicate indices summed, as torch's update does
            rows = _SparseRows(g._indices())
            values = g._values().to(s.dtype, copy=True)  # (a copy: updated in place below)
            if grad_scale is not None:
                values.div_(grad_scale.to(values.dtype))
            if group["maximize"]:
                values.neg_()
            step += 1
            clr = lr / (1 + (step.to(s.dtype) - 1) * lr_decay)
            rows.add(s, values * values)
            update = values.div_(rows.get(s).sqrt_().add_(eps)).mul_(-clr)
            if master is None:
                rows.add(p, update)
            else:
                rows.add(master, update)
                rows.copy(p, rows.get(master))


class _SparseRows:
    """The entries a sparse COO grad addresses (its ``sparse_dim`` leading index
    dims, coalesced) in a dense tensor of its shape: read, added to and written
    without touching the rest."""

    def __init__(self, indices: Tensor) -> None:
        self.index = indices[0] if indices.shape[0] == 1 else tuple(indices)

    def get(self, t: Tensor) -> Tensor:
        return t.index_select(0, self.index) if isinstance(self.index, Tensor) else t[self.index]

    def add(self, t: Tensor, values: Tensor) -> None:
        if isinstance(self.index, Tensor):
            t.index_add_(0, self.index, values.to(t.dtype))
        else:
            t.index_put_(self.index, values.to(t.dtype), accumulate=True)

    def copy(self, t: Tensor, values: Tensor) -> None:
        if isinstance(self.index, Tensor):
            t.index_copy_(0, self.index, values.to(t.dtype))
        else:
            t.index_put_(self.index, values.to(t.dtype))
