"""timm: build this package's optimizers by name with ``timm.optim.create_optimizer_v2``.

    import timm, inductor_lamb.integrations.timm as il_timm

    il_timm.register()  # once; adds the names below to timm's optimizer registry
    opt = timm.optim.create_optimizer_v2(model, "inductorlamb", lr=2e-3, weight_decay=0.05)

Each name is registered with an optimizer class, as timm's own names are
(``get_optimizer_class``, ``get_optimizer_info``, ``list_optimizers`` and ``create_optimizer_v2``
work alike), and where timm has a twin the class takes that twin's constructor, defaults and
equations, so that switching ``--opt lamb`` to ``--opt inductorlamb`` changes the speed, not the
training. The optimizers come with timm's conventions: no weight decay on biases and norm weights
(one-dimensional params, and the model's ``no_weight_decay()``), ``layer_decay`` groups. Names
(timm takes an optimizer's name from the text after the last underscore, so they have none):

- ``inductorlamb`` = timm's ``lamb`` (:class:`TimmLamb`: timm's ``Lamb`` constructor; gradients
  clipped by the global norm of all param groups at ``max_grad_norm=1.0`` by default, ``None``
  disables it), ``inductorlambc`` = timm's ``lambc`` (the same with ``trust_clip=True``);
- ``inductorlars`` = timm's ``lars`` (:class:`TimmLars`: timm's ``Lars`` constructor, defaults
  ``lr=1.0``, ``eps=1e-8``, no weight decay; torch SGD's momentum, where the lr scales each
  step, so lr 0 moves nothing: ``Lars(lr_in_momentum=False)``);
- ``inductornovograd`` = timm's ``novograd`` (:class:`TimmNovoGrad`: ``NvNovoGrad``'s
  constructor and equations, ``amsgrad``, ``decoupled_decay`` and ``corrected_weight_decay``
  too);
- ``inductorlamb16`` (:class:`~inductor_lamb.Lamb16`, which has no timm twin);
- ``inductoradagrad`` (:class:`~inductor_lamb.Adagrad`, ``torch.optim.Adagrad``'s constructor and
  equations, which timm's ``adagrad`` is).

What cannot match timm is refused with a ``ValueError`` rather than ignored: ``caution``
(LAMB); ``nesterov``, ``dampening``,
``trust_clip`` and ``always_adapt`` (LARS; timm's ``larc``, ``nlars``, ``nlarc`` have no twin
here). timm's ``foreach`` switch is accepted and changes nothing: these always step fused.
``register(fusedlamb=True)`` also makes timm's ``fusedlamb``, which needs NVIDIA apex, build
:class:`TimmLamb` (apex FusedLAMB's equations; it clips by the norm of all groups too).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from timm.optim._optim_factory import OptimInfo, OptimizerRegistry, default_registry
from torch import Tensor
from typing_extensions import Unpack

from .. import Adagrad, Lamb, Lamb16, Lars, NovoGrad
from ..optim._base import FusedOptions

__all__ = ["NAMES", "TimmLamb", "TimmLars", "TimmLamb16", "TimmAdagrad", "TimmNovoGrad", "register"]


def _refuse(who: str, **options: tuple[Any, Any]) -> None:
    """Raises for an option given a value other than the one this package implements."""
    for key, (value, inert) in options.items():
        if value != inert:
            raise ValueError(f"{who} (inductor_lamb) has no {key!r} option; leave it at {inert!r}")


class TimmLamb(Lamb):
    """:class:`~inductor_lamb.Lamb` with the constructor and defaults of timm's ``Lamb`` (the
    ``inductorlamb`` and ``inductorlambc`` names): ``max_grad_norm=1.0`` clips by the norm of
    the grads of every param group together (``None``: no clipping), as timm's and apex's do;
    ``decoupled_decay`` and ``corrected_weight_decay`` as timm's."""

    _clip_spans_groups = True

    def __init__(self, params: Iterable[Any], lr: float | Tensor = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.01,
                 grad_averaging: bool = True, max_grad_norm: float | None = 1.0, trust_clip: bool = False,
                 always_adapt: bool = False, caution: bool = False, decoupled_decay: bool = False,
                 corrected_weight_decay: bool = False, foreach: bool | None = None, max_lr: float = 0.0,
                 max_lr_snapshot: float | None = None,
                 **options: Unpack[FusedOptions]) -> None:
        _refuse("inductorlamb", caution=(caution, False))
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         bias_correction=bias_correction, grad_averaging=grad_averaging, always_adapt=always_adapt,
                         trust_clip=trust_clip, max_grad_norm=0.0 if max_grad_norm is None else max_grad_norm,
                         decoupled_decay=decoupled_decay,
                         corrected_weight_decay=corrected_weight_decay and decoupled_decay, max_lr=max_lr,
                         max_lr_snapshot=max_lr_snapshot, **options)


