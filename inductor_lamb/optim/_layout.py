"""What the step machinery knows of an optimizer: its op functions (:class:`OpFamily`), its
:class:`StateLayout` (derived once per class from its op's description and its state keys), the
:class:`Bucket` its params are stepped in, and :class:`Stepped`, the typed interface
through which the bucket functions (``_buckets``), the step plans (``_plan``) and DeepSpeed's
pieces (``_deepspeed``) reach the optimizer. Nothing else of an optimizer is read outside it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from .. import ops, reference
from ..spec import Arg, OpSpec, Role
from ._model_tensors import ModelTensors

__all__ = ["OpFamily", "StateLayout", "Bucket", "Buckets", "Stepped", "BUCKET_LISTS", "GROUP_KEYS", "OPTION_ROLES"]

# Param-group keys that differ from the op argument they give: OneCycleLR writes its own
# ``max_lr`` into every group, so the peak lr of the corrected decay is timm's ``max_lr_snapshot``.
GROUP_KEYS = {"max_lr": "max_lr_snapshot"}

# The op's per-param lists a bucket holds (master copies beside them, when kept)
BUCKET_LISTS = (Role.PARAMS, Role.GRADS, Role.STATE, Role.SCALARS)
# The roles of the op's options that a param group holds as Python values
OPTION_ROLES = (Role.FLOAT, Role.BOOL, Role.INT, Role.FLOATS, Role.BOOLS)


@dataclass(frozen=True)
class OpFamily:
    """An optimizer's op functions: the one-call step and, for a layer-wise op, its
    reduce and apply phases (``inductor_lamb.ops``) for float32 / bfloat16 /
    float16 params, and the same as float64 reference math
    (``inductor_lamb.reference``: the equations every kernel follows, in
    torch ops that any device runs and torch.compile fuses) for float64 params,
    which the ops' float32 arithmetic could not match to float64 precision."""

    spec: OpSpec                         # the one-call op's
    ops: tuple[Callable[..., Any], ...]  # (step,) or (step, reduce, apply)
    reference: tuple[Callable[..., Any], ...]

    @classmethod
    def of(cls, spec: OpSpec) -> OpFamily:
        """The family of one-call op ``spec``, by its ops' names: the typed wrappers of
        ``inductor_lamb.ops`` and the reference functions of the same name without the
        in-place underscore (``lamb_reduce_``: ``reference.lamb_reduce``)."""
        names = [spec.name, *((spec.reduce_op, spec.apply_op) if spec.reduce_op else ())]
        return cls(spec, tuple(getattr(ops, n) for n in names), tuple(getattr(reference, n.rstrip("_")) for n in names))

    def functions(self, dtype: torch.dtype) -> tuple[Callable[..., Any], ...]:
        return self.reference if dtype == torch.float64 else self.ops


@dataclass(eq=False)
class Bucket:
    """The params of one param group that one op call steps (a traced step: several calls, per
    ``max_tensors_per_call``): same device, dtype and sharding.

    ``lists`` holds the op's per-param list arguments by their names in the op's schema
    (``params``, ``grads``, the state lists such as ``exp_avgs``, ``steps``; ``master_params``
    when the bucket keeps master copies), of local shards for DTensor params and of pieces of
    flat partitions for an engine's (DeepSpeed ZeRO). ``sharding`` says how to combine a
    two-phase op's reductions across ranks (:class:`~._sharding.Sharding`,
    :class:`~._deepspeed.Pieces`; None: not sharded)."""

    device: torch.device
    lists: dict[str, list[Tensor]] = field(default_factory=lambda: defaultdict(list))
    names: list[str | None] = field(default_factory=list)  # the params' names, when the group has them
    sharding: Any = None
    sparse: bool = False  # sparse grads (Adagrad's own update: ``_step_sparse``)

    @property
    def params(self) -> list[Tensor]:
        return self.lists["params"]

    @property
    def grads(self) -> list[Tensor]:
        return self.lists["grads"]

    @property
    def master_params(self) -> list[Tensor]:
        return self.lists.get("master_params", [])

    def add(self, tensors: list[tuple[str, Tensor]], name: str | None) -> None:
        """One param's tensors (its op list arguments) and name."""
        for arg, t in tensors:
            self.lists[arg].append(t)
        self.names.append(name)


Buckets = dict[tuple[Any, ...], Bucket]  # (device, dtype, sharding or another key) -> bucket



