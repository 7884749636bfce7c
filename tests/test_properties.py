"""The op contract as a property, on random calls (hypothesis): random lists of tensors
(shapes with empty and 0-d ones; contiguous, transposed, sliced and expanded strides;
float32, bfloat16, float16 and unsupported dtypes; entries that share memory; lists
whose lengths disagree) and random hyper-parameters (NaN, inf, negative, out of range),
for every op, eagerly and compiled on every path.

The invariant: a call either raises an error that names an argument, with every tensor
bit for bit as before (and, compiled, the eager error), or it matches
``inductor_lamb.reference`` computed in float64.

CI runs the "ci" profile (fixed seed, a budget of about a minute); a long search:
``python -m pytest tests/test_properties.py --hypothesis-profile long``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from bit_cases import available_capabilities
from conftest import noncontiguous_like, spec_lists
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

import inductor_lamb
from inductor_lamb import reference
from inductor_lamb.spec import SPECS, Role

SHAPES = [(), (0,), (1,), (7,), (3, 5), (4, 0, 2), (2, 3, 4), (40,)]
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
NASTY = [math.nan, math.inf, -math.inf, -1.0, 1.5, 0.0]


@dataclass
class Call:
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    story: list[str] = field(default_factory=list)

    def tensors(self) -> list[torch.Tensor]:
        out = []
        for v in [*self.args, *self.kwargs.values()]:
            out += [t for t in (v if isinstance(v, list) else [v]) if isinstance(t, torch.Tensor)]
        return out


def _layout(t: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "expanded":
        if t.dim() == 0 or t.numel() == 0:
            return t
        return t.reshape(-1)[:1].clone().expand(t.shape)
    return t if kind == "contiguous" else noncontiguous_like(t, kind)


_POSITIONAL = (Role.PARAMS, Role.GRADS, Role.STATE, Role.SCALARS, Role.REDUCTIONS)


def _list_index(spec, role: Role) -> list[int]:
    positional = [a for a in spec.args if a.role in _POSITIONAL]
    return [k for k, a in enumerate(positional) if a.role is role]


# What is wrong with a call: nothing (most calls), or one fault of one kind.
FAULTS = [None] * 6 + ["hyper", "layout", "alias", "length", "dtype"]
ALIASES = ["param_twice", "param_is_state", "grad_is_param", "overlapping_views", "scalar_twice"]


def _make_call(draw) -> Call:
    """A random call from the values ``draw(strategy)`` gives: hypothesis's draws when
    planning, the same values replayed when building (fresh tensors, the same ones)."""
    name = draw(st.sampled_from(list(SPECS)))
    spec = SPECS[name]
    fault = draw(st.sampled_from(FAULTS))
    shapes = draw(st.lists(st.sampled_from(SHAPES), min_size=1 if fault in ("alias", "length") else 0, max_size=4))
    dtype = torch.float64 if fault == "dtype" else draw(st.sampled_from([torch.float32, torch.bfloat16,
                                                                         torch.float16]))
    seed = draw(st.integers(0, 2**16))
    args = spec_lists(name, shapes, dtype=dtype, seed=seed)
    story = [f"{name} shapes={shapes} dtype={dtype} fault={fault}"]
    n = len(shapes)
    params_k = _list_index(spec, Role.PARAMS)[0]
    grads_k = _list_index(spec, Role.GRADS)[0]
    states = _list_index(spec, Role.STATE)
    scalars = _list_index(spec, Role.SCALARS)

    # strides: transposed and sliced anywhere; expanded (stride 0) grads are read only, so
    # valid; an expanded param or state is a fault
    for k in [params_k, grads_k, *states]:
        kinds = draw(st.lists(st.sampled_from(["contiguous", "contiguous", "transposed", "strided"]
                                              + (["expanded"] if k == grads_k else [])), min_size=n, max_size=n))
        args[k] = [_layout(t, kind) for t, kind in zip(args[k], kinds)]
        if any(kind != "contiguous" for kind in kinds):
            story.append(f"list {k} layouts {kinds}")
    if fault == "layout" and n:
        k, i = draw(st.sampled_from([params_k, *states])), draw(st.integers(0, n - 1))
        args[k][i] = _layout(args[k][i], "expanded")
        story.append(f"list {k}[{i}] expanded")

    # entries that share memory: one grad for two params is valid (read only)
    same = [(i, j) for i in range(n) for j in range(n) if i < j and shapes[i] == shapes[j] and math.prod(shapes[i])]
    if same and draw(st.booleans()):
        i, j = draw(st.sampled_from(same))
        args[grads_k][j] = args[grads_k][i]
        story.append(f"grads[{j}] is grads[{i}]")
    if fault == "alias":
        alias = draw(st.sampled_from(ALIASES))
        i = draw(st.integers(0, n - 1))
        if alias == "param_twice" and same:
            i, j = draw(st.sampled_from(same))
            args[params_k][j] = args[params_k][i]
        elif alias == "param_is_state" and states:
            args[draw(st.sampled_from(states))][i] = args[params_k][i]
        elif alias == "grad_is_param":
            args[grads_k][i] = args[params_k][i]
        elif alias == "overlapping_views" and n >= 2:
            j = (i + 1) % n
            p = args[params_k][i]
            if p.is_contiguous() and 0 < math.prod(shapes[j]) <= p.numel():
                offset = p.storage_offset() + p.numel() - math.prod(shapes[j])
                args[params_k][j] = p.as_strided(shapes[j], torch.empty(shapes[j]).stride(), offset)
        elif alias == "scalar_twice" and scalars and n >= 2:
            k = draw(st.sampled_from(scalars))
            args[k][1] = args[k][0]
        story.append(f"alias {alias} at {i}")
    if fault == "length":
        k = draw(st.sampled_from([grads_k, *states, *scalars]))
        args[k] = args[k][:-1]
        story.append(f"list {k} one short")

    # hyper-parameters: in range, or (a "hyper" fault) one NaN, inf, negative or out of range
    kwargs: dict[str, Any] = {}
    hypers = [a for a in spec.args if a.role in (Role.TENSOR, Role.FLOAT, Role.FLOATS, Role.BOOLS, Role.OPT_TENSOR)]
    bad = draw(st.sampled_from(hypers)).name if fault == "hyper" else None
    for a in spec.args:
        nasty = a.name == bad
        if a.role is Role.TENSOR:
            # (a scheduled value is read on the device, unchecked: a non-finite or out-of-range
            # one is a valid call too, drawn in one call of six, and must match the reference)
            wild = nasty or draw(st.integers(0, 5)) == 0
            value = draw(st.sampled_from(NASTY)) if wild else draw(st.floats(0.0, 0.99 if a.name != "lr" else 0.1))
            kwargs[a.name] = torch.tensor(value)
        elif a.role is Role.FLOAT:
            default = a.default if isinstance(a.default, float) else 0.0
            kwargs[a.name] = draw(st.sampled_from(NASTY)) if nasty else draw(st.sampled_from([default, 0.0, 1e-3, 0.3]))
        elif a.role is Role.BOOL:
            kwargs[a.name] = draw(st.booleans())
        elif a.role is Role.INT:
            kwargs[a.name] = draw(st.integers(-2**63, 2**63 - 1))
        elif a.role is Role.FLOATS:
            size = draw(st.sampled_from([1, n, n + 1] if nasty else [1, max(n, 1)]))
            values = [draw(st.sampled_from([0.0, 1e-3, 5e-4])) for _ in range(size)]
            if nasty and size:
                values[draw(st.integers(0, size - 1))] = draw(st.sampled_from(NASTY))
            kwargs[a.name] = values
        elif a.role is Role.BOOLS:
            size = draw(st.sampled_from([n + 2, n + 1] if nasty else [0, 1, n]))
            kwargs[a.name] = [draw(st.booleans()) for _ in range(size)]
        elif a.role is Role.OPT_TENSOR:
            if nasty:
                kwargs[a.name] = draw(st.sampled_from([torch.tensor(math.nan), torch.tensor(0.0), torch.ones(2),
                                                       torch.tensor(1.0, dtype=torch.float64)]))
            elif draw(st.booleans()):
                kwargs[a.name] = torch.tensor(draw(st.sampled_from([0.5, 4.0] if a.name == "grad_scale"
                                                                    else [0.0, 0.0, 1.0])))
        elif a.role is Role.MASTER:
            if dtype in (torch.bfloat16, torch.float16) and draw(st.booleans()):
                kwargs[a.name] = [p.float() for p in args[params_k]]
    story.append(f"kwargs {kwargs}")
    return Call(name, args, kwargs, story)


class Plan:
    """The drawn values of one call: :meth:`build` makes its tensors, afresh each time."""

    def __init__(self, values: list[Any]) -> None:
        self.values = values

    def build(self) -> Call:
        values = iter(self.values)
        return _make_call(lambda strategy: next(values))

    def __repr__(self) -> str:
        return "\n".join(self.build().story)


@st.composite
def plans(draw) -> Plan:
    values: list[Any] = []

    def recording(strategy):
        values.append(draw(strategy))
        return values[-1]

    _make_call(recording)
    return Plan(values)


def _clone(x: Any) -> Any:
    if isinstance(x, list):
        return [_clone(t) for t in x]
    return x.clone() if isinstance(x, torch.Tensor) else x


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit for bit (NaN payloads included)."""
    return x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(_BITS[x.element_size()]),
                                                                      y.view(_BITS[y.element_size()]))


