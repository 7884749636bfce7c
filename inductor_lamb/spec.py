"""One description per op: the Python side of the op contract.

Each :class:`OpSpec` lists an op's arguments in schema order with their role
(a list shaped like the params, a list of 0-d float32 per-tensor scalars, a
scheduled 0-d tensor hyper-parameter, a float, a per-param list, ...), type,
default and valid range. Everything else on the Python side is derived from it:

* the typed wrappers of :mod:`inductor_lamb.ops` (hyper-parameters keyword-only),
* the fake implementations and the trace-time checks (:func:`check`), which
  raise exactly the C++ kernels' errors, so a compiled call rejects what an
  eager call rejects, before anything runs,
* the binding of an op call's arguments by name for the Inductor lowering and
  the decomposition,
* the argument lists of the reference functions (:mod:`inductor_lamb.reference`),
* the op cases of the tests.

``csrc/ops.cpp`` stays the one C++ schema; ``tests/test_spec.py`` checks that
both agree on names, order and defaults.

Scheduled hyper-parameters (``lr``, LAMB's betas, LARS's momentum: whatever
torch's LR schedulers change per step) are 0-d float32 tensors on the params'
device, like ``lr``: a new value never recompiles a graph and never syncs the
host. Their values are data, so no kernel checks their range (a compiled step
could not do the same at trace time); the wrappers check a Python float before
turning it into a tensor, and the optimizers check values written into their
param groups.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

__all__ = ["Role", "Arg", "Reduction", "OpSpec", "SPECS", "check", "spec_of"]


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


REQUIRED = inspect.Parameter.empty
_LISTS = (Role.PARAMS, Role.GRADS, Role.STATE, Role.SCALARS, Role.MASTER)
_POSITIONAL = (Role.PARAMS, Role.GRADS, Role.STATE, Role.SCALARS, Role.REDUCTIONS)
_WRITABLE = (Role.PARAMS, Role.STATE, Role.SCALARS, Role.MASTER)


@dataclass(frozen=True)
class Arg:
    name: str
    role: Role
    default: Any = REQUIRED
    dtype: torch.dtype | None = None  # STATE lists
    lo: float = 0.0                   # valid range of a FLOAT / FLOATS / TENSOR value
    hi: float = math.inf
    hi_open: bool = False
    doc: str = ""

    def in_range(self, v: float) -> bool:
        return v >= self.lo and (v < self.hi if self.hi_open else v <= self.hi)

    def range_text(self) -> str:
        return f"[{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"

    @property
    def annotation(self) -> str:
        return {
            Role.PARAMS: "Sequence[Tensor]", Role.GRADS: "Sequence[Tensor]", Role.STATE: "Sequence[Tensor]",
            Role.SCALARS: "Sequence[Tensor]", Role.MASTER: "Sequence[Tensor] | None",
            Role.TENSOR: "Tensor | float", Role.OPT_TENSOR: "Tensor | None", Role.FLOAT: "float",
            Role.BOOL: "bool", Role.INT: "int", Role.FLOATS: "float | Sequence[float]",
            Role.BOOLS: "bool | Sequence[bool]",
            Role.REDUCTIONS: "Tensor",
        }[self.role]


@dataclass(frozen=True)
class Reduction:
    """One column of a two-phase op's reductions: a per-tensor partial value and
    how partials of the shards of one tensor combine into the full tensor's."""

    name: str
    combine: str  # "sum" or "max"
    doc: str = ""