@dataclass(frozen=True)
class StateLayout:
    """How an optimizer's params and state become its op's arguments.

    ``state_keys`` name the state tensors made like the param (moments), ``scalar_state_keys``
    the 0-d float32 ones (LAMB16's scales), in the order of the op's lists of those roles; a
    ``step`` count is kept when the op takes ``steps``."""

    family: OpFamily
    state_keys: tuple[str, ...]
    scalar_state_keys: tuple[str, ...]
    lists: Mapping[str, str]                       # state key -> the op's list argument
    dtypes: Mapping[str, torch.dtype]              # state key -> the op's dtype for it
    has_step: bool
    flat_lists: tuple[str, ...]                    # what ``_init_group`` fills, in order
    scheduled: Mapping[str, Callable[[Any], None]]  # group keys schedulers change -> validator
    options: Mapping[str, Arg]                      # the group keys of the op's other arguments, and the
                                                    # optimizer's own options (master_weights) -> their Arg

    @classmethod
    def of(cls, family: OpFamily, state_keys: tuple[str, ...], scalar_state_keys: tuple[str, ...],
           validators: Mapping[str, Callable[[Any], None]], owner: str,
           own_options: Mapping[str, Arg] = {}) -> StateLayout:
        op = family.spec
        states = list(op.of(Role.STATE))
        scalars = [a for a in op.of(Role.SCALARS) if a.name != "steps"]
        if len(states) != len(state_keys) or len(scalars) != len(scalar_state_keys):
            raise TypeError(f"{owner}: state keys do not match the lists of {op.name}")
        # the op's scheduled tensors, by the group's keys (its beta1 and beta2 are the group's "betas")
        keys = dict.fromkeys("betas" if a.name in ("beta1", "beta2") else a.name for a in op.of(Role.TENSOR))
        return cls(
            family, state_keys, scalar_state_keys,
            lists={**{k: a.name for k, a in zip(state_keys, states)},
                   **{k: a.name for k, a in zip(scalar_state_keys, scalars)}},
            dtypes={k: a.dtype or torch.float32 for k, a in zip(state_keys, states)},
            has_step="steps" in op.names,
            flat_lists=(*(a.name for a in op.args if a.role in BUCKET_LISTS), "master_params"),
            scheduled={k: validators[k] for k in keys},
            options={**own_options, **{GROUP_KEYS.get(a.name, a.name): a for a in op.args if a.role in OPTION_ROLES}})

    @property
    def spec(self) -> OpSpec:
        """The one-call op's description."""
        return self.family.spec

    def state_dtype(self, key: str, param_dtype: torch.dtype) -> torch.dtype:
        """The dtype of state ``key`` of a param of ``param_dtype``: the op's (float32 moments,
        LAMB16's float8), float64 for float64 params' float32 state; scalars and master copies
        float32."""
        dtype = self.dtypes.get(key, torch.float32)
        return torch.float64 if param_dtype == torch.float64 and dtype == torch.float32 \
            and key not in self.scalar_state_keys else dtype

    def param_tensors(self, p: Tensor, state: Mapping[str, Any]) -> list[tuple[str, Tensor]]:
        """(op list argument, tensor) for every tensor param ``p`` brings to an op call."""
        out = [("params", p), ("grads", p.grad), *((arg, state[key]) for key, arg in self.lists.items())]
        if self.has_step:
            out.append(("steps", state["step"]))
        if "master_param" in state:
            out.append(("master_params", state["master_param"]))
        return out


class Stepped(Protocol):
    """An optimizer as the step machinery sees it (``FusedOptimizer`` is one). The methods are
    the hooks a subclass may change."""

    _layout: ClassVar[StateLayout]
    state: Any                    # torch.optim's state: param -> dict of state tensors
    max_tensors_per_call: int     # params per op call of a traced step
    _model: ModelTensors          # every tensor the optimizer was given, in order
    param_groups: list[dict[str, Any]]  # as written (a step reads each group's view: _scheduled.OpGroup)
    _op_view: Any                 # the views as an optimizer of their own, for Dynamo (_base.OpView)

    def _init_state(self, p: Tensor, group: dict[str, Any], master: bool = True) -> dict[str, Any]:
        """Param ``p``'s state, made on first use."""

    def _state_fill(self, key: str, group: dict[str, Any]) -> float:
        """Initial value of state tensor ``key``."""

    def _hypers(self, group: dict[str, Any], bucket: Bucket) -> dict[str, Any]:
        """The op's hyper-parameters for one bucket."""

    def _check_sparse(self, p: Tensor, group: dict[str, Any], name: str) -> None:
        """Raises unless a sparse grad of ``p`` can be stepped."""

    def _step_sparse(self, group: dict[str, Any], bucket: Bucket, grad_scale: Tensor | None,
                     found_inf: Tensor | None) -> None:
        """Steps a bucket of sparse grads."""