def _run(call: Call, fn=None) -> tuple[str | None, Any]:
    """(the error's message, or None; the op's result)."""
    try:
        out = (fn or _op_call)(call.name, call.args, call.kwargs)
        return None, out
    except RuntimeError as e:
        return str(e), None


def _op_call(name, args, kwargs):
    return getattr(torch.ops.lamb, name)(*args, **kwargs)


def _assert_untouched(call: Call, before: list[torch.Tensor]) -> None:
    for i, (t, b) in enumerate(zip(call.tensors(), before)):
        assert _same_bits(t, b), f"tensor {i} was written by a call that raised"


def _assert_error_names_an_argument(call: Call, message: str) -> None:
    assert message.startswith(f"{call.name}: "), message
    names = [a.name for a in SPECS[call.name].args]
    assert any(re.search(rf"\b{n}\b", message) for n in names), message


def _close_fp8(x: torch.Tensor, y: torch.Tensor, where: str) -> None:
    """float8 codes: equal, or the neighbouring code where float32 rounding upstream moved a
    value across a rounding boundary (a few elements)."""
    diff = (x.view(torch.uint8).int() - y.view(torch.uint8).int()).abs()
    diff[x.float().isnan() & y.float().isnan()] = 0  # (NaN codes of either sign)
    if x.numel():
        assert diff.max() <= 1 and int((diff != 0).sum()) <= max(1, x.numel() // 100), f"{where}: {diff}"


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
            torch.float16: dict(rtol=4e-3, atol=4e-3)}[dtype]


