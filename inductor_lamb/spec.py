"""One description per op, read from the op's declaration: the Python side of the op contract.

Every op is declared once, in ``csrc/ops.cpp``: its schema, as literal text, and
its contract (which tensor lists are optimizer state and in which dtype, which
hold one 0-d tensor per param, the columns of the two-phase reductions). An
:class:`OpSpec` reads names, types, defaults and what the op writes from the
registered schema (``torch.ops.lamb.<op>.default._schema``) and the rest from
``torch.ops.lamb._contract``, and adds only what Python needs besides: the
defaults and valid ranges of the scheduled hyper-parameters, which a schema
cannot hold as tensors, and a summary line. Everything else on the Python side
is derived from it:

* the typed wrappers of :mod:`inductor_lamb.ops` (hyper-parameters keyword-only),
* the binding of an op call's arguments by name for the Inductor lowering and
  the decomposition,
* the argument lists of the reference functions (:mod:`inductor_lamb.reference`),
* the op cases of the tests.

The argument checks are the C++ kernels' own (``csrc/common/op_args.cpp``): the
ops' check kernels (registered for PrivateUse3, which the fake implementations
redispatch to) run them, so every compile path rejects at trace time what an
eager call rejects, with the same message, before anything runs.

Scheduled hyper-parameters (``lr``, LAMB's betas, LARS's momentum: whatever
torch's LR schedulers change per step) are 0-d float32 tensors on the params'
device: a new value never recompiles a graph and never syncs the host. Their
values are data, so no kernel checks their range (a compiled step could not do
the same at trace time); the wrappers check a Python float before turning it
into a tensor, and the optimizers check values written into their param groups.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from inspect import Parameter, Signature
from typing import Any

import torch
from torch import Tensor

from . import _C, _private  # noqa: F401  (_C: registers the ops)

__all__ = ["Role", "Arg", "Reduction", "OpSpec", "SPECS", "REQUIRED", "LISTS", "LAMB", "LAMB16", "LARS", "ADAGRAD",
           "NOVOGRAD", "STEPS"]


class Role(Enum):
    PARAMS = "params"        # float32/bfloat16/float16 tensors, updated in place
    GRADS = "grads"          # like params (same shape, dtype, device), read only
    STATE = "state"          # like params in a fixed dtype, updated in place
    SCALARS = "scalars"      # one 0-d float32 tensor per param, updated in place
    MASTER = "master"        # optional float32 copies of the params, updated in place
    TENSOR = "tensor"        # a scheduled hyper-parameter: 0-d float32 tensor on the params' device
    OPT_TENSOR = "opt_tensor"  # optional one-element float32 tensor (grad_scale, found_inf)
    FLOAT = "float"
    BOOL = "bool"
    INT = "int"              # any int64
    FLOATS = "floats"        # one float for every param, or one per param
    BOOLS = "bools"          # none, one for every param, or one per param
    REDUCTIONS = "reductions"  # an apply op's input: float32 [n, k], the reduce op's (all-reduced) output


REQUIRED = Parameter.empty
LISTS = (Role.PARAMS, Role.GRADS, Role.STATE, Role.SCALARS, Role.MASTER)
_POSITIONAL = (Role.PARAMS, Role.GRADS, Role.STATE, Role.SCALARS, Role.REDUCTIONS)
_ANNOTATIONS = {
    Role.PARAMS: "Sequence[Tensor]", Role.GRADS: "Sequence[Tensor]", Role.STATE: "Sequence[Tensor]",
    Role.SCALARS: "Sequence[Tensor]", Role.MASTER: "Sequence[Tensor] | None", Role.TENSOR: "Tensor | float",
    Role.OPT_TENSOR: "Tensor | None", Role.FLOAT: "float", Role.BOOL: "bool", Role.INT: "int",
    Role.FLOATS: "float | Sequence[float]", Role.BOOLS: "bool | Sequence[bool]", Role.REDUCTIONS: "Tensor",
}


@dataclass(frozen=True)
class Arg:
    name: str
    role: Role
    default: Any = REQUIRED
    dtype: torch.dtype | None = None  # STATE and MASTER lists
    lo: float = 0.0                   # valid range of a TENSOR value given as a float
    hi: float = math.inf
    hi_open: bool = False

    def in_range(self, v: float) -> bool:
        return v >= self.lo and (v < self.hi if self.hi_open else v <= self.hi)

    def range_text(self) -> str:
        return f"[{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"

    @property
    def annotation(self) -> str:
        return _ANNOTATIONS[self.role]


@dataclass(frozen=True)
class Reduction:
    """One column of a two-phase op's reductions: a per-tensor partial value and
    how partials of the shards of one tensor combine into the full tensor's."""

    name: str
    combine: str  # "sum" or "max"


