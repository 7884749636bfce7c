"""Scheduled hyper-parameters (lr, betas, momentum): their validators (torch.optim's
messages) and :class:`OpGroup`, one param group as the ops take it (the scheduled values as
0-d tensors that a compiled step reads without recompiling), beside the group as written."""

from __future__ import annotations

import math
import numbers
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from .. import _private

__all__ = ["static_address", "as_lr_tensor", "check_lr", "check_betas", "check_momentum", "check_nonnegative", "OpGroup",
           "op_value", "scheduled_number", "renamed_group_keys", "as_floats", "group_device", "group_dtype", "follows"]


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
    return torch.tensor(rounded_to(lr, dtype), dtype=dtype, device=device)


def rounded_to(x: float, dtype: torch.dtype) -> float:
    """``x`` as ``dtype`` rounds it: past float32's range, the infinity that IEEE rounding gives
    (torch refuses to put such a float into a float32 tensor; torch.optim takes any lr)."""
    if dtype != torch.float64 and math.isfinite(x) and abs(x) > _FLOAT32_MAX:
        return torch.tensor(x, dtype=torch.float64).to(dtype).item()
    return x


_FLOAT32_MAX = torch.finfo(torch.float32).max


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


def decoupled_decay_own_options(base: Mapping[str, Any]) -> dict[str, Any]:
    """An optimizer's own group options (``base``) and ``corrected_weight_decay``, which the
    optimizer reads itself (the op takes ``max_lr_snapshot``)."""
    from ..spec import Arg, Role

    return {**base, "corrected_weight_decay": Arg("corrected_weight_decay", Role.BOOL)}


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


class OpGroup:
    """One param group as the ops take it: :attr:`view`, a dict of the group's own keys (the
    optimizer's defaults, ``params``, ``param_names``) where the scheduled hyper-parameters
    (lr, betas, momentum) are 0-d tensors and the op's other options the schema's Python types.

    The group itself keeps exactly what was written into it, as in torch.optim: ``lr=5e-3``
    reads back as the float 5e-3, a scheduler's float as that float, a user's tensor as that
    tensor (``group["lr"] is lr``). The view is what every step reads instead:

    - a scheduled number fills the view's own 0-d tensor (made once per key: float32, float64
      for all-float64 groups, on the params' device), so a compiled step, which reads that
      tensor, never recompiles when the number changes; a user's tensor is the view's value
      itself, so changing it in place is followed eagerly and compiled;
    - another op option is converted where torch.optim takes its type (an int, a numpy scalar,
      a one-element tensor) and stays in the group as written;
    - anything else raises a ``TypeError`` or ``ValueError`` naming the optimizer, the group
      index and the key (:func:`op_value`, :meth:`_validate`), before any tensor of a step
      changes.

    Why not the tensors in the group itself: a traced step reads the groups through Dynamo's
    optimizer support, which realizes every entry with a value guard on each float, and a
    float there recompiled every compiled step under an LR scheduler (docs/decisions.md, "Group
    values as written"). Keys others write (a scheduler's ``initial_lr``, ``max_lr``) stay out of
    the view: they never reach an op or a guard.

    :meth:`sync` takes what was written since the last sync (an identity check a key: the step's
    host cost). An eager step syncs strictly; a traced step's guards sync leniently (the base's
    ``OpView``), leaving a refused value in the view as written, which fails the guards, and the
    step traced anew raises it (:meth:`check`).
    """

    def __init__(self, group: dict[str, Any], keys: Iterable[str], scheduled: Mapping[str, Callable[[Any], None]],
                 options: Mapping[str, Any], device: torch.device, dtype: torch.dtype = torch.float32,
                 where: str = "param group", strict: bool = True) -> None:
        self.group = group
        self.keys = tuple(dict.fromkeys(("params", "param_names", *keys)))  # (the group's own keys, in order)
        self.scheduled, self.options = scheduled, options  # key -> validator; key -> the op's Arg
        self.device, self.dtype = device, dtype
        self.view: dict[str, Any] = {}
        self.seen: dict[str, Any] = {}  # key -> the group's value the view's entry was made from
        self.owned: dict[tuple[str, int], Tensor] = {}  # (key, index in a tuple) -> the view's own tensor
        self.refused: dict[str, tuple[type[Exception], str]] = {}  # key -> what a lenient sync could not take
        self.arity: dict[str, int] = {}  # scheduled key -> the length of its tuple (betas: 2), 0 for one value
        self.sync(where, strict)

    def sync(self, where: str = "param group", strict: bool = True) -> dict[str, Any]:
        """The view, after taking what was written into the group since the last sync.
        ``strict=False`` (the traced step's guards, which must not raise) leaves a refused value
        in the view as written, for :func:`check_view` to raise."""
        group, view, seen = self.group, self.view, self.seen
        for key in self.keys:
            value = group.get(key, _ABSENT)
            if value is seen.get(key, _ABSENT) and not isinstance(value, list):  # (a list may change in place)
                continue
            if value is _ABSENT:
                view.pop(key, None)
                seen.pop(key, None)
                continue
            try:
                view[key] = self._take(key, value, where)
            except (TypeError, ValueError) as e:
                if strict:
                    raise
                view[key] = value  # (a guard on the view then fails: the traced step is traced anew)
                self.refused[key] = (type(e), str(e))
                seen.pop(key, None)  # (taken again by the next sync)
                continue
            seen[key] = value
            self.refused.pop(key, None)
        return view

    def check(self, where: str = "param group") -> None:
        """Raises what the last sync refused (a traced step, which cannot sync: the guards did).
        ``where`` is in the message already."""
        for kind, text in self.refused.values():
            raise kind(text)

    def _take(self, key: str, value: Any, where: str) -> Any:
        """The view's entry for ``value`` written at ``key`` (validated first)."""
        at = f"{where}[{key!r}]"
        if key in self.scheduled:
            self._validate(key, value, at)
            if isinstance(value, (tuple, list)):
                return tuple(self._tensor((key, i), v) for i, v in enumerate(value))
            return self._tensor((key, 0), value)
        arg = self.options.get(key)
        return value if arg is None else op_value(value, arg, at)

    def _validate(self, key: str, value: Any, at: str) -> None:
        """Raises, naming ``at``, unless ``value`` is what torch.optim takes for the scheduled
        ``key``: a number or a 1-element tensor, or a tuple of as many as the group first held
        for it (``betas``: 2; tensor values are data: only numbers are range-checked)."""
        given = len(value) if isinstance(value, (tuple, list)) else 0
        arity = self.arity.setdefault(key, given)  # (0: one value)
        if given != arity:
            raise TypeError(f"{at} must be " + (f"a tuple of {arity} numbers" if arity
                                                  else "a number or a 1-element tensor") + f", got {_describe(value)}")
        for v in value if arity else (value,):
            scheduled_number(v, at)
        if not all(isinstance(v, Tensor) for v in (value if arity else (value,))):
            try:
                self.scheduled[key](as_floats(value))
            except ValueError as e:
                raise ValueError(f"{at}: {e}") from None

    def _tensor(self, slot: tuple[str, int], value: Any) -> Tensor:
        """The op's tensor for one scheduled value: a user's tensor itself, or the number filled
        into the view's own tensor for ``slot`` (made at its first number)."""
        if isinstance(value, Tensor):
            return static_address(value)
        own = self.owned.get(slot)
        if own is None:
            own = self.owned[slot] = static_address(as_lr_tensor(float(value), self.device, self.dtype).clone())
        else:
            own.fill_(rounded_to(float(value), self.dtype))
        return own