def _assert_matches_reference(call: Call, inputs: Call, out: Any) -> None:
    """``call`` ran; ``inputs`` holds its arguments from before. The reference runs on
    float64 copies (master params in place of the params when given)."""
    spec = SPECS[call.name]
    roles = [a.role for a in spec.args if a.role in _POSITIONAL]
    names = [a.name for a in spec.args if a.role in _POSITIONAL]
    ref_args = []  # params, grads and float32 state in float64; float8 state, scalars, reductions as they are
    for role, v in zip(roles, inputs.args):
        if role in (Role.PARAMS, Role.GRADS, Role.STATE):
            ref_args.append([t.clone() if t.dtype in FP8 else t.double() for t in v])
        else:
            ref_args.append(_clone(v))
    kwargs = dict(inputs.kwargs)
    master = kwargs.pop("master_params", None)
    if master is not None:
        ref_args[0] = [m.double() for m in master]
    ref_out = getattr(reference, spec.reference)(*ref_args, **kwargs)
    if spec.phase == "reduce":
        torch.testing.assert_close(out.double(), ref_out.double(), rtol=1e-4, atol=1e-5, equal_nan=True)
    for name, got, want in zip(names, call.args, ref_args):
        if not isinstance(got, list):
            continue
        for i, (x, y) in enumerate(zip(got, want)):
            where = f"{name}[{i}]"
            if x.dtype in FP8:
                _close_fp8(x, y, where)
            elif name == "params" and master is not None:
                torch.testing.assert_close(call.kwargs["master_params"][i].double(), y, **_tolerance(torch.float32),
                                           equal_nan=True, msg=lambda m: f"master_params[{i}]: {m}")
                # (the param is its new master rounded to nearest, exactly: a tolerance would let
                # a master stepped twice pass)
                rounded = call.kwargs["master_params"][i].to(x.dtype)
                nan = x.isnan()
                assert torch.equal(nan, rounded.isnan()) and _same_bits(x.masked_fill(nan, 0), rounded.masked_fill(nan, 0)), \
                    f"{where} is not its master rounded"
            else:
                torch.testing.assert_close(x.double(), y.double(), **_tolerance(x.dtype if name == "params"
                                                                               else torch.float32),
                                           equal_nan=True, msg=lambda m: f"{where}: {m}")


def _compiled_op(path: str) -> Any:
    """The raw op call compiled on compile path ``path`` (fresh: dynamo reset)."""
    inductor_lamb.set_compile_path(path)
    torch._dynamo.reset()
    return torch.compile(_op_call, fullgraph=True, dynamic=False)