@dataclass(frozen=True)
class OpSpec:
    name: str                # op name in torch.ops.lamb
    args: tuple[Arg, ...]    # in schema order
    summary: str             # one line for the wrapper's docstring
    mutates: frozenset[str]  # the arguments this op writes in place
    # Two-phase form (layer-wise ops): the columns of the reductions, the phase
    # this spec describes ("step": the one-call op, "reduce", "apply") and the
    # names of the family's ops.
    reductions: tuple[Reduction, ...] = ()
    phase: str = "step"
    step: str = ""
    reduce_op: str = ""
    apply_op: str = ""

    @property
    def family(self) -> str:
        """The optimizer the op belongs to (``"lamb"`` for ``lamb_step_`` and its phases): the
        name of its files (``csrc/common/<family>.h``, ``_inductor/<family>.py``, ...)."""
        return self.step.removesuffix("_step_")

    @property
    def op(self) -> _private.OpOverload:
        return getattr(torch.ops.lamb, self.name).default

    @property
    def reference(self) -> str:
        """The name of the float64-capable function in inductor_lamb.reference."""
        return self.name.removesuffix("_")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    def of(self, role: Role) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.role is role)

    @property
    def returns(self) -> str:
        return "Tensor" if self.phase == "reduce" else "None"

    def signature(self, *, master: bool = True) -> Signature:
        """Tensor lists positional, hyper-parameters keyword-only."""
        return Signature([Parameter(a.name, Parameter.POSITIONAL_OR_KEYWORD if a.role in _POSITIONAL
                                    else Parameter.KEYWORD_ONLY, default=a.default, annotation=a.annotation)
                          for a in self.args if master or a.role is not Role.MASTER],
                         return_annotation=self.returns)

    def __post_init__(self) -> None:
        # What bind() reads on every call, with and without the master params:
        # (names, defaults, number of positional arguments, the set of names).
        for master in (True, False):
            accepted = [a for a in self.args if master or a.role is not Role.MASTER]
            names = tuple(a.name for a in accepted)
            object.__setattr__(self, f"_bind_{master}", (names, tuple(a.default for a in accepted),
                                                          sum(a.role in _POSITIONAL for a in accepted), frozenset(names)))

    def bind(self, args: Sequence[Any], kwargs: dict[str, Any], *, master: bool = True,
             keyword_only: bool = False) -> dict[str, Any]:
        """An op call's arguments by name (schema order), defaults filled in.
        ``keyword_only``: as the wrappers take them (TypeError for a
        hyper-parameter given by position or an unknown name)."""
        names, defaults, positional, known = getattr(self, f"_bind_{master}")
        if keyword_only:
            if len(args) > positional:
                raise TypeError(f"{self.name}() takes {positional} positional arguments but {len(args)} were given")
            if not known.issuperset(kwargs):
                raise TypeError(f"{self.name}() got an unexpected keyword argument {sorted(set(kwargs) - known)[0]!r}")
        out = dict(zip(names, args))
        for name, default in zip(names[len(args):], defaults[len(args):]):
            if name in kwargs:
                out[name] = kwargs[name]
            elif default is not REQUIRED:
                out[name] = default
            else:
                raise TypeError(f"{self.name}() missing required argument {name!r}")
        for name in names[:len(args)]:
            if name in kwargs:
                raise TypeError(f"{self.name}() got multiple values for argument {name!r}")
        return out

    def to_op_args(self, bound: dict[str, Any]) -> list[Any]:
        """Converts a wrapper call's values to what the op takes: Python floats of
        scheduled hyper-parameters become 0-d float32 tensors on the params' device
        (range-checked first), one float / bool per-param options become lists."""
        device = _device_of(bound)
        out = []
        for a in self.args:
            v = bound[a.name]
            if a.role is Role.TENSOR and not isinstance(v, Tensor):
                v = float(v)
                if not a.in_range(v):
                    raise RuntimeError(f"{self.name}: invalid {a.name} {_num(v)}, expected a value in {a.range_text()}")
                v = _scalar_tensor(v, device)
            elif a.role is Role.FLOATS:
                v = [float(v)] if isinstance(v, (int, float)) else [float(x) for x in v]
            elif a.role is Role.BOOLS:
                v = [bool(v)] if isinstance(v, bool) else [bool(x) for x in v]
            out.append(v)
        return out

    def function(self, body: Callable[[Any], Any], name: str, *, master: bool = True, doc: str | None = None,
                 as_dict: bool = False) -> Callable[..., Any]:
        """A Python function with this op's signature (tensor lists positional,
        hyper-parameters keyword-only, defaults filled in) that calls ``body``
        with the arguments as attributes (``a.params``, ``a.beta1``, ...), or as
        a dict. Dynamo traces the binding like any Python code."""
        wrap = dict if as_dict else _Args

        def call(*args: Any, **kwargs: Any) -> Any:
            return body(wrap(**self.bind(args, kwargs, master=master, keyword_only=True)))

        call.__name__ = call.__qualname__ = name
        call.__doc__ = doc if doc is not None else body.__doc__
        call.__signature__ = self.signature(master=master)  # type: ignore[attr-defined]
        call.__module__ = getattr(body, "__module__", __name__)
        return call

    def wrapper(self) -> Callable[..., Any]:
        """The typed Python function that calls the op."""
        doc = (f"{self.summary}\n\nArguments (their meaning and the math: docs/design.md, "
               f"inductor_lamb.reference):\n\n" + "\n".join(
                   f"    {a.name} ({a.annotation}{'' if a.default is REQUIRED else f', default {a.default!r}'})"
                   + (f": {_ROLE_DOCS[a.role]}" if a.role in _ROLE_DOCS else "")
                   + (f" ({str(a.dtype).removeprefix('torch.')})" if a.role is Role.STATE else "")
                   for a in self.args))
        return self.function(lambda a: self.op(*self.to_op_args(a)), self.name, doc=doc, as_dict=True)


