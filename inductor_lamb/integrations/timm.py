"""timm: build this package's optimizers by name with ``timm.optim.create_optimizer_v2``.

    import timm, inductor_lamb.integrations.timm as il_timm

    il_timm.register()  # once; adds the names below to timm's optimizer registry
    opt = timm.optim.create_optimizer_v2(model, "inductorlamb", lr=2e-3, weight_decay=0.05)

The optimizers then come with timm's conventions: no weight decay on biases and norm weights
(one-dimensional params, and the model's ``no_weight_decay()``), ``layer_decay`` groups, timm's
option names. Registered names (timm takes an optimizer's name from the text after the last
underscore, so they have none):

- ``inductorlamb`` (:class:`~inductor_lamb.Lamb`; timm's ``lamb`` options ``bias_correction``,
  ``grad_averaging``, ``trust_clip``, ``always_adapt``, ``max_grad_norm``, where ``None``
  disables clipping), ``inductorlambc`` (with ``trust_clip``, timm's ``lambc``);
- ``inductorlamb16`` (:class:`~inductor_lamb.Lamb16`);
- ``inductorlars`` (:class:`~inductor_lamb.Lars`; timm's ``trust_coeff`` is its ``lars_coeff``);
- ``inductoradagrad`` (:class:`~inductor_lamb.Adagrad`).

``register(fusedlamb=True)`` also makes timm's ``fusedlamb``, which needs NVIDIA apex, build
:class:`~inductor_lamb.Lamb` (apex FusedLAMB's equations, ``max_grad_norm=1.0`` as its default;
the clip is by the norm of each param group's grads, not of all groups). Options this package
does not have (timm's ``caution``, ``decoupled_decay``, LARS's ``nesterov``, ``dampening``,
``trust_clip``, ``always_adapt``) raise a ``ValueError`` rather than being ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from timm.optim._optim_factory import OptimInfo, OptimizerRegistry, default_registry
from torch.optim import Optimizer

from .. import Adagrad, Lamb, Lamb16, Lars

__all__ = ["NAMES", "register"]

_IMPLEMENTATION = ("foreach", "fused")  # (timm's implementation switches: these are always fused)


def _refuse(who: str, kwargs: dict[str, Any], unsupported: dict[str, Any]) -> None:
    for key, inert in unsupported.items():
        if key in kwargs and kwargs.pop(key) != inert:
            raise ValueError(f"{who} (inductor_lamb) has no {key!r} option; leave it at {inert!r}")


def _lamb(params: Any, **kwargs: Any) -> Optimizer:
    for key in _IMPLEMENTATION:
        kwargs.pop(key, None)
    _refuse("inductorlamb", kwargs, {"caution": False, "decoupled_decay": False, "corrected_weight_decay": False})
    if "max_grad_norm" in kwargs and kwargs["max_grad_norm"] is None:  # (timm: None disables clipping)
        kwargs["max_grad_norm"] = 0.0
    return Lamb(params, **kwargs)


def _lamb16(params: Any, **kwargs: Any) -> Optimizer:
    for key in _IMPLEMENTATION:
        kwargs.pop(key, None)
    return Lamb16(params, **kwargs)


def _lars(params: Any, **kwargs: Any) -> Optimizer:
    for key in _IMPLEMENTATION:
        kwargs.pop(key, None)
    _refuse("inductorlars", kwargs, {"nesterov": False, "dampening": 0, "trust_clip": False, "always_adapt": False})
    if "trust_coeff" in kwargs:
        kwargs["lars_coeff"] = kwargs.pop("trust_coeff")
    return Lars(params, **kwargs)


def _adagrad(params: Any, **kwargs: Any) -> Optimizer:
    for key in _IMPLEMENTATION:
        kwargs.pop(key, None)
    return Adagrad(params, **kwargs)


# name -> (factory, description, timm's argument flags, defaults)
NAMES: dict[str, tuple[Callable[..., Optimizer], str, dict[str, bool], dict[str, Any] | None]] = {
    "inductorlamb": (_lamb, "LAMB as fused custom ops (inductor_lamb.Lamb)", {"has_betas": True}, None),
    "inductorlambc": (_lamb, "inductorlamb with trust ratio clipping", {"has_betas": True}, {"trust_clip": True}),
    "inductorlamb16": (_lamb16, "LAMB with float8 moments, 2 bytes of state a param (inductor_lamb.Lamb16)",
                       {"has_betas": True}, None),
    "inductorlars": (_lars, "LARS as fused custom ops (inductor_lamb.Lars)", {"has_momentum": True}, None),
    "inductoradagrad": (_adagrad, "Adagrad as fused custom ops (inductor_lamb.Adagrad)", {}, None),
}


def register(registry: OptimizerRegistry | None = None, *, fusedlamb: bool = False) -> None:
    """Adds :data:`NAMES` to timm's optimizer registry (``registry``: timm's default one, which
    ``create_optimizer_v2`` reads); with ``fusedlamb``, timm's apex-backed ``fusedlamb`` builds
    this package's ``Lamb`` instead. Registering again replaces the same entries."""
    registry = default_registry if registry is None else registry
    for name, (factory, description, flags, defaults) in NAMES.items():
        registry.register(OptimInfo(name=name, opt_class=factory, description=description, defaults=defaults,
                                    **flags))
    if fusedlamb:
        registry.register(OptimInfo(name="fusedlamb", opt_class=_lamb, has_betas=True,
                                    description="LAMB (inductor_lamb.Lamb, in place of apex's FusedLAMB)",
                                    defaults={"max_grad_norm": 1.0}))
