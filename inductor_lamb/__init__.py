"""Layer-wise adaptive optimizers (LAMB, LAMB16, LARS, NovoGrad, Adagrad) as ``torch.ops.lamb.*``
custom ops with fused CPU kernels, fake implementations for ``torch.compile``,
and drop-in ``torch.optim.Optimizer`` classes.
"""

from __future__ import annotations

import torch

from ._build import load_extension

_C = load_extension()  # registers torch.ops.lamb.*; a clear error if built for another torch
from . import ops, reference  # noqa: E402
from ._inductor import compile_path, set_compile_path
from ._inductor import install as _install_compile_path
from .fuse import fuse_optimizer, mark_layerwise
from .optim import Adagrad, Lamb, Lamb16, Lars, NovoGrad
from .optim._in_backward import StepInBackward, step_in_backward

__version__ = "0.3.0"

__all__ = ["Adagrad", "Lamb", "Lamb16", "Lars", "NovoGrad", "StepInBackward", "fuse_optimizer", "mark_layerwise", "ops",
           "reference", "step_in_backward",
           "cpu_capability", "set_cpu_capability", "compile_path", "set_compile_path"]

_CAPABILITIES = ("default", "avx2", "avx512")


def cpu_capability() -> str:
    """The instruction set the CPU kernels use now: ``"default"``, ``"avx2"`` or ``"avx512"``."""
    return _CAPABILITIES[torch.ops.lamb._cpu_capability(-1)]


def set_cpu_capability(name: str) -> None:
    """Forces the CPU kernels onto ``name`` (at most what this CPU supports).

    The environment variable ``INDUCTOR_LAMB_CPU_CAPABILITY`` sets the initial
    choice the same way. Meant for tests and debugging.
    """
    if name not in _CAPABILITIES:
        raise ValueError(f"unknown CPU capability {name!r}; expected one of {_CAPABILITIES}")
    best = torch.ops.lamb._max_cpu_capability()
    if _CAPABILITIES.index(name) > best:
        raise ValueError(f"CPU capability {name!r} is not supported here (best: {_CAPABILITIES[best]!r})")
    torch.ops.lamb._cpu_capability(_CAPABILITIES.index(name))


_install_compile_path()  # (records the paths; Inductor is imported when compiling first needs it)
