"""Typed wrappers of ``torch.ops.lamb.*`` and their fake implementations, both
derived from the op descriptions in :mod:`inductor_lamb.spec`.

Wrappers take the tensor lists positionally and every hyper-parameter by
keyword (``lamb_step_(params, grads, m, v, steps, lr=lr, beta1=0.9)``); Python
floats of scheduled hyper-parameters (``lr``, ``beta1``, ``beta2``,
``momentum``) become 0-d float32 tensors on the params' device.

Every op updates lists in place and returns nothing, so a fake implementation
allocates nothing: it runs the kernels' argument checks (:func:`spec.check`),
so every compile path rejects a bad call at trace time with the eager error,
before any tensor is touched.
"""

from __future__ import annotations

from typing import Any

import torch

from .spec import SPECS, check

__all__ = ["lamb_step_", "lamb16_step_", "lars_step_", "adagrad_step_"]

lamb_step_ = SPECS["lamb_step_"].wrapper()
lamb16_step_ = SPECS["lamb16_step_"].wrapper()
lars_step_ = SPECS["lars_step_"].wrapper()
adagrad_step_ = SPECS["adagrad_step_"].wrapper()
for _f in (lamb_step_, lamb16_step_, lars_step_, adagrad_step_):
    _f.__module__ = __name__


def _register_fakes() -> None:
    for name, spec in SPECS.items():

        def fake(*args: Any, _spec=spec, **kwargs: Any) -> None:
            check(_spec, _spec.bind(args, kwargs))

        torch.library.register_fake(f"lamb::{name}")(fake)


_register_fakes()
