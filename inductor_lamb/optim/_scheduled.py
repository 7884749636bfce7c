"""Scheduled hyper-parameters (lr, betas, momentum): their validators (torch.optim's
messages) and :class:`ScheduledValues`, the 0-d tensors of one param group that
schedulers write and a compiled step reads without recompiling."""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .. import _private

__all__ = ["static_address", "as_lr_tensor", "check_lr", "check_betas", "check_momentum", "check_nonnegative", "ScheduledValues",
           "group_with_floats", "as_floats", "group_device", "group_dtype", "follows"]


def static_address(t: Any) -> Any:
    """Marks tensor ``t`` as living at one address for as long as it exists (what
    ``torch._dynamo.mark_static_address(t)`` does, without importing Dynamo into every eager
    process): a compiled step then takes it as a static input, which CUDA graphs need of
    every tensor the step writes (moments, step counts, master copies) and read every replay
    (lr, betas, momentum) without a copy. A tensor replaced later (``load_state_dict``) is
    marked in its turn; Inductor's CUDA graph trees re-record for a new address (a graph captured
    by hand must be captured again: docs/compile.md)."""
    return _private.mark_static_address(t)


def as_lr_tensor(lr: float | Tensor, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Tensor:
    """``lr`` as a 0-d tensor on ``device`` (float32, what the ops take; float64 for
    float64 params): schedulers then update it in place (``fill_``), so a changing
    learning rate never recompiles a graph, and on a GPU the kernels read it there
    (no host sync, CUDA-graph capturable)."""
    device = torch.device(device)
    if isinstance(lr, Tensor):
        if lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")  # torch.optim's message
        if lr.dim() == 0 and lr.dtype == dtype and lr.device == device:
            return lr
        return lr.detach().reshape(()).to(device=device, dtype=dtype)
    lr = float(lr)
    check_lr(lr)
    return torch.tensor(lr, dtype=dtype, device=device)


def check_lr(lr: float) -> None:
    if not lr >= 0.0:
        raise ValueError(f"Invalid learning rate: {lr}")


def check_betas(betas: tuple[float, float]) -> None:
    """torch.optim's check and message for Adam-style betas."""
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")


def check_momentum(momentum: float) -> None:
    if not momentum >= 0.0:
        raise ValueError(f"Invalid momentum value: {momentum}")


def check_nonnegative(**values: float) -> None:
    """Raises torch.optim's ``Invalid <name> value`` for a negative hyper-parameter."""
    names = {"eps": "epsilon"}
    for name, value in values.items():
        if not 0.0 <= value:
            raise ValueError(f"Invalid {names.get(name, name)} value: {value}")


def decoupled_decay_options(lr: Any, decoupled_decay: bool, corrected_weight_decay: bool,
                            max_lr: float = 0.0) -> dict[str, Any]:
    """The group entries of decoupled weight decay (``p *= 1 - s weight_decay`` before the update,
    ``s = lr``): ``decoupled_decay``, ``corrected_weight_decay`` and ``max_lr``, the peak lr of
    timm's corrected weight decay (``s = lr^2 / max_lr``: the decay follows the lr schedule
    squared): ``max_lr`` if given, else the constructor's lr; 0 (uncorrected) without it. (All
    three are constructor arguments: torch's ZeroRedundancyOptimizer rebuilds an optimizer from
    its defaults.)"""
    if not corrected_weight_decay:
        return dict(decoupled_decay=bool(decoupled_decay), corrected_weight_decay=False, max_lr=0.0)
    if not decoupled_decay:
        raise ValueError("corrected_weight_decay=True needs decoupled_decay=True (it scales the decoupled decay)")
    peak = float(max_lr) or float(lr)
    if not peak > 0.0:
        raise ValueError(f"corrected_weight_decay=True needs a positive lr (the peak lr), got {peak}")
    return dict(decoupled_decay=True, corrected_weight_decay=True, max_lr=peak)


def check_seed(seed: Any) -> int:
    """The seed of a stochastic rounding's random bits: any int64."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not -(2**63) <= seed < 2**63:
        raise ValueError(f"Invalid seed: {seed!r} (expected an int64)")
    return seed


class ScheduledValues:
    """The 0-d tensors of one param group's scheduled hyper-parameters.

    torch's schedulers write ``group["betas"] = (0.85, ...)`` or
    ``group["momentum"] = 0.9`` as new Python floats (they ``fill_`` in place only
    for ``lr``). A compiled step that read those floats would be guarded on their
    values and recompile on every step. So each group's values live in tensors
    that :meth:`sync` fills from whatever was written (validated first) and puts
    back into the group, before anything reads the group
    (``FusedOptimizer.param_groups`` is a property that syncs). The group dicts
    stay plain dicts (dynamo's optimizer support requires that).

    A tensor the user gives (``lr=torch.tensor(0.01)``, in the constructor or written into a
    group) is the value itself, as in torch.optim: it stays in the group (``group["lr"] is
    lr``), shared by the groups that take it as their default, and changing it in place
    changes the lr of the next step, eager or compiled. A float written over it afterwards
    gives the group a tensor of its own again (the user's is never written).
    """

    def __init__(self, group: dict[str, Any], scheduled: Mapping[str, Callable[[Any], None]], device: torch.device,
                 defaults: dict[str, Any], dtype: torch.dtype = torch.float32) -> None:
        self.scheduled, self.device, self.dtype = scheduled, device, dtype
        self.values: dict[str, Any] = {}  # key -> the group's tensor, or a tuple of them (betas)
        self.owned: list[Tensor] = []  # the tensors this group made (and may fill)
        for key, validate in scheduled.items():
            if key not in group:
                continue
            value = group[key]
            validate(as_floats(value))
            if isinstance(value, (tuple, list)):
                self.values[key] = tuple(self._assign(None, v) for v in value)
            else:
                self.values[key] = self._assign(None, value)
            group[key] = self.values[key]

    def sync(self, group: dict[str, Any]) -> None:
        for key, current in self.values.items():
            value: Any = group.get(key)
            if value is current:
                continue
            self.scheduled[key](as_floats(value))  # (raises for a missing or bad value)
            if isinstance(current, tuple):
                current = tuple(self._assign(c, v) for c, v in zip(current, value))
            else:
                current = self._assign(current, value)
            self.values[key] = group[key] = current

    def _assign(self, current: Tensor | None, value: Any) -> Tensor:
        """The group's tensor for ``value``: a user's tensor itself, or a float filled into
        the group's own tensor (a new one where the current value is not the group's)."""
        if value is current:
            return current
        if isinstance(value, Tensor):
            if value.numel() != 1:
                raise ValueError("Tensor lr must be 1-element")  # torch.optim's message
            return static_address(value)
        if current is not None and any(current is t for t in self.owned):
            current.fill_(float(value))
            return current
        own = static_address(as_lr_tensor(float(value), self.device, self.dtype).clone())
        self.owned.append(own)
        return own


def follows(value: Tensor, device: torch.device) -> bool:
    """Whether a scheduled tensor is what the ops take as it is (0-d float32 on the params'
    device), so that a call prepared with it reads its value at every step."""
    return value.dim() == 0 and value.dtype == torch.float32 and value.device == device


def group_with_floats(group: dict[str, Any], keys) -> dict[str, Any]:
    """The group with its scheduled 0-d tensors as Python floats (state_dict, repr)."""
    return {k: (as_floats(v) if k in keys else v) for k, v in group.items()}


def as_floats(value: Any) -> Any:
    """A scheduled value (float, 0-d tensor, or a tuple of them) as Python floats.
    For display, validation and checkpoints only: never called inside a step."""
    if isinstance(value, (tuple, list)):
        return tuple(as_floats(v) for v in value)
    if not isinstance(value, Tensor):
        return float(value)
    # the shortest decimal that reads back as the same float32 (0.9, not 0.8999999761581421)
    x = float(value)
    for digits in range(6, 10):
        short = float(f"{x:.{digits}g}")
        if struct.unpack("f", struct.pack("f", short))[0] == x:
            return short
    return x


def group_device(group: dict[str, Any]) -> torch.device:
    """Where a group's lr lives: its params' device when they share one, else the CPU."""
    devices = {p.device for p in group["params"]}
    return devices.pop() if len(devices) == 1 else torch.device("cpu")


def group_dtype(group: dict[str, Any]) -> torch.dtype:
    """The dtype of a group's scheduled values: float64 when all its params are
    float64 (their float64 math then reads lr at full precision), else float32."""
    params = group["params"]
    return torch.float64 if params and all(p.dtype == torch.float64 for p in params) else torch.float32
