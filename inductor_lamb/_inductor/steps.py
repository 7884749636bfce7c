"""Each op family's step in the backend vocabulary (``_inductor/<family>.py``, found by the op's
name): the functions every compile path runs, and the per-family constants of the CUDA launch
model (``cost.py``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ..spec import SPECS

__all__ = ["lowering_module", "step_functions"]


def lowering_module(op: str) -> Any:
    """The module of ``op``'s family's step in the backend vocabulary (``_inductor/<family>.py``):
    its functions are named as the ops' reference functions (:attr:`~inductor_lamb.spec.OpSpec.reference`),
    and its
    ``GROUPED_LAUNCHES`` is what the CUDA launch model reads (``cost.py``)."""
    return importlib.import_module(f"{__package__}.{SPECS[op].family}")


def step_functions() -> dict[str, Callable[..., Any]]:
    """Per op name, ``f(B, a)``: the op's math on backend ``B`` with bound arguments
    ``a``; a reduce op's returns its packed reductions. Layer-wise ops are written
    as two phases, found by their ops' names; their one-call step is reduce then apply."""
    out: dict[str, Callable[..., Any]] = {}
    for spec in SPECS.values():
        module = lowering_module(spec.name)
        if not spec.reduce_op:
            out[spec.name] = getattr(module, spec.reference)
            continue
        reduce = getattr(module, SPECS[spec.reduce_op].reference)
        apply = getattr(module, SPECS[spec.apply_op].reference)
        k = len(spec.reductions)
        if spec.phase == "step":
            out[spec.name] = lambda B, a, reduce=reduce, apply=apply: (apply(B, a, reduce(B, a)) if a.params else None)
        elif spec.phase == "reduce":
            out[spec.name] = lambda B, a, reduce=reduce, k=k: B.pack(reduce(B, a) if a.params else [], B.item(a.lr, 0), k)
        else:
            out[spec.name] = lambda B, a, apply=apply, k=k: (apply(B, a, B.unpack(a.reductions, k)) if a.params
                                                            else None)
    return out
