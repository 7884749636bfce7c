"""What every inductor_lamb optimizer shares: scheduled hyper-parameters (lr,
betas, momentum) as 0-d tensors per param group, (device, dtype) buckets for
the list ops, GradScaler support, float32 state that survives
``load_state_dict``, and a ``step`` that never graph-breaks.
"""

from __future__ import annotations

import struct
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from .. import ops, reference
from ..spec import SPECS, OpSpec, Role
from . import _sharding

__all__ = ["FusedOptimizer", "ScheduledValues", "as_lr_tensor", "check_betas", "check_nonnegative"]

_LOW_PRECISION = (torch.bfloat16, torch.float16)
# Param dtypes the optimizers take: the ops' three, and float64, which steps
# through the float64 reference math (see FusedOptimizer._functions).
_PARAM_DTYPES = (torch.float32, *_LOW_PRECISION, torch.float64)


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


class ScheduledValues:
    """The 0-d float32 tensors of one param group's scheduled hyper-parameters.

    torch's schedulers write ``group["betas"] = (0.85, ...)`` or
    ``group["momentum"] = 0.9`` as new Python floats (they ``fill_`` in place only
    for ``lr``). A compiled step that read those floats would be guarded on their
    values and recompile on every step. So each group's values live in tensors
    that :meth:`sync` fills from whatever was written (validated first) and puts
    back into the group, before anything reads the group
    (``FusedOptimizer.param_groups`` is a property that syncs). The group dicts
    stay plain dicts (dynamo's optimizer support requires that).
    """

    def __init__(self, group: dict[str, Any], scheduled: dict[str, Callable[[Any], None]], device: torch.device,
                 defaults: dict[str, Any], dtype: torch.dtype = torch.float32) -> None:
        self.scheduled, self.device, self.dtype, self.values = scheduled, device, dtype, {}
        for key, validate in scheduled.items():
            if key not in group:
                continue
            value = group[key]
            validate(_as_floats(value))
            if isinstance(value, (tuple, list)):
                shared = defaults.get(key) or ()
                self.values[key] = tuple(self._own(v, any(v is d for d in shared)) for v in value)
            else:
                self.values[key] = self._own(value, value is defaults.get(key))
            group[key] = self.values[key]

    def _own(self, value: Any, shared: bool) -> Tensor:
        """A 0-d tensor on the group's device that this group may fill in place: a
        user's own such tensor is kept (as torch.optim keeps a tensor lr)."""
        if isinstance(value, Tensor) and not shared and value.dim() == 0 and value.dtype == self.dtype \
                and value.device == self.device:
            return value
        return as_lr_tensor(value, self.device, self.dtype).clone()

    def sync(self, group: dict[str, Any]) -> None:
        for key, current in self.values.items():
            value = group.get(key)
            if value is current:
                continue
            self.scheduled[key](_as_floats(value))
            if isinstance(current, tuple):
                current = tuple(self._assign(c, v) for c, v in zip(current, value))
            else:
                current = self._assign(current, value)
            self.values[key] = group[key] = current

    def _assign(self, current: Tensor, value: Any) -> Tensor:
        if value is current:
            return current
        if isinstance(value, Tensor) and value.dim() == 0 and value.dtype == self.dtype \
                and value.device == self.device:
            return value  # the user hands in a tensor of their own
        current.fill_(value)
        return current


def plain_group(group: dict[str, Any], keys) -> dict[str, Any]:
    """The group with its scheduled 0-d tensors as Python floats (state_dict, repr)."""
    return {k: (_as_floats(v) if k in keys else v) for k, v in group.items()}


def _as_floats(value: Any) -> Any:
    """A scheduled value (float, 0-d tensor, or a tuple of them) as Python floats.
    For display, validation and checkpoints only: never called inside a step."""
    if isinstance(value, (tuple, list)):
        return tuple(_as_floats(v) for v in value)
    if not isinstance(value, Tensor):
        return float(value)
    # the shortest decimal that reads back as the same float32 (0.9, not 0.8999999761581421)
    x = float(value)
    for digits in range(6, 10):
        short = float(f"{x:.{digits}g}")
        if struct.unpack("f", struct.pack("f", short))[0] == x:
            return short
    return x