class _Args:
    """An op call's arguments as attributes (dynamo traces this, not SimpleNamespace)."""

    def __init__(self, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            setattr(self, k, v)


def _scalar_tensor(v: float, device: torch.device) -> Tensor:
    """A 0-d float32 tensor of ``v`` on ``device``. While a CUDA graph is being captured, a fill
    kernel (captured with the step) instead of a copy from pageable host memory, which capture
    refuses."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.full((), v, dtype=torch.float32, device=device)
    return torch.tensor(v, dtype=torch.float32, device=device)


def _num(v: float) -> str:
    """A number as the C++ checks print it (``std::ostream``'s default: ``%g``)."""
    return f"{v:g}"


def _device_of(a: dict[str, Any]) -> torch.device:
    """Where the op runs: the params' device (the lr's for an empty call)."""
    params = a["params"]
    if len(params):
        return params[0].device
    lr = a["lr"]
    return lr.device if isinstance(lr, Tensor) else torch.device("cpu")


# ---- what Python adds to the declarations ---------------------------------------------------

# The scheduled hyper-parameters: their defaults (a schema cannot hold a tensor
# default) and the valid range of a value given as a float.
_SCHEDULED = {
    "lr": Arg("lr", Role.TENSOR),
    "beta1": Arg("beta1", Role.TENSOR, 0.9, hi=1.0, hi_open=True),
    "beta2": Arg("beta2", Role.TENSOR, 0.999, hi=1.0, hi_open=True),
    "momentum": Arg("momentum", Role.TENSOR, 0.9),
}
# An op family's own defaults of them, where they differ.
_SCHEDULED_DEFAULTS = {"novograd_step_": {"beta1": 0.95, "beta2": 0.98}}
_SUMMARIES = {
    "lamb_step_": "One LAMB step (apex FusedLAMB semantics) over whole lists of tensors, in place.",
    "lamb16_step_": "One LAMB16 step (LAMB with float8 moments, no bias correction) over whole lists, in place.",
    "lars_step_": "One LARS step over all layers (PaddlePaddle merged ``lars_momentum`` semantics), in place.",
    "adagrad_step_": "One Adagrad step (exactly torch.optim.Adagrad) over whole lists, in place.",
    "novograd_step_": "One NovoGrad step (timm's NvNovoGrad: one second moment a layer) over whole lists, in place.",
}
_ROLE_DOCS = {
    Role.PARAMS: "updated in place (float32, bfloat16 or float16)",
    Role.GRADS: "read only, like the params",
    Role.STATE: "optimizer state shaped like the params",
    Role.SCALARS: "one 0-d float32 tensor per param",
    Role.MASTER: "float32 master copies of low-precision params; the math reads and writes them",
    Role.TENSOR: "0-d float32 tensor on the params' device, or a float (schedulers change it)",
    Role.REDUCTIONS: "float32 [len(params), k] from the reduce op, each column combined across shards",
}


def _role(arg: Any, contract: dict[str, Any]) -> Arg:  # (arg: a schema's torch._C.Argument)
    t, name = str(arg.type), arg.name
    default = arg.default_value if arg.has_default_value() else REQUIRED
    if isinstance(default, list):
        default = tuple(default)
    if t == "List[Tensor]":
        if name in ("params", "grads"):
            return Arg(name, Role.PARAMS if name == "params" else Role.GRADS)
        if name in contract["states"]:
            return Arg(name, Role.STATE, dtype=contract["states"][name])
        assert name in contract["scalars"], name
        return Arg(name, Role.SCALARS)
    if t == "Optional[List[Tensor]]":
        return Arg(name, Role.MASTER, default, dtype=torch.float32)
    if t == "Tensor":
        if name == "reductions":
            return Arg(name, Role.REDUCTIONS)
        default = _SCHEDULED_DEFAULTS.get(contract["step"], {}).get(name)
        return _SCHEDULED[name] if default is None else dataclasses.replace(_SCHEDULED[name], default=default)
    role = {"Optional[Tensor]": Role.OPT_TENSOR, "float": Role.FLOAT, "bool": Role.BOOL, "int": Role.INT,
            "List[float]": Role.FLOATS, "List[bool]": Role.BOOLS}[t]
    return Arg(name, role, default, lo=-math.inf if name in contract["signed"] else 0.0)


def _contract(name: str) -> dict[str, Any]:
    items = dict(item.split("=", 1) for item in torch.ops.lamb._contract(name).split(";"))
    split = lambda v: [x for x in v.split(",") if x]  # noqa: E731
    return {
        "step": items["step"], "reduce": items["reduce"], "apply": items["apply"],
        "states": {k: getattr(torch, v) for k, v in (x.split(":") for x in split(items["states"]))},
        "scalars": split(items["scalars"]), "signed": split(items["signed"]),
        "reductions": tuple(Reduction(*x.split(":")) for x in split(items["reductions"])),
    }


def _spec(name: str) -> OpSpec:
    schema = getattr(torch.ops.lamb, name).default._schema
    c = _contract(name)
    phase = "step" if name == c["step"] else "reduce" if name == c["reduce"] else "apply"
    summary = _SUMMARIES[c["step"]]
    if phase == "reduce":
        cols = ", ".join(f"{r.name} ({r.combine})" for r in c["reductions"])
        summary = (f"Phase 1 of ``{c['step']}``: pass 1, returns the per-tensor partial reductions as float32 "
                   f"[len(params), {len(c['reductions'])}]: {cols}.")
    elif phase == "apply":
        summary = f"Phase 2 of ``{c['step']}``: finishes the step from ``{c['reduce']}``'s reductions."
    return OpSpec(name, tuple(_role(a, c) for a in schema.arguments), summary,
                  frozenset(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write),
                  c["reductions"], phase, c["step"], c["reduce"], c["apply"])


# ---- the ops ---------------------------------------------------------------------------
# A layer-wise op also comes as a *reduce* op (pass 1, the per-tensor partials as one float32
# [n, k] tensor, column j: ``reductions[j]``) and an *apply* op (pass 2 from them), taking the
# one-call op's arguments (apply: plus ``reductions``); the sharded protocol is in
# docs/design.md, "Two-phase form and sharding".

SPECS: dict[str, OpSpec] = {}
for _step in _SUMMARIES:
    _c = _contract(_step)
    for _name in (_c["step"], _c["reduce"], _c["apply"]):
        if _name:
            SPECS[_name] = _spec(_name)
# The one-call step ops, one per optimizer family.
STEPS: tuple[OpSpec, ...] = tuple(SPECS[n] for n in _SUMMARIES)
LAMB, LAMB16, LARS, ADAGRAD, NOVOGRAD = STEPS
