"""Scheduled hyper-parameters (lr, betas, momentum): their validators (torch.optim's
messages) and :class:`ScheduledValues`, the 0-d tensors of one param group that
schedulers write and a compiled step reads without recompiling."""

from __future__ import annotations

import numbers
import struct
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .. import _private

__all__ = ["static_address", "as_lr_tensor", "check_lr", "check_betas", "check_momentum", "check_nonnegative", "ScheduledValues",
           "op_value", "scheduled_number", "renamed_group_keys", "group_with_floats", "as_floats", "group_device", "group_dtype", "follows"]


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
                            max_lr: float = 0.0, max_lr_snapshot: float | None = None) -> dict[str, Any]:
    """The group entries of decoupled weight decay (``p *= 1 - s weight_decay`` before the update,
    ``s = lr``): ``decoupled_decay``, ``corrected_weight_decay`` and ``max_lr_snapshot``, the
    peak lr of timm's corrected weight decay (``s = lr^2 / max_lr``: the decay follows the lr
    schedule squared): ``max_lr`` if given, else the constructor's lr; 0 (uncorrected) without it.
    The group key is timm's, not ``max_lr``, which torch's ``OneCycleLR`` writes into every
    group. All three are constructor arguments (``max_lr_snapshot`` as the group key's name for
    ``max_lr``): torch's ZeroRedundancyOptimizer rebuilds an optimizer from its defaults."""
    if max_lr_snapshot is not None:
        if max_lr and float(max_lr) != float(max_lr_snapshot):
            raise ValueError(f"max_lr={max_lr} and max_lr_snapshot={max_lr_snapshot} (the same option) differ")
        max_lr = max_lr_snapshot
    if not corrected_weight_decay:
        return dict(decoupled_decay=bool(decoupled_decay), corrected_weight_decay=False, max_lr_snapshot=0.0)
    if not decoupled_decay:
        raise ValueError("corrected_weight_decay=True needs decoupled_decay=True (it scales the decoupled decay)")
    peak = float(max_lr) or float(lr)
    if not peak > 0.0:
        raise ValueError(f"corrected_weight_decay=True needs a positive lr (the peak lr), got {peak}")
    return dict(decoupled_decay=True, corrected_weight_decay=True, max_lr_snapshot=peak)


def renamed_group_keys(group: dict[str, Any]) -> None:
    """A param group saved before the peak lr of the corrected decay was ``max_lr_snapshot``
    (it was ``max_lr``), in place: the value moves to the new key; ``max_lr`` stays only where
    ``OneCycleLR`` wrote it (with its ``min_lr``), whose schedule still reads it."""
    if "max_lr_snapshot" in group or "max_lr" not in group or "corrected_weight_decay" not in group:
        return
    peak = group["max_lr"] if "min_lr" in group else group.pop("max_lr")
    group["max_lr_snapshot"] = float(peak) if group["corrected_weight_decay"] else 0.0