@dataclass(frozen=True)
class OpSpec:
    name: str                # op name in torch.ops.lamb
    args: tuple[Arg, ...]    # in schema order
    summary: str             # one line for the wrapper's docstring
    reference: str           # name of the float64-capable function in inductor_lamb.reference
    # Two-phase form (layer-wise ops): the columns of the reductions, and the
    # phase this spec describes ("step": the one-call op, "reduce", "apply").
    reductions: tuple[Reduction, ...] = ()
    phase: str = "step"
    step: str = ""           # the one-call op of a phase ("" for a one-call op)
    writes: tuple[str, ...] | None = None  # lists this op writes (None: every writable list)

    @property
    def op(self) -> torch._ops.OpOverload:
        return getattr(torch.ops.lamb, self.name).default

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)

    @property
    def reduce_op(self) -> str:
        return self.name.replace("_step_", "_reduce_" if self.name != "lars_step_" else "_reduce")

    @property
    def apply_op(self) -> str:
        return self.name.replace("_step_", "_apply_")

    def of(self, role: Role) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if a.role is role)

    @property
    def mutates(self) -> frozenset[str]:
        """The arguments this op writes in place."""
        if self.writes is not None:
            return frozenset(self.writes)
        return frozenset(a.name for a in self.args if a.role in _WRITABLE)

    @property
    def returns(self) -> str:
        return "Tensor" if self.phase == "reduce" else "None"

    def signature(self, *, master: bool = True) -> inspect.Signature:
        """Tensor lists positional, hyper-parameters keyword-only."""
        params = []
        for a in self.args:
            if a.role is Role.MASTER and not master:
                continue
            kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if a.role in _POSITIONAL \
                else inspect.Parameter.KEYWORD_ONLY
            params.append(inspect.Parameter(a.name, kind, default=a.default, annotation=a.annotation))
        return inspect.Signature(params, return_annotation=self.returns)

    def bind(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """An op call's arguments by name (schema order), spec defaults filled in."""
        out: dict[str, Any] = {}
        for i, a in enumerate(self.args):
            if i < len(args):
                out[a.name] = args[i]
            elif a.name in kwargs:
                out[a.name] = kwargs[a.name]
            elif a.default is not REQUIRED:
                out[a.name] = a.default
            else:
                raise TypeError(f"{self.name}: missing argument {a.name!r}")
        return out

    def to_op_args(self, bound: dict[str, Any]) -> list[Any]:
        """Converts a wrapper call's values to what the op takes: Python floats of
        scheduled hyper-parameters become 0-d float32 tensors on the params' device
        (range-checked first), one float / bool per-param options become lists."""
        device = device_of(bound)
        out = []
        for a in self.args:
            v = bound[a.name]
            if a.role is Role.TENSOR and not isinstance(v, Tensor):
                v = float(v)
                if not a.in_range(v):
                    raise RuntimeError(f"{self.name}: invalid {a.name} {_num(v)}, expected a value in {a.range_text()}")
                v = torch.tensor(v, dtype=torch.float32, device=device)
            elif a.role is Role.FLOATS:
                v = [float(v)] if isinstance(v, (int, float)) else [float(x) for x in v]
            elif a.role is Role.BOOLS:
                v = [bool(v)] if isinstance(v, bool) else [bool(x) for x in v]
            out.append(v)
        return out

    def function(self, body: Callable[[Any], Any], name: str, *, master: bool = True, doc: str | None = None,
                 as_dict: bool = False) -> Callable[..., Any]:
        """A Python function with this op's signature (tensor lists positional,
        hyper-parameters keyword-only, spec defaults) that calls ``body`` with the
        arguments as attributes (``a.params``, ``a.beta1``, ...), or as a dict."""
        sig = self.signature(master=master)
        # A real function with these parameters (generated from the spec, not
        # Signature.bind at call time): dynamo traces it like hand-written code.
        params = list(sig.parameters.values())
        text = ", ".join(
            ("*, " if p.kind is p.KEYWORD_ONLY and (i == 0 or params[i - 1].kind is not p.KEYWORD_ONLY) else "")
            + p.name + ("" if p.default is REQUIRED else f"=_defaults[{p.name!r}]")
            for i, p in enumerate(params))
        names = ", ".join(f"{p.name}={p.name}" for p in params)
        scope = {"_defaults": {p.name: p.default for p in params}, "_body": body,
                 "_args": dict if as_dict else _Args}
        exec(f"def {name}({text}):\n    return _body(_args({names}))\n", scope)  # noqa: S102
        call = scope[name]
        call.__qualname__ = name
        call.__doc__ = doc if doc is not None else body.__doc__
        call.__annotations__ = {p.name: p.annotation for p in params} | {"return": self.returns}
        call.__module__ = getattr(body, "__module__", __name__)
        return call

    def wrapper(self) -> Callable[..., Any]:
        """The typed Python function that calls the op."""
        doc = f"{self.summary}\n\nArguments (the math: docs/design.md, inductor_lamb.reference):\n\n" + "\n".join(
            f"    {a.name} ({a.annotation}{'' if a.default is REQUIRED else f', default {a.default!r}'}): {a.doc}"
            for a in self.args)
        return self.function(lambda a: self.op(*self.to_op_args(a)), self.name, doc=doc, as_dict=True)


class _Args:
    """An op call's arguments as attributes (dynamo traces this, not SimpleNamespace)."""

    def __init__(self, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            setattr(self, k, v)


def _num(v: float) -> str:
    """A number as the C++ checks print it (``std::ostream``'s default: ``%g``)."""
    return f"{v:g}"


# ---- the ops ---------------------------------------------------------------------------
# Docs shared by several ops.
_P = "params, updated in place (float32, bfloat16 or float16)"
_G = "gradients, read only (like the params)"
_STEPS = "0-d float32 step counts, incremented by one before use"
_LR = "learning rate: 0-d float32 tensor on the params' device (a float is converted)"
_GS = "grads are divided by it (torch.amp.GradScaler)"
_FI = "nonzero: skip the whole step, nothing is written (torch.amp.GradScaler)"
_MP = "float32 master copies of low-precision params; the math reads and writes them"


def _common_tail() -> tuple[Arg, ...]:
    return (Arg("grad_scale", Role.OPT_TENSOR, None, doc=_GS), Arg("found_inf", Role.OPT_TENSOR, None, doc=_FI),
            Arg("master_params", Role.MASTER, None, dtype=torch.float32, doc=_MP))


def _beta(name: str, default: float, what: str) -> Arg:
    return Arg(name, Role.TENSOR, default, lo=0.0, hi=1.0, hi_open=True,
               doc=f"decay of the running average of {what} (0-d tensor or float; schedulers change it)")


_F32 = torch.float32
LAMB = OpSpec("lamb_step_", (
    Arg("params", Role.PARAMS, doc=_P), Arg("grads", Role.GRADS, doc=_G),
    Arg("exp_avgs", Role.STATE, dtype=_F32, doc="first moments m (float32)"),
    Arg("exp_avg_sqs", Role.STATE, dtype=_F32, doc="second moments v (float32)"),
    Arg("steps", Role.SCALARS, doc=_STEPS),
    Arg("lr", Role.TENSOR, lo=0.0, doc=_LR),
    _beta("beta1", 0.9, "the gradient"), _beta("beta2", 0.999, "its square"),
    Arg("eps", Role.FLOAT, 1e-06, doc="added to sqrt(v)"),
    Arg("weight_decay", Role.FLOAT, 0.01, doc="decoupled weight decay inside the update u"),
    Arg("bias_correction", Role.BOOL, True, doc="Adam's bias corrections"),
    Arg("grad_averaging", Role.BOOL, True, doc="m accumulates (1 - beta1) g, else g"),
    Arg("always_adapt", Role.BOOL, False, doc="trust ratio even when weight_decay == 0"),
    Arg("trust_clip", Role.BOOL, False, doc="trust ratio clipped at 1"),
    Arg("max_grad_norm", Role.FLOAT, 0.0, doc="> 0: clip by the global norm of all grads of the call"),
    *_common_tail(),
), "One LAMB step (apex FusedLAMB semantics) over whole lists of tensors, in place.", "lamb_step",
    (Reduction("p_sumsq", "sum", "||p||^2"), Reduction("u_sumsq", "sum", "||u||^2")))

LAMB16 = OpSpec("lamb16_step_", (
    Arg("params", Role.PARAMS, doc=_P), Arg("grads", Role.GRADS, doc=_G),
    Arg("exp_avgs", Role.STATE, dtype=torch.float8_e4m3fn, doc="m / exp_avg_scales[i] in float8_e4m3fn"),
    Arg("exp_avg_sqs", Role.STATE, dtype=torch.float8_e5m2, doc="v / exp_avg_sq_scales[i] in float8_e5m2"),
    Arg("exp_avg_scales", Role.SCALARS, doc="0-d float32 scales of m, rewritten every step from amax |m|"),
    Arg("exp_avg_sq_scales", Role.SCALARS, doc="0-d float32 scales of v, rewritten every step from amax v"),
    Arg("steps", Role.SCALARS, doc=_STEPS),
    Arg("lr", Role.TENSOR, lo=0.0, doc=_LR),
    _beta("beta1", 0.9, "the gradient"), _beta("beta2", 0.999, "its square"),
    Arg("eps", Role.FLOAT, 1e-06, doc="added to sqrt(v)"),
    Arg("weight_decay", Role.FLOAT, 0.0, doc="decoupled weight decay inside the update u"),
    Arg("trust_scale", Role.FLOAT, 0.382, doc="exponent of the lr-rescaled trust ratio (0: no adaptation)"),
    Arg("stochastic_rounding", Role.BOOL, True,
        doc="round m, v to float8 stochastically (unbiased: no drift of the moments); False: to nearest even"),
    Arg("seed", Role.INT, 0, doc="seed of the rounding's random bits, which hash (seed, step, grad, stored codes) "
                                 "per element: the same on every backend, shard and thread count"),
    *_common_tail(),
), "One LAMB16 step (LAMB with float8 moments, no bias correction) over whole lists, in place.", "lamb16_step",
    (Reduction("p_sumsq", "sum", "||p||^2"), Reduction("u_sumsq", "sum", "||u||^2"),
     Reduction("m_amax", "max", "max |m| of the new m"), Reduction("v_amax", "max", "max v of the new v")))

LARS = OpSpec("lars_step_", (
    Arg("params", Role.PARAMS, doc=_P), Arg("grads", Role.GRADS, doc=_G),
    Arg("momentum_buffers", Role.STATE, dtype=_F32, doc="momentum buffers (float32, start at zero)"),
    Arg("lr", Role.TENSOR, lo=0.0, doc=_LR),
    Arg("momentum", Role.TENSOR, 0.9, lo=0.0, doc="momentum factor (0-d tensor or float; schedulers change it)"),
    Arg("lars_coeff", Role.FLOAT, 0.001, doc="trust coefficient eta"),
    Arg("eps", Role.FLOAT, 0.0, doc="added to the local lr's denominator"),
    Arg("rescale_grad", Role.FLOAT, 1.0, lo=-math.inf, doc="grads are multiplied by it"),
    Arg("weight_decay", Role.FLOATS, (0.0005,), doc="one value, or one per param (excluded layers: 0)"),
    Arg("layer_adaptation", Role.BOOLS, (), doc="one value, or one per param; none: all adapted"),
    *_common_tail(),
), "One LARS step over all layers (PaddlePaddle merged lars_momentum semantics), in place.", "lars_step",
    (Reduction("p_sumsq", "sum", "||p||^2"), Reduction("g_sumsq", "sum", "||g||^2 of the rescaled grads")))

ADAGRAD = OpSpec("adagrad_step_", (
    Arg("params", Role.PARAMS, doc=_P), Arg("grads", Role.GRADS, doc=_G),
    Arg("state_sums", Role.STATE, dtype=_F32, doc="running sums of squared grads (torch.optim.Adagrad's 'sum')"),
    Arg("steps", Role.SCALARS, doc=_STEPS),
    Arg("lr", Role.TENSOR, lo=0.0, doc=_LR),
    Arg("lr_decay", Role.FLOAT, 0.0, doc="lr / (1 + (t - 1) lr_decay)"),
    Arg("weight_decay", Role.FLOAT, 0.0, doc="L2 penalty added to the gradient"),
    Arg("eps", Role.FLOAT, 1e-10, doc="added to sqrt(sum)"),
    Arg("maximize", Role.BOOL, False, doc="maximize the objective"),
    *_common_tail(),
), "One Adagrad step (exactly torch.optim.Adagrad) over whole lists, in place.", "adagrad_step")


# ---- two-phase forms -------------------------------------------------------------------
# A layer-wise step needs per-tensor reductions (norms, amaxes) between its two
# passes. Its *reduce* op does pass 1 and returns them as one float32 [n, k]
# tensor (column j: ``reductions[j]``); its *apply* op takes them, after the
# caller may have combined the partials of each tensor's shards across ranks
# (``combine``: sum or max), and does pass 2. Both take the one-call op's
# arguments (apply: plus ``reductions`` after the tensor lists), so they check
# the same things; the one-call op is exactly reduce then apply, bit for bit.
#
# Protocol of a sharded step (each rank holds shards of the same tensors):
#   1. with global grad clipping only: the sum of squares of the local grads,
#      combined (sum) across ranks, gives the clip factor; fold it into
#      grad_scale and pass max_grad_norm=0 (the clip must be known before pass 1
#      writes the moments, so it cannot ride on the reduce op's collective);
#   2. r = <op>_reduce(...): local partials;
#   3. combine r across the ranks sharding each tensor (one collective);
#   4. <op>_apply_(..., r, ...).
# At most 2 collectives per step, 1 without clipping; no host sync.


def _two_phase(step: OpSpec, reduce_writes: tuple[str, ...], apply_writes: tuple[str, ...]) -> tuple[OpSpec, OpSpec]:
    """The reduce and apply specs of a layer-wise step (``lars_reduce`` writes
    nothing, hence no trailing underscore)."""
    reduce_name, apply_name = step.reduce_op, step.apply_op
    cols = ", ".join(f"{c.name} ({c.combine})" for c in step.reductions)
    reduce = replace(step, name=reduce_name, phase="reduce", step=step.name, writes=reduce_writes,
                     reference=step.reference.replace("_step", "_reduce"),
                     summary=f"Phase 1 of {step.name}: pass 1, returns the per-tensor partial reductions "
                             f"as float32 [len(params), {len(step.reductions)}]: {cols}.")
    lr = step.names.index("lr")
    apply_args = (*step.args[:lr], Arg("reductions", Role.REDUCTIONS, doc=f"float32 [len(params), "
                  f"{len(step.reductions)}] from {reduce_name}, each column combined across shards: {cols}"),
                  *step.args[lr:])
    apply = replace(step, name=apply_name, args=apply_args, phase="apply", step=step.name, writes=apply_writes,
                    reference=step.reference.replace("_step", "_apply"),
                    summary=f"Phase 2 of {step.name}: finishes the step from {reduce_name}'s reductions.")
    return reduce, apply


LAMB_REDUCE, LAMB_APPLY = _two_phase(LAMB, ("exp_avgs", "exp_avg_sqs", "steps"), ("params", "master_params"))
LAMB16_REDUCE, LAMB16_APPLY = _two_phase(
    LAMB16, ("steps",), ("params", "exp_avgs", "exp_avg_sqs", "exp_avg_scales", "exp_avg_sq_scales", "master_params"))
LARS_REDUCE, LARS_APPLY = _two_phase(LARS, (), ("params", "momentum_buffers", "master_params"))

SPECS: dict[str, OpSpec] = {s.name: s for s in (LAMB, LAMB16, LARS, ADAGRAD, LAMB_REDUCE, LAMB_APPLY, LAMB16_REDUCE,
                                                LAMB16_APPLY, LARS_REDUCE, LARS_APPLY)}


def spec_of(name: str) -> OpSpec:
    return SPECS[name]


# ---- the checks -------------------------------------------------------------------------
# The same checks, order and messages as csrc/common/op_args.cpp (TORCH_CHECK raises
# RuntimeError). Run by the fake implementations, so every compile path applies them
# at trace time, before any tensor is touched.

_CPP_DTYPES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.float8_e4m3fn: "Float8_e4m3fn", torch.float8_e5m2: "Float8_e5m2", torch.int64: "Long",
    torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
    torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}
_CPP_LAYOUTS = {torch.strided: "Strided", torch.sparse_coo: "Sparse", torch.sparse_csr: "SparseCsr",
                torch.sparse_csc: "SparseCsc", torch.sparse_bsr: "SparseBsr", torch.sparse_bsc: "SparseBsc"}
_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _dtype(d: torch.dtype) -> str:
    return _CPP_DTYPES.get(d, str(d))


def _shape(t: Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def device_of(a: dict[str, Any]) -> torch.device:
    """Where the op runs: the params' device (the lr's for an empty call)."""
    params = a["params"]
    if len(params):
        return params[0].device
    lr = a["lr"]
    return lr.device if isinstance(lr, Tensor) else torch.device("cpu")


def check(spec: OpSpec, a: dict[str, Any]) -> None:
    """Raises the kernels' RuntimeError for a bad call of ``spec``'s op with bound
    arguments ``a``; returns quietly for a good one."""
    op = spec.name

    def fail(msg: str) -> None:
        raise RuntimeError(f"{op}: {msg}")

    device = device_of(a)
    params, grads = a["params"], a["grads"]
    n = len(params)
    rows = [(x.name, a[x.name], x.dtype) for x in (*spec.of(Role.STATE), *spec.of(Role.MASTER)) if a[x.name] is not None]

    # lengths, then per index: param, grad, state rows
    for name, lst, _ in [("grads", grads, None), *rows]:
        if len(lst) != n:
            fail(f"{name} has {len(lst)} tensors but params has {n}")

    def dense_on(t: Tensor, name: str, i: int, dev: torch.device) -> None:
        if t.layout != torch.strided:
            fail(f"{name}[{i}] has layout {_CPP_LAYOUTS.get(t.layout, str(t.layout))}; only dense (strided) tensors "
                 "are supported (sparse gradients are not)")
        if t.device != dev:
            fail(f"{name}[{i}] is on {t.device} but expected {dev}")

    def like_param(t: Tensor, name: str, i: int, dtype: torch.dtype) -> None:
        dense_on(t, name, i, params[i].device)
        if t.shape != params[i].shape:
            fail(f"{name}[{i}] has shape {_shape(t)} but params[{i}] has shape {_shape(params[i])}")
        if t.dtype != dtype:
            fail(f"{name}[{i}] has dtype {_dtype(t.dtype)}, expected {_dtype(dtype)}")

    for i, p in enumerate(params):
        dense_on(p, "params", i, device)
        if p.dtype not in _PARAM_DTYPES:
            fail(f"params[{i}] has dtype {_dtype(p.dtype)}; supported: float32, bfloat16, float16")
        like_param(grads[i], "grads", i, p.dtype)
        for name, lst, dtype in rows:
            like_param(lst[i], name, i, dtype)

    def float32_on_device(t: Tensor, where: str) -> None:
        if t.dtype != torch.float32:
            fail(f"{where} must be float32, got {_dtype(t.dtype)}")
        if t.device != device:
            fail(f"{where} is on {t.device} but expected {device}")

    def scalar_tensor(t: Any, where: str) -> None:
        if not isinstance(t, Tensor):
            fail(f"{where} must be a tensor, got {type(t).__name__}")
        if t.dim() != 0:
            fail(f"{where} must be a 0-d tensor, got shape {_shape(t)}")
        float32_on_device(t, where)

    for x in spec.of(Role.SCALARS):
        lst = a[x.name]
        if len(lst) != n:
            fail(f"{x.name} has {len(lst)} tensors but params has {n}")
        for i, t in enumerate(lst):
            scalar_tensor(t, f"{x.name}[{i}]")
    for x in spec.of(Role.TENSOR):
        scalar_tensor(a[x.name], x.name)
    for x in spec.of(Role.OPT_TENSOR):
        t = a[x.name]
        if t is None:
            continue
        if t.numel() != 1:
            fail(f"{x.name} must have one element, got shape {_shape(t)}")
        float32_on_device(t, x.name)
    for x in spec.args:
        v = a[x.name]
        if x.role is Role.FLOAT:
            if not x.in_range(float(v)):
                fail(f"invalid {x.name} {_num(float(v))}, expected a value in {x.range_text()}")
        elif x.role is Role.FLOATS:
            if len(v) not in (1, n):
                fail(f"{x.name} has {len(v)} values; expected 1 or one per param ({n})")
            for i, w in enumerate(v):
                if not x.in_range(float(w)):
                    fail(f"invalid {x.name}[{i}] {_num(float(w))}, expected a value in {x.range_text()}")
        elif x.role is Role.BOOLS:
            if len(v) > 1 and len(v) != n:
                fail(f"{x.name} has {len(v)} values; expected 0, 1 or one per param ({n})")
    for x in spec.of(Role.REDUCTIONS):  # last, as the kernels check it
        t, k = a[x.name], len(spec.reductions)
        if t.layout != torch.strided or t.dim() != 2 or tuple(t.shape) != (n, k):
            fail(f"{x.name} must have shape [{n}, {k}] (params x partial reductions), got {_shape(t)}")
        float32_on_device(t, x.name)