class TimmLars(Lars):
    """:class:`~inductor_lamb.Lars` with the constructor, defaults and momentum of timm's
    ``Lars`` (the ``inductorlars`` name): ``trust_coeff`` is ``lars_coeff``, and the lr scales
    each step outside the momentum (``lr_in_momentum=False``), as in torch's SGD."""

    def __init__(self, params: Iterable[Any], lr: float | Tensor = 1.0, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 trust_coeff: float = 0.001, eps: float = 1e-8, trust_clip: bool = False, always_adapt: bool = False,
                 foreach: bool | None = None, **options: Unpack[FusedOptions]) -> None:
        _refuse("inductorlars", dampening=(dampening, 0.0), nesterov=(nesterov, False),
                trust_clip=(trust_clip, False), always_adapt=(always_adapt, False))
        super().__init__(params, lr=lr, momentum=momentum, weight_decay=weight_decay, lars_coeff=trust_coeff, eps=eps,
                         lr_in_momentum=False, **options)


class TimmLamb16(Lamb16):
    """:class:`~inductor_lamb.Lamb16` taking timm's ``foreach`` switch (the ``inductorlamb16``
    name)."""

    def __init__(self, params: Iterable[Any], lr: float | Tensor = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, trust_scale: float = 0.382,
                 foreach: bool | None = None, **options: Unpack[FusedOptions]) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, trust_scale=trust_scale,
                         **options)


class TimmAdagrad(Adagrad):
    """:class:`~inductor_lamb.Adagrad` with ``torch.optim.Adagrad``'s constructor, which timm's
    ``adagrad`` is (the ``inductoradagrad`` name)."""

    def __init__(self, params: Iterable[Any], lr: float | Tensor = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0, eps: float = 1e-10,
                 foreach: bool | None = None, *, maximize: bool = False, differentiable: bool = False,
                 fused: bool | None = None, **options: Unpack[FusedOptions]) -> None:
        _refuse("inductoradagrad", differentiable=(differentiable, False))
        super().__init__(params, lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                         initial_accumulator_value=initial_accumulator_value, eps=eps, maximize=maximize, **options)


class TimmNovoGrad(NovoGrad):
    """:class:`~inductor_lamb.NovoGrad` with the constructor of timm's ``NvNovoGrad`` (the
    ``inductornovograd`` name), taking timm's ``foreach`` switch."""

    def __init__(self, params: Iterable[Any], lr: float | Tensor = 1e-3, betas: tuple[float, float] = (0.95, 0.98),
                 eps: float = 1e-8, weight_decay: float = 0.0, grad_averaging: bool = False, amsgrad: bool = False,
                 decoupled_decay: bool = False, corrected_weight_decay: bool = False, foreach: bool | None = None,
                 max_lr: float = 0.0, max_lr_snapshot: float | None = None,
                 **options: Unpack[FusedOptions]) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, grad_averaging=grad_averaging,
                         amsgrad=amsgrad, decoupled_decay=decoupled_decay,
                         corrected_weight_decay=corrected_weight_decay and decoupled_decay, max_lr=max_lr,
                         max_lr_snapshot=max_lr_snapshot, **options)


# name -> (class, description, timm's argument flags, registry defaults)
NAMES: dict[str, tuple[type, str, dict[str, bool], dict[str, Any] | None]] = {
    "inductorlamb": (TimmLamb, "timm's lamb as fused custom ops (inductor_lamb)", {"has_betas": True, "has_eps": True},
                     None),
    "inductorlambc": (TimmLamb, "timm's lambc (trust ratio clipping) as fused custom ops (inductor_lamb)",
                      {"has_betas": True, "has_eps": True}, {"trust_clip": True}),
    "inductorlamb16": (TimmLamb16, "LAMB with float8 moments, 2 bytes of state a param (inductor_lamb.Lamb16)",
                       {"has_betas": True, "has_eps": True}, None),
    "inductorlars": (TimmLars, "timm's lars as fused custom ops (inductor_lamb)", {"has_momentum": True, "has_eps": True},
                     None),
    "inductoradagrad": (TimmAdagrad, "Adagrad as fused custom ops (inductor_lamb.Adagrad)", {"has_eps": True}, None),
    "inductornovograd": (TimmNovoGrad, "timm's novograd (NvNovoGrad) as fused custom ops (inductor_lamb)",
                         {"has_betas": True}, None),
}


def register(registry: OptimizerRegistry | None = None, *, fusedlamb: bool = False) -> None:
    """Adds :data:`NAMES` to timm's optimizer registry (``registry``: timm's default one, which
    ``create_optimizer_v2`` reads); with ``fusedlamb``, timm's apex-backed ``fusedlamb`` builds
    :class:`TimmLamb` instead. Registering again replaces the same entries."""
    registry = default_registry if registry is None else registry
    for name, (cls, description, flags, defaults) in NAMES.items():
        registry.register(OptimInfo(name=name, opt_class=cls, description=description, defaults=defaults, **flags))
    if fusedlamb:
        registry.register(OptimInfo(name="fusedlamb", opt_class=TimmLamb, has_betas=True, has_eps=True,
                                    description="LAMB (inductor_lamb's, in place of apex's FusedLAMB)"))