def check_seed(seed: Any) -> int:
    """The seed of a stochastic rounding's random bits: any int64."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not -(2**63) <= seed < 2**63:
        raise ValueError(f"Invalid seed: {seed!r} (expected an int64)")
    return seed


class ScheduledValues:
    """What the ops take of one param group: its scheduled hyper-parameters (lr, betas,
    momentum) as 0-d tensors, and its other op arguments as the Python types of the op's schema.

    torch's schedulers write ``group["betas"] = (0.85, ...)`` or ``group["momentum"] = 0.9``
    as new Python floats (they ``fill_`` in place only a tensor ``lr``). A compiled step that read
    those floats would be guarded on their values and recompile on every step: Dynamo realizes
    every entry of ``param_groups`` (with a value guard on each float) whenever a traced step
    reads the attribute or calls ``_init_group``. So :meth:`sync` fills each group's 0-d tensor
    (:attr:`values`) from whatever was written (validated first) and puts it back into the
    group. A tensor the user gives (``lr=torch.tensor(0.01)``) is the value itself, as in
    torch.optim: it stays in the group (``group["lr"] is lr``), and changing it in place changes
    the lr of the next step, eager or compiled.

    Every other op argument in the group (``eps``, ``weight_decay``, the bool options, ...) is checked
    by :meth:`sync` too and, where it is another type that torch.optim takes for it (an int, a
    numpy scalar, a one-element tensor), written back as the schema's Python type, so no op ever
    gets a value of the wrong type; anything else raises a ``TypeError`` that names the
    optimizer, the group index and the key (:func:`op_value`). ``param_groups`` syncs on every
    read, and Dynamo's guards read it too, so a compiled step always sees synced values.
    """

    def __init__(self, group: dict[str, Any], scheduled: Mapping[str, Callable[[Any], None]], device: torch.device,
                 defaults: dict[str, Any], dtype: torch.dtype = torch.float32,
                 others: Mapping[str, Any] | None = None, where: str = "param group") -> None:
        self.scheduled, self.device, self.dtype = scheduled, device, dtype
        self.others = dict(others or {})  # group key -> the op's Role for it (checked and converted)
        self.values: dict[str, Any] = {}  # key -> the op's tensor, or a tuple of them (betas)
        self.seen: dict[str, Any] = {}    # key -> the group's value those tensors were made from
        self.owned: list[Tensor] = []     # the tensors this group made (and may fill)
        self.refused: Exception | None = None  # what the last lenient sync could not take
        if not _PLAIN:
            _role_names()
        for key in scheduled:
            if key in group:
                self._take(group, key, group[key], where)
        self._convert_others(group, where)

    def sync(self, group: dict[str, Any], where: str = "param group", strict: bool = True) -> None:
        """Takes what was written into ``group`` since the last sync. ``strict=False`` (a read of
        ``param_groups``, which must not fail: the user may be about to correct the value) leaves
        a bad value to the step's strict sync, which raises."""
        self.refused = None
        for key, seen in list(self.seen.items()):
            value: Any = group.get(key)
            if value is not seen or isinstance(value, list):  # (a list may have changed in place)
                try:
                    self._take(group, key, value, where)
                except (TypeError, ValueError) as e:
                    if strict:
                        raise
                    self.refused = e
        self._convert_others(group, where, strict)

    def check(self, group: dict[str, Any], where: str = "param group") -> None:
        """The strict sync's checks without writing (a traced step: ``group`` as its guards saw
        it; tensor values are data, unchecked). The scheduled values are not read (a compiled
        step would guard on a float's value): what the last sync refused is raised."""
        if self.refused is not None:
            raise type(self.refused)(str(self.refused))
        for key, role in self.others.items():
            value = group.get(key, _ABSENT)
            if value is not _ABSENT and type(value) not in _PLAIN[role]:
                op_value(value, role, f"{where}[{key!r}]")

    def _take(self, group: dict[str, Any], key: str, value: Any, where: str) -> None:
        """The op's tensors for ``value`` written into the group at ``key`` (validated first)."""
        self._validate(key, value, where)
        current = self.values.get(key)
        if isinstance(value, (tuple, list)):
            if not isinstance(current, tuple) or len(value) != len(current):
                current = (None,) * len(value)
            tensors: Any = tuple(self._assign(c, v) for c, v in zip(current, value))
        else:
            tensors = self._assign(current if isinstance(current, Tensor) else None, value)
        # (put back into the group: a float left there would be guarded by value in a compiled
        # step, which recompiles when it changes: docs/decisions.md, "Group values as written")
        self.values[key] = self.seen[key] = group[key] = tensors

    def _validate(self, key: str, value: Any, where: str) -> None:
        """Raises, naming ``where`` and ``key``, unless ``value`` is what torch.optim takes for
        the scheduled ``key``: a number or a 1-element tensor, or a pair of them for ``betas``
        (tensor values are data: only floats are range-checked)."""
        at = f"{where}[{key!r}]"
        known = self.values.get(key)
        pair = isinstance(known, tuple) if key in self.values else isinstance(value, (tuple, list))
        if pair != isinstance(value, (tuple, list)) or (pair and known is not None and len(value) != len(known)):
            raise TypeError(f"{at} must be " + (f"a tuple of {len(known or value)} numbers" if pair
                                                  else "a number or a 1-element tensor") + f", got {_describe(value)}")
        for v in value if pair else (value,):
            scheduled_number(v, at)
        if not all(isinstance(v, Tensor) for v in (value if pair else (value,))):
            try:
                self.scheduled[key](as_floats(value))
            except ValueError as e:
                raise ValueError(f"{at}: {e}") from None

    def _convert_others(self, group: dict[str, Any], where: str, strict: bool = True) -> None:
        for key, role in self.others.items():
            value = group.get(key, _ABSENT)
            if value is _ABSENT or type(value) in _PLAIN[role]:
                continue
            try:
                group[key] = op_value(value, role, f"{where}[{key!r}]")
            except TypeError as e:
                if strict:
                    raise
                self.refused = e

    def _assign(self, current: Tensor | None, value: Any) -> Tensor:
        """The op's tensor for ``value``: a user's tensor itself, or a float filled into the
        group's own tensor (a new one where the current value is not the group's)."""
        if isinstance(value, Tensor):
            return static_address(value)
        if current is not None and any(current is t for t in self.owned):
            current.fill_(float(value))
            return current
        own = static_address(as_lr_tensor(float(value), self.device, self.dtype).clone())
        self.owned.append(own)
        return own