_ABSENT = object()
# The Python types an op argument of each role takes as it is (anything else is converted or refused)
_PLAIN: dict[Any, tuple[type, ...]] = {}
_KINDS: dict[Any, str] = {}  # role -> the Python type's name, in messages
_ARTICLE = {"float": "a", "bool": "a", "int": "an"}


def _role_names() -> None:
    from ..spec import Role  # (spec imports the compiled ops: not at module import)

    _KINDS.update({Role.FLOAT: "float", Role.FLOATS: "float", Role.BOOL: "bool", Role.BOOLS: "bool", Role.INT: "int"})
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


def op_value(value: Any, arg: Any, where: str) -> Any:
    """``value`` of a group key that is op argument ``arg`` (a spec ``Arg``: an option of a
    Python type) as the op takes it, accepting what torch.optim accepts there: for a float, any
    real number (int, numpy scalar) or a one-element real tensor, in the op's range; for a bool, a
    bool, numpy bool, 0 or 1, or a one-element tensor of them; for an int, an int64 or a
    one-element integer tensor. A per-param option of the op (LARS's ``weight_decay``) is one such
    value for the whole group too: the optimizer makes its per-param lists. A value of another
    type raises a TypeError naming ``where``, one out of range a ValueError in the op's words."""
    if not _PLAIN:
        _role_names()
    kind = _KINDS[arg.role]
    x = value
    if type(value) not in _PLAIN[arg.role]:
        if isinstance(value, Tensor):
            if value.numel() != 1 or value.is_complex() or value.requires_grad:
                raise TypeError(f"{where} must be {_ARTICLE[kind]} {kind}, got a tensor of shape {tuple(value.shape)} "
                                f"and dtype {value.dtype}{' that requires grad' if value.requires_grad else ''}")
            x = value.item()
        elif hasattr(value, "item") and type(value).__module__ == "numpy":  # (a numpy scalar)
            x = value.item()
        if kind == "float" and isinstance(x, numbers.Real) and not isinstance(x, bool):
            x = float(x)
        elif kind == "bool" and (isinstance(x, bool) or (isinstance(x, numbers.Integral) and x in (0, 1))):
            x = bool(x)
        elif kind == "int" and isinstance(x, numbers.Integral) and not isinstance(x, bool):
            x = int(x)
        else:
            raise TypeError(f"{where} must be {_ARTICLE[kind]} {kind}, got {_describe(value)}")
    if kind == "float" and not arg.in_range(x):
        raise ValueError(f"{where}: invalid {arg.name} {x:g}, expected a value in {arg.range_text()}")
    if kind == "int" and not -(2**63) <= x < 2**63:
        raise ValueError(f"{where}: invalid {arg.name} {x}, expected an int64")
    return x


def follows(value: Tensor, device: torch.device) -> bool:
    """Whether a scheduled tensor is what the ops take as it is (0-d float32 on the params'
    device), so that a call prepared with it reads its value at every step."""
    return value.dim() == 0 and value.dtype == torch.float32 and value.device == device


def as_floats(value: Any) -> Any:
    """A scheduled value (float, 0-d tensor, or a tuple of them) as Python floats, for
    validation: never called inside a step."""
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