def _run_and_match_the_reference(build, path: str | None) -> Call:
    """Runs ``build()``'s call eagerly (path None) or compiled on ``path``; it must not raise and
    must match the reference. Returns the call, its tensors stepped."""
    call = build()
    error, out = _run(call, None if path is None else _compiled_op(path))
    assert error is None, error
    _assert_matches_reference(call, build(), out)
    return call


def _check(plan: Plan, compiled_path: str | None = None) -> None:
    call, inputs = plan.build(), plan.build()
    for line in call.story:
        note(line)
    before = [t.clone() for t in call.tensors()]
    fn = None
    if compiled_path is not None:
        eager_error, _ = _run(plan.build())
        fn = _compiled_op(compiled_path)
    error, out = _run(call, fn)
    if compiled_path is not None:  # the eager error, which dynamo may wrap in lines of its own
        assert (error is None) == (eager_error is None), f"compiled: {error!r}, eager: {eager_error!r}"
        if error is not None:
            assert eager_error.splitlines()[0] in error, f"compiled: {error!r}, eager: {eager_error!r}"
            error = eager_error
    if error is not None:
        error = error.splitlines()[0]
    event(f"{call.name}: {'error' if error else 'ran'}")
    if error is not None:
        event(f"error: {re.sub(r'[0-9]+', 'N', error.split(': ', 1)[1])[:60]}")
        note(f"error: {error}")
        _assert_error_names_an_argument(call, error)
        _assert_untouched(call, before)
    else:
        _assert_matches_reference(call, inputs, out)


@given(plans())
def test_every_call_errors_cleanly_or_matches_the_reference(plan):
    _check(plan)


@pytest.fixture(scope="module")
def reset_path():
    yield
    inductor_lamb.set_compile_path("auto")
    torch._dynamo.reset()


@settings(max_examples=max(4, settings().max_examples // 25))  # (a compile per example)
@given(plans(), st.sampled_from(inductor_lamb._inductor.PATHS))
def test_every_compiled_call_errors_like_eager_or_matches_the_reference(reset_path, plan, path):
    _check(plan, path)


# (the ops that scale the param: a reduce op only reads it)
DECOUPLED_OPS = [name for name, spec in SPECS.items()
                 if any(a.name == "decoupled_decay" for a in spec.args) and spec.phase != "reduce"]


@pytest.mark.parametrize("path", [None, *inductor_lamb._inductor.PATHS])
@pytest.mark.parametrize("max_lr", [0.0, 0.05])
@pytest.mark.parametrize("lr", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize("name", DECOUPLED_OPS)
def test_decoupled_decay_without_weight_decay_leaves_the_param_unscaled(reset_path, name, lr, max_lr, path):
    # (1 - lr * 0 is NaN where lr is infinite: with no weight decay the param takes no factor at
    # all, as in the reference; found by the long search)
    shapes = [(), (7,), (3, 5)]

    def build() -> Call:
        kwargs = {a.name: torch.tensor(0.9) for a in SPECS[name].args if a.role is Role.TENSOR}
        kwargs.update(lr=torch.tensor(lr), weight_decay=0.0, decoupled_decay=True, max_lr=max_lr)
        return Call(name, spec_lists(name, shapes, seed=3), kwargs, [f"{name} lr={lr} max_lr={max_lr}"])

    _run_and_match_the_reference(build, path)


@pytest.mark.parametrize("path", [None, *inductor_lamb._inductor.PATHS])
@pytest.mark.parametrize("stochastic_rounding", [True, False])
@pytest.mark.parametrize("cap", available_capabilities())
def test_lamb16_saturates_a_negative_v_like_a_positive_one(reset_path, cap, stochastic_rounding, path):
    # With beta2 > 1 (out of range, not refused by the op) v goes negative, and an apply op given a
    # smaller amax v than its data would overflow its code: every backend saturates it at the
    # format's max, as it does m and a positive v (it was NaN, -inf or -57344 by backend; found by
    # the long search).
    inductor_lamb.set_cpu_capability(cap)
    shapes = [(), (40,)]

    def build() -> Call:
        args = spec_lists("lamb16_apply_", shapes, seed=5)
        args[-1][:, 3] = 1e-3  # amax v, far below the data's
        kwargs = {"lr": torch.tensor(1e-3), "beta1": torch.tensor(0.5), "beta2": torch.tensor(1.5),
                  "stochastic_rounding": stochastic_rounding}
        return Call("lamb16_apply_", args, kwargs, [f"cap={cap} path={path}"])

    v8 = _run_and_match_the_reference(build, path).args[3]
    assert all(torch.isfinite(v.float()).all() for v in v8) and (v8[1].float() == -57344.0).any()
