"""TorchTitan: train with ``Lamb``, ``Lamb16``, ``Lars``, ``Adagrad`` or ``NovoGrad``.

TorchTitan builds its optimizers by name from a fixed table of its ``OptimizersContainer``.
:class:`OptimizersContainer` here is that container with this package's optimizers added to the
table (TorchTitan's own, ``AdamW`` and the rest, still resolve), and :func:`layerwise` builds
its config, as TorchTitan's ``default_adamw`` does for AdamW. In a config module (passed to
TorchTitan's trainer with ``--module``)::

    from inductor_lamb.integrations.torchtitan import layerwise

    def llama3_debugmodel_lamb():
        config = llama3_debugmodel()
        config.optimizer = layerwise("Lamb", lr=4e-3, weight_decay=0.01)
        return config

Every parallelism TorchTitan applies works with exact per-tensor norms: FSDP2, tensor
parallel, both at once (their ``_StridedShard`` layouts), HSDP; distributed checkpoints save and
resume the optimizer state (docs/distributed.md). TorchTitan hands every optimizer its
``implementation`` as ``fused``/``foreach`` group options: this package's optimizers are always
fused, so those two are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.optim import Optimizer
from torchtitan.components import optimizer as _titan

from .. import optim

__all__ = ["OPTIMIZERS", "OptimizersContainer", "layerwise"]

# This package's optimizers, by the names a TorchTitan config uses.
OPTIMIZERS: dict[str, type[Optimizer]] = {cls.__name__: cls for cls in optim.OPTIMIZERS}
_IMPLEMENTATION = ("fused", "foreach")  # (TorchTitan's implementation switches, in every group)


def _factory(cls: type[Optimizer]) -> Callable[..., Optimizer]:
    def build(param_groups: list[dict[str, Any]], **kwargs: Any) -> Optimizer:
        groups = [{k: v for k, v in g.items() if k not in _IMPLEMENTATION} for g in param_groups]
        return cls(groups, **{k: v for k, v in kwargs.items() if k not in _IMPLEMENTATION})

    build.__name__ = build.__qualname__ = cls.__name__
    return build


class OptimizersContainer(_titan.OptimizersContainer):
    """TorchTitan's optimizers container, also building this package's optimizers (``Lamb``,
    ``Lamb16``, ``Lars``, ``Adagrad``, ``NovoGrad``) by name (``ParamGroupConfig.optimizer_name``)."""

    @dataclass(kw_only=True, slots=True)
    class Config(_titan.OptimizersContainer.Config):
        pass

    @staticmethod
    def _resolve_optimizer_factory(name: str) -> Callable[..., Optimizer]:
        if name in OPTIMIZERS:
            return _factory(OPTIMIZERS[name])
        return _titan.OptimizersContainer._resolve_optimizer_factory(name)


def layerwise(name: str = "Lamb", *, pattern: str = r".*", **kwargs: Any) -> OptimizersContainer.Config:
    """A config of one ``name`` optimizer (a key of :data:`OPTIMIZERS`: ``"Lamb"``, ``"NovoGrad"``, ...)
    over the params matching ``pattern`` (all by default), its keyword arguments ``kwargs``
    (``lr`` first of all); what TorchTitan's ``default_adamw`` is for AdamW."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {sorted(OPTIMIZERS)}")
    return OptimizersContainer.Config(param_groups=[
        _titan.ParamGroupConfig(pattern=pattern, optimizer_name=name, optimizer_kwargs=dict(kwargs))])
