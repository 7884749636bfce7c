"""The ``"auto"`` rule on CUDA: the lowering or one call of the CUDA kernel, by a model of
each path's time.

A step's time is modelled as ``launches * LAUNCH_US + bytes / bandwidth``. Both paths move
about the op's floor bytes (the CUDA engine exactly; the lowering's kernels, by Inductor's own
count, within its floor on the BERT-like lists of ``tools/cuda_codegen.py``), so the
bytes cancel and the launches decide. Their counts:

- **the CUDA engine** launches a fixed number of kernels per call whatever the tensor count
  (:func:`engine_launches`: counted by the built module itself, ``torch.ops.lamb._cuda_launches``,
  which runs the op's launchers without launching; a layer-wise step 3, Adagrad 2, LAMB 2 more
  with global grad clipping; one more per pass for each further param dtype a call mixes);
- **the lowering** launches at least a few grouped kernels per call (Inductor's foreach groups
  of the element-wise work: the ``GROUPED_LAUNCHES`` its family's step declares beside its
  lowering, ``_inductor/<family>.py``) plus, for a layer-wise op, the kernels of each tensor's
  own reductions: Inductor (2.14) makes one reduction kernel per tensor and cannot group
  reductions of different sizes (its foreach groups take no reductions), and a tensor that
  Inductor reduces in two stages (a split reduction: above 8192 elements on H100) costs one more
  kernel per reduction column of the op (its spec's ``reductions``).

:func:`lowering_launches` is a lower bound, from what ``tools/cuda_codegen.py`` generates
for an H100 (RESULTS.md, "CUDA code generation"); ``tests/test_cuda_codegen.py`` checks it
against generated code.
With these counts the engine wins every layer-wise call, and ties an Adagrad call, which it
then takes too (its bytes are exactly the floor). The lowering stays the rule on CPU, where
Inductor generates one function for the whole step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..spec import SPECS
from .steps import lowering_module

__all__ = ["LAUNCH_US", "grouped_launches", "engine_launches", "lowering_launches", "prefer_engine"]

# Cost of one kernel launch in the model (host wrapper and device gaps; a CUDA graph replay
# cuts it, for both paths alike): it scales both sides, so it cannot change a decision.
LAUNCH_US = 5.0

def grouped_launches(op: str) -> int:
    """The lowering's fewest grouped launches for one call of ``op``'s one-call step (step counts,
    per-tensor scalars, the element-wise passes as foreach groups of up to ~250 kernel arguments
    each; more tensors per call take more): its family's ``GROUPED_LAUNCHES``."""
    return int(lowering_module(op).GROUPED_LAUNCHES)


def engine_launches(op: str, max_grad_norm: float = 0.0) -> int:
    """Launches of one call of ``op``'s CUDA kernel (any ``torch.ops.lamb`` op name, phases
    included), as the module's launchers count them (the clip's kernels where the op clips by
    ``max_grad_norm > 0``); a CUDA build only."""
    return torch.ops.lamb._cuda_launches(op, max_grad_norm > 0)


def lowering_launches(op: str, numels: Sequence[int], splits: Callable[[int], bool]) -> int:
    """The fewest launches the lowering of one call of ``op`` on tensors of ``numels`` elements
    makes; ``splits(n)``: whether Inductor reduces n elements in two stages."""
    if not numels:
        return 0
    finals = len(SPECS[op].reductions)  # (second stages of a split reduction, one per column)
    per_tensor = sum(1 + (finals if splits(n) else 0) for n in numels) if finals else 0
    return grouped_launches(op) + per_tensor


def prefer_engine(op: str, numels: Sequence[int], splits: Callable[[int], bool], max_grad_norm: float = 0.0) -> bool:
    """Whether one call of the CUDA kernel is the faster path for this call (the model above;
    a tie goes to the engine, whose bytes are exactly the floor)."""
    engine = engine_launches(op, max_grad_norm) * LAUNCH_US
    lowered = lowering_launches(op, numels, splits) * LAUNCH_US
    return engine <= lowered