_ABSENT = object()
# The Python types an op argument of each role takes as it is (anything else is converted or refused)
_PLAIN: dict[Any, tuple[type, ...]] = {}


def _role_names() -> None:
    from ..spec import Role  # (spec imports the compiled ops: not at module import)

    _PLAIN.update({Role.FLOAT: (float,), Role.FLOATS: (float,), Role.BOOL: (bool,), Role.BOOLS: (bool,),
                   Role.INT: (int,)})


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def scheduled_number(value: Any, where: str) -> None:
    """Raises a TypeError naming ``where`` unless ``value`` is what torch.optim takes for a
    scheduled value: a real number (int, float, numpy scalar) or a one-element real tensor."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{where}: Tensor lr must be 1-element, got shape {tuple(value.shape)}")  # (torch's words)
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{where} must be a number or a 1-element real tensor, got a {value.dtype} tensor")
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{where} must be a number or a 1-element tensor, got {_describe(value)}")


def op_value(value: Any, role: Any, where: str) -> Any:
    """``value`` of a group key that is an op argument of ``role`` (a spec ``Role``) as the
    op's Python type, accepting what torch.optim accepts there: for a float, any real number
    (int, numpy scalar) or a one-element real tensor; for a bool, a bool, numpy bool, 0 or 1, or a
    one-element tensor of them; for an int, an integer or a one-element integer tensor; for a
    per-param option, one such value or a list of them. Anything else: a TypeError naming
    ``where``."""
    if not _PLAIN:
        _role_names()
    from ..spec import Role

    if role in (Role.FLOATS, Role.BOOLS) and isinstance(value, (list, tuple)):
        one = Role.FLOAT if role is Role.FLOATS else Role.BOOL
        return [op_value(v, one, f"{where}[{i}]") for i, v in enumerate(value)]
    kind = {Role.FLOAT: "float", Role.FLOATS: "float", Role.BOOL: "bool", Role.BOOLS: "bool", Role.INT: "int"}[role]
    x: Any = value
    if isinstance(value, Tensor):
        if value.numel() != 1 or value.is_complex() or value.requires_grad:
            raise TypeError(f"{where} must be a {kind}, got a tensor of shape {tuple(value.shape)} "
                            f"and dtype {value.dtype}{' that requires grad' if value.requires_grad else ''}")
        x = value.item()
    elif hasattr(value, "item") and type(value).__module__ == "numpy":  # (a numpy scalar)
        x = value.item()
    if kind == "float" and isinstance(x, numbers.Real) and not isinstance(x, bool):
        return float(x)
    if kind == "bool" and (isinstance(x, bool) or (isinstance(x, numbers.Integral) and x in (0, 1))):
        return bool(x)
    if kind == "int" and isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    raise TypeError(f"{where} must be a {kind}, got {_describe(value)}")


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
