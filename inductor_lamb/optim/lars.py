"""LARS (You et al., "Large Batch Training of Convolutional Networks"), merged over all layers."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from torch import Tensor
from typing_extensions import Unpack

from ..spec import LARS
from ._base import Bucket, FusedOptimizer, FusedOptions, OpFamily, check_nonnegative

__all__ = ["Lars"]

Exclusion = Callable[[str], bool] | Sequence[str] | None


def _matcher(exclude: Exclusion, what: str) -> Callable[[str | None], bool]:
    """A callable on parameter names, from a callable or a list of regex patterns (``re.search``)."""
    if exclude is None:
        return lambda name: False
    if callable(exclude):
        fn = exclude
    else:
        patterns = [re.compile(p) for p in exclude]

        def fn(name: str) -> bool:
            return any(p.search(name) for p in patterns)

    def match(name: str | None) -> bool:
        if name is None:
            raise ValueError(
                f"Lars: {what} needs parameter names: build the optimizer from model.named_parameters()"
            )
        return bool(fn(name))

    return match


class Lars(FusedOptimizer):
    r"""LARS with momentum: one ``torch.ops.lamb.lars_step_`` call updates every
    layer of a (device, dtype) bucket (PaddlePaddle's merged ``lars_momentum``)::

        local_lr = lr * lars_coeff * ||p|| / (||g|| + wd ||p|| + eps)   (wd > 0, norms > 0, adapted layer)
                 = lr                                                    (otherwise)
        v = momentum v + local_lr (g + wd p);  p = p - v

    The velocity carries the lr, as in the LARS paper and PaddlePaddle: a new lr takes effect
    gradually, and at lr 0 the params still move by the momentum they have.
    ``lr_in_momentum=False`` takes torch SGD's form instead (timm's ``Lars``): the local lr is
    taken at lr 1 and ``p = p - lr v``, so the lr scales each step and lr 0 moves nothing.

    Args:
        params: parameters, param groups, or ``model.named_parameters()`` (needed for exclusions).
        lr: learning rate (a 0-d tensor internally: schedulers never recompile).
        momentum: momentum factor.
        weight_decay: weight decay (L2, inside the momentum update).
        lars_coeff: trust coefficient (eta).
        eps: added to the local lr denominator.
        exclude_from_weight_decay: parameters with no weight decay (their local lr is then ``lr``),
            as a callable on the parameter name or a list of regex patterns, e.g.
            ``["bias", "bn", "norm"]``.
        exclude_from_layer_adaptation: parameters that keep decay but use ``lr`` as is.
        rescale_grad: gradients are multiplied by this first.
        lr_in_momentum: the velocity carries the lr (default; the paper's form), or the lr
            scales the param update (``False``; torch SGD's and timm's form).
        master_weights: float32 master copies of bfloat16/float16 params.
        {param_rounding_args}
        {unscale_in_step_arg}

    State per parameter: ``momentum_buffer`` (float32, starts at zero), and
    ``master_param`` with ``master_weights``.
    """

    _ops = OpFamily.of(LARS)
    _state_keys = ("momentum_buffer",)
    # (the lr was in the momentum before the option existed)
    _options_before_they_existed = {**FusedOptimizer._options_before_they_existed, "lr_in_momentum": True}

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-3,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        lars_coeff: float = 0.001,
        eps: float = 0.0,
        *,
        exclude_from_weight_decay: Exclusion = None,
        exclude_from_layer_adaptation: Exclusion = None,
        rescale_grad: float = 1.0,
        lr_in_momentum: bool = True,
        **options: Unpack[FusedOptions],
    ) -> None:
        check_nonnegative(momentum=momentum, weight_decay=weight_decay, lars_coeff=lars_coeff, eps=eps)
        self._exclusions = (exclude_from_weight_decay, exclude_from_layer_adaptation)
        self._match_exclusions()
        defaults = dict(
            lr=lr, momentum=momentum, weight_decay=weight_decay, lars_coeff=lars_coeff, eps=eps,
            rescale_grad=rescale_grad, lr_in_momentum=bool(lr_in_momentum),
        )
        super().__init__(params, defaults, **options)

    _copied_attributes: tuple[str, ...] = (*FusedOptimizer._copied_attributes, "_exclusions")

    def _match_exclusions(self) -> None:
        no_decay, no_adapt = self._exclusions
        self._no_decay = _matcher(no_decay, "exclude_from_weight_decay")
        self._no_adapt = _matcher(no_adapt, "exclude_from_layer_adaptation")
        self._excludes = no_decay is not None or no_adapt is not None

    def _rebuild(self) -> None:
        super()._rebuild()
        self.__dict__.setdefault("_exclusions", (None, None))  # (pickled by a release before 0.4)
        self._match_exclusions()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        if self._excludes and not self.param_groups[-1].get("param_names"):
            raise ValueError("Lars: exclusions need parameter names: build the optimizer from model.named_parameters()")

    def _hypers(self, group: dict[str, Any], bucket: Bucket) -> dict[str, Any]:
        out = super()._hypers(group, bucket)
        if self._excludes:  # per-param lists from the parameter names
            names = bucket.names
            out["weight_decay"] = [0.0 if self._no_decay(n) else group["weight_decay"] for n in names]
            out["layer_adaptation"] = [not self._no_adapt(n) for n in names]
        return out