def _group_device(group: dict[str, Any]) -> torch.device:
    """Where a group's lr lives: its params' device when they share one, else the CPU."""
    devices = {p.device for p in group["params"]}
    return devices.pop() if len(devices) == 1 else torch.device("cpu")


def _group_dtype(group: dict[str, Any]) -> torch.dtype:
    """The dtype of a group's scheduled values: float64 when all its params are
    float64 (their float64 math then reads lr at full precision), else float32."""
    params = group["params"]
    return torch.float64 if params and all(p.dtype == torch.float64 for p in params) else torch.float32


class FusedOptimizer(Optimizer):
    """Base of the optimizers whose step is one ``torch.ops.lamb`` call per
    (device, dtype, sharding) bucket of each param group (per chunk of
    ``max_tensors_per_call`` params of a bigger bucket).

    Subclasses set ``_op``, the spec of their one-call op, and ``_state_keys``
    (state tensors created like the param), optionally ``_scalar_state_keys``
    (0-d float32 per-param state, e.g. LAMB16's scales) and ``_state_fill``.
    The op call is derived from the spec: its state lists are the state keys in
    order (``steps`` last among the per-tensor scalars), its state dtypes are
    the spec's, and each hyper-parameter is the param group's entry of the same
    name (``betas``: ``beta1``, ``beta2``), unless ``_hypers`` says otherwise.

    DTensor params (FSDP2, HSDP, tensor parallel) step on their local shards
    with exact per-tensor norms: :mod:`._sharding`.

    ``unscale_in_step=True`` lets ``torch.amp.GradScaler`` hand its scale and inf
    flag to ``step`` (``grad_scale`` / ``found_inf`` attributes, like torch's fused
    Adam), which unscales inside the kernels: no separate pass over the grads and
    no host sync. Off by default: GradScaler then unscales first (``unscale_``),
    which gradient clipping by Lightning, HF ``Trainer`` or ``clip_grad_norm_``
    needs; Lightning refuses to clip for an optimizer that unscales itself.
    """

    # Params per op call: a bucket with more takes several calls. Why: Inductor's
    # post-grad pass (decompose_auto_functionalized) is quadratic in the tensors one
    # mutating call writes, 28 s of a cold compile at 256 params in one call, 6.8 s
    # in calls of 64, 4.2 s in calls of 32 (RESULTS.md). Eagerly, 32 costs
    # a few hundredths of a ms per step more than 64 on small params.
    max_tensors_per_call: int = 32

    _op: OpSpec
    _state_keys: tuple[str, ...] = ()
    _scalar_state_keys: tuple[str, ...] = ()
    # Hyper-parameters torch's schedulers change per step, with their validators:
    # 0-d tensors in every param group (ParamGroup), read by the compiled step.
    _scheduled: dict[str, Callable[[Any], None]] = {"lr": check_lr}
    # Options added after 0.1.0 and the values that reproduce what a checkpoint
    # without them did; other missing options take this optimizer's defaults.
    _options_before_they_existed: dict[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        op = cls.__dict__.get("_op")
        if op is None:
            return
        # state key -> the op's list argument, in the spec's order
        states = list(op.of(Role.STATE))
        scalars = [a for a in op.of(Role.SCALARS) if a.name != "steps"]
        if len(states) != len(cls._state_keys) or len(scalars) != len(cls._scalar_state_keys):
            raise TypeError(f"{cls.__name__}: state keys do not match the lists of {op.name}")
        cls._lists = {**{k: a.name for k, a in zip(cls._state_keys, states)},
                      **{k: a.name for k, a in zip(cls._scalar_state_keys, scalars)}}
        cls._state_dtypes = {k: a.dtype for k, a in zip(cls._state_keys, states)}
        cls._has_step = "steps" in op.names
        # what _init_group fills: the op's per-param lists (params, grads, state, steps), then master copies
        cls._flat_lists = (*(a.name for a in op.args if a.role in _BUCKET_LISTS), "master_params")

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], *, unscale_in_step: bool = False) -> None:
        as_lr_tensor(defaults["lr"])  # validates
        # (what GradScaler and Lightning read: see the class docstring)
        self._step_supports_amp_scaling = bool(unscale_in_step)
        # Whether step() ran, for LR schedulers' ``_opt_called`` (see there).
        self._stepped = False
        self._stepped_in_graph = torch.zeros((), dtype=torch.bool)  # recipe (a) only
        super().__init__(params, defaults)

    # ---- param groups and state -------------------------------------------------

    # The param groups, synced with what schedulers wrote (ScheduledValues) on every read:
    # dynamo's guards read this property too, so a compiled step always sees the tensors.
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        groups = self.__dict__["_groups"]
        if not torch.compiler.is_compiling():  # (traced code reads what the guards saw)
            for group, values in zip(groups, self.__dict__["_group_values"]):
                values.sync(group)
        return groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.__dict__["_groups"] = groups
        self.__dict__["_group_values"] = [self._scheduled_values(g) for g in groups]

    def __setstate__(self, state: dict[str, Any]) -> None:
        # (torch.optim puts param_groups straight into __dict__, past the property)
        state = dict(state)
        groups = state.pop("param_groups", None)
        super().__setstate__(state)
        if groups is not None:
            # Options added after a checkpoint was written (not torch.optim's
            # "differentiable", which its __setstate__ puts into the defaults: a
            # state dict must read back as it was saved).
            options = {k: v for k, v in self.defaults.items() if k != "differentiable"}
            for group in groups:
                for key, value in {**options, **self._options_before_they_existed}.items():
                    group.setdefault(key, value)
            self.param_groups = groups

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        groups = self.__dict__["_groups"]
        self.__dict__["_group_values"].append(self._scheduled_values(groups[-1]))
        group = groups[-1]
        for p in group["params"]:
            if p.dtype not in _PARAM_DTYPES:
                raise TypeError(
                    f"{type(self).__name__} supports float32, float64, bfloat16 and float16 params, got {p.dtype}"
                )
        # State is created now rather than at the first step (as torch.optim does): a
        # compiled training step then sees the same state from its first call and
        # compiles once. Master copies stay lazy (they copy the param's value, which
        # may still be loaded after the optimizer is built).
        for p in group["params"]:
            if p.requires_grad:
                self._init_state(p, group, master=False)

    def _scheduled_values(self, group: dict[str, Any]) -> ScheduledValues:
        return ScheduledValues(group, self._scheduled, _group_device(group), self.defaults, _group_dtype(group))

    def _init_state(self, p: Tensor, group: dict[str, Any], master: bool = True) -> dict[str, Any]:
        state = self.state[p]
        if len(state) == 0:
            # step on the param's device, as the op reads it there (no host sync on GPU)
            if self._has_step:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            for key in self._state_keys:
                state[key] = torch.full_like(
                    p, self._state_fill(key, group), dtype=self._state_dtype(key, p.dtype),
                    memory_format=torch.preserve_format,
                )
            for key in self._scalar_state_keys:
                state[key] = torch.full((), self._state_fill(key, group), dtype=torch.float32, device=p.device)
        if master and "master_param" not in state and group.get("master_weights", False) and p.dtype in _LOW_PRECISION:
            state["master_param"] = p.detach().to(torch.float32, memory_format=torch.preserve_format)
        return state

    def _state_fill(self, key: str, group: dict[str, Any]) -> float:
        """Initial value of state tensor ``key``."""
        return 0.0

    def _state_dtype(self, key: str, param_dtype: torch.dtype) -> torch.dtype:
        """The dtype of state ``key`` of a param of ``param_dtype``: the op's (float32
        moments, LAMB16's float8), float64 for float64 params' float32 state."""
        dtype = self._state_dtypes.get(key, torch.float32)  # (scalars, master copies: float32)
        return torch.float64 if param_dtype == torch.float64 and dtype == torch.float32 \
            and key not in self._scalar_state_keys else dtype

    def state_bytes_per_param(self) -> float:
        """Bytes of optimizer state (every tensor in ``self.state``: moments,
        scales, steps, master copies) per optimized parameter element; 0.0 when
        no state exists yet."""
        nbytes = numel = 0
        for p, state in self.state.items():
            numel += p.numel()
            nbytes += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, Tensor))
        return nbytes / numel if numel else 0.0

    def state_dict(self) -> dict[str, Any]:
        # lr, betas, momentum as floats, like torch.optim's own optimizers save them:
        # checkpoints load into torch.optim classes too (load_state_dict turns them
        # back into tensors).
        sd = super().state_dict()
        for group in sd["param_groups"]:
            for key in self._scheduled:
                if key in group:
                    group[key] = _as_floats(group[key])
        return sd

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            plain = plain_group(group, self._scheduled)
            lines.append(f"Parameter Group {i}")
            lines += [f"    {key}: {plain[key]}" for key in sorted(plain) if key != "params"]
        return "\n".join(lines) + "\n)"

    # Param-group keys of other implementations that carry nothing these optimizers
    # use (torch.optim's implementation flags), dropped when their state dicts load.
    _foreign_keys: tuple[str, ...] = ("foreach", "fused", "capturable", "differentiable")

    def _adopt_foreign_group(self, group: dict[str, Any], num_groups: int) -> list[str]:
        """Translates, in place, a loaded param group written by another
        implementation of this optimizer; returns what cannot be carried over."""
        return []

    def _from_other_layouts(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A state dict from another implementation in this optimizer's layout:
        a per-group ``step`` (timm's Lamb, apex's FusedLAMB) becomes every param's
        ``step``, foreign keys are dropped or translated (``_adopt_foreign_group``),
        with a warning that names what does not carry over. Ours pass unchanged."""
        groups = state_dict["param_groups"]
        if not any("step" in g or any(k in g for k in self._foreign_keys) for g in groups):
            return state_dict
        state = {pid: dict(s) for pid, s in state_dict["state"].items()}
        new_groups, notes = [], []
        for g in groups:
            g = {k: v for k, v in g.items() if k not in self._foreign_keys}
            step = g.pop("step", None)
            if step is not None and self._has_step:
                for pid in g["params"]:
                    if pid in state and "step" not in state[pid]:
                        state[pid]["step"] = torch.as_tensor(step, dtype=torch.float32).clone().reshape(())
            notes += [n for n in self._adopt_foreign_group(g, len(groups)) if n not in notes]
            new_groups.append(g)
        if notes:
            warnings.warn(f"{type(self).__name__}.load_state_dict: " + "; ".join(notes), stacklevel=3)
        return {**state_dict, "state": state, "param_groups": new_groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = self._from_other_layouts(state_dict)
        # torch.optim casts floating state to the param dtype (bf16 params would
        # lose their float32 moments, LAMB16's float8 ones would become float32);
        # keep each in the dtype the ops require, from the saved tensors themselves.
        keep = (*self._state_keys, *self._scalar_state_keys, "master_param")
        saved = {
            pid: {k: v for k, v in s.items() if k in keep and isinstance(v, Tensor)}
            for pid, s in state_dict["state"].items()
        }
        super().load_state_dict(state_dict)
        id_to_param = {
            pid: p
            for saved_group, group in zip(state_dict["param_groups"], self.param_groups)
            for pid, p in zip(saved_group["params"], group["params"])
        }
        for pid, values in saved.items():
            p = id_to_param.get(pid)
            if p is None:
                continue
            state = self.state[p]
            for k, v in values.items():
                state[k] = v.to(device=p.device, dtype=self._state_dtype(k, p.dtype), copy=True)
                if k in self._scalar_state_keys:
                    state[k] = state[k].reshape(())
            step = state.pop("step", None)
            if step is not None and self._has_step:  # (releases up to 0.1.0 kept a dead LARS step)
                state["step"] = torch.as_tensor(step, dtype=torch.float32).to(p.device, copy=True).reshape(())
        self.param_groups = self.__dict__["_groups"]  # new tensors from the loaded floats

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Resets the gradients of all optimized tensors, like
        ``torch.optim.Optimizer.zero_grad``; unlike it (``@torch._disable_dynamo``)
        dynamo can trace it, so a whole training step compiles as one graph."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    # ---- step ----------------------------------------------------------------------

    def _init_group(self, index: int, *lists: list[Tensor]) -> tuple[tuple[Any, ...], ...] | None:
        """The buckets of param group ``index`` when all its params are plain tensors
        (no DTensor, no sparse grad): fills ``lists`` (empty, one per entry of
        ``_flat_lists``) with every bucket's tensors, bucket after bucket, and returns
        each bucket's (number of params, has master copies, param names); None, with
        nothing filled, otherwise (``_buckets`` then handles the group and its errors).

        Why here: dynamo runs a ``torch.optim.Optimizer``'s ``_init_group`` eagerly
        instead of tracing it, and installs the guards on ``param_groups`` and
        ``state`` itself (torch/_dynamo/variables/optimizer.py). Traced, this
        per-param Python was most of dynamo's time on a compiled step (RESULTS.md,
        compile time). The result depends only on what those guards check: which params
        have grads, their devices and dtypes, and the state's keys."""
        self._stepped = True  # eager here even in a compiled step (see _opt_called)
        group = self.__dict__["_groups"][index]
        names = group.get("param_names")
        buckets: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, p in enumerate(group["params"]):
            g = p.grad
            if g is None:
                continue
            if g.is_sparse or _sharding.is_dtensor(p) or _sharding.is_dtensor(g):
                return None
            buckets.setdefault((p.device, p.dtype), []).append(i)
        states = {i: self._init_state(group["params"][i], group) for ids in buckets.values() for i in ids}
        if any(_sharding.is_dtensor(t) for state in states.values() for t in state.values()):
            return None
        layout = []
        for ids in buckets.values():
            masters = sum("master_param" in states[i] for i in ids)
            if masters not in (0, len(ids)):
                return None
            layout.append((len(ids), masters > 0, tuple(names[i] if names else None for i in ids)))
        out = dict(zip(self._flat_lists, lists))
        for ids in buckets.values():
            for i in ids:
                for arg, t in self._param_tensors(group["params"][i], states[i]):
                    out[arg].append(t)
        return tuple(layout)

    def _param_tensors(self, p: Tensor, state: dict[str, Any]) -> list[tuple[str, Tensor]]:
        """(op list argument, tensor) for every tensor param ``p`` brings to an op call."""
        out = [("params", p), ("grads", p.grad), *((arg, state[key]) for key, arg in self._lists.items())]
        if self._has_step:
            out.append(("steps", state["step"]))
        if "master_param" in state:
            out.append(("master_params", state["master_param"]))
        return out

    def _group_buckets(self, group: dict[str, Any], index: int) -> dict[tuple[Any, ...], dict[str, Any]]:
        """Param group ``index``'s buckets (see ``_buckets``): from ``_init_group`` when
        it takes the group, else from ``_buckets``."""
        if torch.compiler.is_compiling() and torch._dynamo.config.trace_autograd_ops:
            # A backward traced into the same graph (recipe (a)) sets the grads as
            # pending side effects, which an eager _init_group cannot see: dynamo
            # refuses it ("pending mutation on parameter"), so trace the buckets.
            self._stepped_in_graph.fill_(True)
            return self._buckets(group, index)
        lists: list[list[Tensor]] = [[] for _ in self._flat_lists]
        layout = self._init_group(index, *lists)
        if layout is None:
            return self._buckets(group, index)
        flat = dict(zip(self._flat_lists, lists))
        buckets: dict[tuple[Any, ...], dict[str, Any]] = {}
        lo = lo_master = 0
        for n, has_master, names in layout:
            b: dict[str, Any] = {k: v[lo:lo + n] for k, v in flat.items() if k != "master_params"}
            b["sharding"] = None
            b["names"] = list(names)
            if has_master:
                b["master_params"] = flat["master_params"][lo_master:lo_master + n]
                lo_master += n
            buckets[(b["params"][0].device, b["params"][0].dtype, None)] = b
            lo += n
        return buckets

    def _buckets(self, group: dict[str, Any], index: int) -> dict[tuple[Any, ...], dict[str, Any]]:
        """Params with a grad, with their state, grouped by (device, dtype,
        sharding); lists are keyed by the op's argument names and hold local
        shards of DTensors. Checks every DTensor's layout before anything runs."""
        buckets: dict[tuple[Any, ...], dict[str, Any]] = defaultdict(lambda: defaultdict(list))
        meshes: dict[tuple[torch.device, torch.dtype], tuple[Any, str]] = {}
        names = group.get("param_names")  # set when built from model.named_parameters()
        who = type(self).__name__
        for i, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            name = repr(names[i]) if names else f"{i} of param group {index}"
            if p.grad.is_sparse:
                self._check_sparse(p, group, name)
                b = buckets[(p.device, p.dtype, "sparse")]
                b["sharding"], b["sparse"] = None, True
                b["names"].append(names[i] if names else None)
                for arg, t in self._param_tensors(p, self._init_state(p, group)):
                    b[arg].append(t)
                continue
            state = self._init_state(p, group)
            sharding = _sharding.sharding_of(p, p.grad, state, name, who)
            if sharding is not None:  # one mesh per (device, dtype) of a group: one collective per bucket
                first = meshes.setdefault((p.device, p.dtype), (sharding.mesh, name))
                if not _sharding.same_mesh(first[0], sharding.mesh):
                    raise ValueError(f"{who}: param {name} is on a different device mesh than param {first[1]} "
                                     "of the same param group, device and dtype; put them in separate param groups")
            b = buckets[(p.device, p.dtype, sharding)]
            b["sharding"] = sharding
            b["names"].append(names[i] if names else None)
            for arg, t in self._param_tensors(p, state):
                b[arg].append(_sharding.local(t))
        return buckets

    def _check_sparse(self, p: Tensor, group: dict[str, Any], name: str) -> None:
        """Raises unless this optimizer steps param ``name`` with its sparse grad
        (``_step_sparse``); checked with every other argument, before any step."""
        raise RuntimeError(f"{type(self).__name__} does not support sparse gradients (param {name})")

    def _step_sparse(self, group: dict[str, Any], bucket: dict[str, Any], grad_scale: Tensor | None,
                     found_inf: Tensor | None) -> None:
        raise NotImplementedError

    def _amp_args(self, device: torch.device) -> tuple[Tensor | None, Tensor | None]:
        """grad_scale / found_inf set by torch.amp.GradScaler for this step, on ``device``."""
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if grad_scale is not None:
            grad_scale = grad_scale.to(device=device, dtype=torch.float32, non_blocking=True)
        if found_inf is not None:
            found_inf = found_inf.to(device=device, dtype=torch.float32, non_blocking=True)
        return grad_scale, found_inf

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Performs a single optimization step.

        Args:
            closure: a closure that re-evaluates the model and returns the loss.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Every bucket of every group first: bad input raises before any tensor is touched.
        groups = [(group, self._group_buckets(group, i)) for i, group in enumerate(self.param_groups)]
        # (GradScaler's found_inf is already the same on every rank with DTensor grads: DTensor
        # maxes it across the mesh when checking the grads, found_inf_reduce_handler)
        for group, buckets in groups:
            if not buckets:  # a frozen group, or no grads in this step: nothing to do (as torch.optim)
                continue
            # Clipping by the group's global grad norm: the op does it when the
            # group is one unsharded bucket; otherwise the clip folds into grad_scale.
            max_norm = float(group.get("max_grad_norm", 0.0))
            whole = len(buckets) == 1 and next(iter(buckets.values()))["sharding"] is None \
                and len(next(iter(buckets.values()))["params"]) <= self.max_tensors_per_call
            clip = self._clip_factor(buckets, max_norm) if max_norm > 0 and not whole else None
            for (device, _, _), bucket in buckets.items():
                grad_scale, found_inf = self._amp_args(device)
                if clip is not None:
                    clip_d = clip.to(device)
                    grad_scale = clip_d if grad_scale is None else grad_scale * clip_d
                self._step_bucket(group, bucket, grad_scale, found_inf, max_norm if clip is None else 0.0)
        return loss

    # LR schedulers wrap ``opt.step`` in a function of lr_scheduler.py (only to set
    # ``_opt_called``), a file dynamo refuses to trace: a fullgraph compile of a
    # training step would fail. The marker tells schedulers to leave our step
    # unwrapped, and ``_opt_called`` is derived instead. Dynamo drops attribute
    # writes on optimizers inside compiled code, but runs ``_init_group`` eagerly,
    # so setting ``_stepped`` there covers eager and compiled steps alike. Only a
    # step traced with its backward (recipe (a), which traces ``_buckets``)
    # needs a tensor flag; a tensor written in every compiled step would be one more
    # generated kernel, 6 s of a cold compile of a 256-param step (RESULTS.md).
    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]

    @property
    def _opt_called(self) -> bool:
        # Read by LR schedulers once, on their first step (eagerly).
        return self._stepped or bool(self._stepped_in_graph)

    @_opt_called.setter
    def _opt_called(self, value: bool) -> None:
        pass  # derived from the state, see above

    def _clip_factor(self, buckets: dict[Any, dict[str, Any]], max_norm: float) -> Tensor:
        """max(1, ||all grads / grad_scale|| / max_norm) over every bucket of a group
        (and every shard), on the first bucket's device (no host sync:
        device-to-device copies and collectives only)."""
        total = None
        for bucket in buckets.values():
            grads = bucket["grads"]
            norms = torch._foreach_norm(grads, 2, dtype=None if grads[0].dtype == torch.float64 else torch.float32)
            part = torch.stack(norms).double().square().sum()
            part = _sharding.all_reduce_sum(part, bucket["sharding"])
            total = part if total is None else total + part.to(total.device, non_blocking=True)
        grad_scale, _ = self._amp_args(total.device)
        return ops.clip_factor(total, max_norm, grad_scale)

    @staticmethod
    def _on_bucket(value: Tensor, bucket: dict[str, Any]) -> Tensor:
        """A group's 0-d hyper-parameter on the bucket's device (a copy only for
        mixed-device groups)."""
        device = bucket["params"][0].device
        return value if value.device == device else value.to(device, non_blocking=True)

    def _hypers(self, group: dict[str, Any], bucket: dict[str, Any]) -> dict[str, Any]:
        """The op's hyper-parameters for one bucket: the group's entries of the same
        names (``betas``: ``beta1``, ``beta2``), scheduled ones on the bucket's device."""
        for key, validate in self._scheduled.items():
            # A value written into the group that no eager read synced (a compiled step
            # reads the group as its guards saw it): the eager check and message.
            value = group.get(key)
            if value is not None and not isinstance(value, Tensor) and not (
                    isinstance(value, tuple) and all(isinstance(v, Tensor) for v in value)):
                validate(_as_floats(value))
        values = dict(group)
        if "betas" in group:
            values["beta1"], values["beta2"] = group["betas"]
        out = {}
        for a in self._op.args:
            if a.name in values and a.role in (Role.TENSOR, Role.FLOAT, Role.BOOL, Role.INT, Role.FLOATS, Role.BOOLS):
                v = values[a.name]
                # (a float written into the group that no eager read synced yet: the wrapper
                # makes it a tensor; a compiled step then specializes on it)
                out[a.name] = self._on_bucket(v, bucket) if a.role is Role.TENSOR and isinstance(v, Tensor) else v
        return out

    def _step_bucket(
        self,
        group: dict[str, Any],
        bucket: dict[str, Any],
        grad_scale: Tensor | None,
        found_inf: Tensor | None,
        max_grad_norm: float,
    ) -> None:
        """The op call of one bucket of ``group``: the one-call op, or for sharded
        layer-wise buckets reduce, combine across shards, apply."""
        if bucket.get("sparse"):
            self._step_sparse(group, bucket, grad_scale, found_inf)
            return
        op = self._op
        dtype = bucket["params"][0].dtype
        args = {a.name: bucket[a.name] for a in op.args if a.role in _BUCKET_LISTS}
        args.update(self._hypers(group, bucket), grad_scale=grad_scale, found_inf=found_inf)
        if bucket.get("master_params"):
            args["master_params"] = bucket["master_params"]
        if "max_grad_norm" in op.names:
            args["max_grad_norm"] = max_grad_norm
        n, size = len(bucket["params"]), self.max_tensors_per_call
        if dtype == torch.float64:
            # 0-d params (and their grads and state) as 1-element views: torch 2.13's
            # dynamo drops in-place writes to 0-d float64 graph inputs (it takes them
            # for wrapped Python floats).
            shaped = {a.name for a in op.args if a.role in (Role.PARAMS, Role.GRADS, Role.STATE)}
            args = {k: [t.view(1) if t.dim() == 0 else t for t in v] if k in shaped else v for k, v in args.items()}
        chunks = [self._chunk(args, lo, min(lo + size, n), n) for lo in range(0, n, size)]
        sharding = bucket["sharding"]
        if sharding is None or not sharding.dims or not op.reductions:
            for chunk in chunks:
                self._function(op.name, dtype)(**chunk)
            return
        # one collective for the bucket, whatever its number of op calls
        partials = [self._function(op.reduce_op, dtype)(**chunk) for chunk in chunks]
        totals = _sharding.combine(torch.cat(partials) if len(partials) > 1 else partials[0],
                                   [c.combine for c in op.reductions], sharding)
        lo = 0
        for chunk in chunks:
            hi = lo + len(chunk["params"])
            self._function(op.apply_op, dtype)(reductions=totals[lo:hi], **chunk)
            lo = hi

    @staticmethod
    def _function(name: str, dtype: torch.dtype) -> Callable[..., Any]:
        """The function of op ``name`` for a bucket of ``dtype`` params: the ops (fused kernels, Inductor
        lowerings) for float32 / bfloat16 / float16 params; for float64 params, the
        float64 reference math (:mod:`inductor_lamb.reference`, the equations every
        kernel follows, in plain torch ops that any device runs and torch.compile
        fuses), which the ops' float32 arithmetic could not match to float64 precision."""
        return getattr(reference, SPECS[name].reference) if dtype == torch.float64 else getattr(ops, name)

    def _chunk(self, args: dict[str, Any], lo: int, hi: int, n: int) -> dict[str, Any]:
        """The op arguments of params ``lo:hi`` of a bucket of ``n``: its lists and
        per-param options sliced, everything else shared."""
        if lo == 0 and hi == n:
            return args
        out = dict(args)
        for a in self._op.args:
            value = args.get(a.name)
            if isinstance(value, (list, tuple)) and (a.role in _BUCKET_LISTS or a.role is Role.MASTER
                                                     or (a.role in (Role.FLOATS, Role.BOOLS) and len(value) == n)):
                out[a.name] = value[lo:hi]
        return out


_BUCKET_LISTS = (Role.PARAMS, Role.GRADS, Role.STATE, Role.SCALARS)
