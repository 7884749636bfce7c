"""The op descriptions (inductor_lamb/spec.py): agreement with the C++ schema, the
derived wrappers, and validation parity: every bad call fails with the eager
kernel's error on every compile path, at trace time, touching nothing."""

from __future__ import annotations

import inspect

import pytest
import torch
from conftest import clone_lists, equal, raw_op_kwargs, spec_lists

import inductor_lamb
from inductor_lamb import ops, reference
from inductor_lamb.spec import REQUIRED, SPECS, Role

PATHS = inductor_lamb._inductor.PATHS


@pytest.mark.parametrize("name", list(SPECS))
def test_spec_matches_registered_schema(name):
    spec, schema = SPECS[name], SPECS[name].op._schema
    assert [a.name for a in schema.arguments] == list(spec.names)
    for a, s in zip(spec.args, schema.arguments):
        if a.role is Role.TENSOR:  # the schema cannot hold a tensor default: the wrappers give it
            assert not s.has_default_value() and str(s.type) == "Tensor", a.name
            continue
        assert s.has_default_value() == (a.default is not REQUIRED), a.name
        if s.has_default_value():
            default = list(a.default) if isinstance(a.default, tuple) else a.default
            assert s.default_value == default, a.name
        expected = {Role.PARAMS: "List[Tensor]", Role.GRADS: "List[Tensor]", Role.STATE: "List[Tensor]",
                    Role.SCALARS: "List[Tensor]", Role.MASTER: "Optional[List[Tensor]]",
                    Role.OPT_TENSOR: "Optional[Tensor]", Role.FLOAT: "float", Role.BOOL: "bool",
                    Role.INT: "int", Role.FLOATS: "List[float]", Role.BOOLS: "List[bool]", Role.REDUCTIONS: "Tensor"}[a.role]
        assert str(s.type) == expected, a.name
        assert (s.alias_info is not None and s.alias_info.is_write) == (a.name in spec.mutates), a.name
    assert [str(r.type) for r in schema.returns] == (["Tensor"] if spec.phase == "reduce" else [])


@pytest.mark.parametrize("name", list(SPECS))
def test_wrappers_and_references_take_hyperparameters_by_keyword(name):
    spec = SPECS[name]
    for fn, master in ((getattr(ops, name), True), (getattr(reference, spec.reference), False)):
        sig = inspect.signature(fn)
        lists = [a.name for a in spec.args
                 if a.role in (Role.PARAMS, Role.GRADS, Role.STATE, Role.SCALARS, Role.REDUCTIONS)]
        positional = [p.name for p in sig.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert positional == lists
        keyword = [p.name for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY]
        assert keyword == [a.name for a in spec.args if a.name not in lists and (master or a.role is not Role.MASTER)]
    args = spec_lists(name, [(3, 2), (4,)])
    with pytest.raises(TypeError):
        getattr(ops, name)(*args, torch.tensor(0.1))  # lr is keyword-only


def test_wrapper_turns_floats_into_tensors_and_checks_them():
    args = spec_lists("lamb_step_", [(3, 2), (4,)])
    expected = clone_lists(args)
    torch.ops.lamb.lamb_step_(*expected, torch.tensor(0.01), torch.tensor(0.8), torch.tensor(0.99))
    ops.lamb_step_(*args, lr=0.01, beta1=0.8, beta2=0.99)
    assert all(equal(x, y) for a, b in zip(args, expected) for x, y in zip(a, b))
    with pytest.raises(RuntimeError, match=r"lamb_step_: invalid beta1 1.5, expected a value in \[0, 1\)"):
        ops.lamb_step_(*args, lr=0.01, beta1=1.5)


# ---- validation parity -------------------------------------------------------------------

SHAPES = [(3, 4), (5,), ()]


def _set(list_index, i, value):
    def mutate(args, kw):
        args[list_index] = list(args[list_index])
        if i is None:
            args[list_index] = args[list_index][:-1]
        else:
            args[list_index][i] = value(args[list_index][i])
    return mutate


def _alias(args, dst, src):
    """Makes list entry ``dst`` (list, index) the very tensor at ``src``, with the other
    lists of index dst[1] given src's shapes (so only the sharing is wrong)."""
    (dl, di), (sl, si) = dst, src
    if di != si:
        for k, lst in enumerate(args):
            if isinstance(lst, list):
                args[k] = list(lst)
                args[k][di] = lst[si].clone()
    args[dl] = list(args[dl])
    args[dl][di] = args[sl][si]


def _kw(**values):
    def mutate(args, kw):
        kw.update({k: v() if callable(v) else v for k, v in values.items()})
    return mutate


# (op, mutation of (list args, kwargs), expected message); the kwargs hold lr and
# every scheduled tensor, so each call is a complete raw-op call.
BAD = {
    "grads_length": ("lamb_step_", _set(1, None, None), "grads has 2 tensors but params has 3"),
    "state_length": ("lamb_step_", _set(3, None, None), "exp_avg_sqs has 2 tensors but params has 3"),
    "param_dtype": ("lamb_step_", lambda a, k: [a[i].__setitem__(1, a[i][1].double()) for i in (0, 1)],
                    "params[1] has dtype Double; supported: float32, bfloat16, float16"),
    "grad_dtype": ("lamb_step_", _set(1, 0, lambda t: t.bfloat16()), "grads[0] has dtype BFloat16, expected Float"),
    "grad_shape": ("lamb_step_", _set(1, 1, lambda t: torch.randn(6)), "grads[1] has shape [6] but params[1] has shape [5]"),
    "state_dtype": ("lamb_step_", _set(2, 0, lambda t: t.bfloat16()), "exp_avgs[0] has dtype BFloat16, expected Float"),
    "state_shape": ("lamb_step_", _set(3, 0, lambda t: t.t().contiguous()),
                    "exp_avg_sqs[0] has shape [4, 3] but params[0] has shape [3, 4]"),
    "step_not_0d": ("lamb_step_", _set(4, 1, lambda t: t.reshape(1)), "steps[1] must be a 0-d tensor, got shape [1]"),
    "step_dtype": ("lamb_step_", _set(4, 2, lambda t: t.double()), "steps[2] must be float32, got Double"),
    "steps_length": ("adagrad_step_", _set(3, None, None), "steps has 2 tensors but params has 3"),
    "lr_shape": ("lamb_step_", _kw(lr=lambda: torch.tensor([0.01])), "lr must be a 0-d tensor, got shape [1]"),
    "lr_dtype": ("adagrad_step_", _kw(lr=lambda: torch.tensor(0.01, dtype=torch.float64)),
                 "lr must be float32, got Double"),
    "beta1_shape": ("lamb_step_", _kw(beta1=lambda: torch.tensor([0.9])), "beta1 must be a 0-d tensor, got shape [1]"),
    "beta2_dtype": ("lamb16_step_", _kw(beta2=lambda: torch.tensor(0.9, dtype=torch.float64)),
                    "beta2 must be float32, got Double"),
    "momentum_shape": ("lars_step_", _kw(momentum=lambda: torch.ones(2)), "momentum must be a 0-d tensor, got shape [2]"),
    "eps": ("lamb_step_", _kw(eps=-1.0), "invalid eps -1, expected a value in [0, inf]"),
    "weight_decay": ("lamb_step_", _kw(weight_decay=-0.5), "invalid weight_decay -0.5, expected a value in [0, inf]"),
    "max_grad_norm": ("lamb_step_", _kw(max_grad_norm=-1.0), "invalid max_grad_norm -1"),
    "grad_scale_numel": ("lamb_step_", _kw(grad_scale=lambda: torch.ones(2)), "grad_scale must have one element, got shape [2]"),
    "found_inf_dtype": ("lars_step_", _kw(found_inf=lambda: torch.tensor(0.0, dtype=torch.float64)),
                        "found_inf must be float32, got Double"),
    "master_length": ("lamb_step_", _kw(master_params=lambda: [torch.randn(3, 4)]), "master_params has 1 tensors but params has 3"),
    "master_dtype": ("adagrad_step_", _kw(master_params=lambda: [torch.randn(s).bfloat16() for s in SHAPES]),
                     "master_params[0] has dtype BFloat16, expected Float"),
    "lamb16_state_dtype": ("lamb16_step_", _set(2, 1, lambda t: t.float()), "exp_avgs[1] has dtype Float, expected Float8_e4m3fn"),
    "lamb16_scales_length": ("lamb16_step_", _set(4, None, None), "exp_avg_scales has 2 tensors but params has 3"),
    "lamb16_scale_dtype": ("lamb16_step_", _set(5, 0, lambda t: t.double()), "exp_avg_sq_scales[0] must be float32, got Double"),
    "trust_scale": ("lamb16_step_", _kw(trust_scale=-1.0), "invalid trust_scale -1"),
    "lars_wd_length": ("lars_step_", _kw(weight_decay=[1e-3] * 4), "weight_decay has 4 values; expected 1 or one per param (3)"),
    "lars_wd_value": ("lars_step_", _kw(weight_decay=[1e-3, -1e-3, 0.0]), "invalid weight_decay[1] -0.001, expected a value in [0, inf]"),
    "lars_adapt_length": ("lars_step_", _kw(layer_adaptation=[True, False]),
                          "layer_adaptation has 2 values; expected 0, 1 or one per param (3)"),
    "lars_coeff": ("lars_step_", _kw(lars_coeff=-1.0), "invalid lars_coeff -1"),
    "lars_rescale_nan": ("lars_step_", _kw(rescale_grad=float("nan")), "invalid rescale_grad nan"),
    "adagrad_lr_decay": ("adagrad_step_", _kw(lr_decay=-0.1), "invalid lr_decay -0.1"),
    "adagrad_state_dtype": ("adagrad_step_", _set(2, 2, lambda t: t.double()), "state_sums[2] has dtype Double, expected Float"),
    "novograd_v_not_0d": ("novograd_step_", _set(3, 1, lambda t: t.reshape(1)), "exp_avg_sqs[1] must be a 0-d tensor, got shape [1]"),
    "novograd_v_max_dtype": ("novograd_step_", _set(4, 2, lambda t: t.double()), "max_exp_avg_sqs[2] must be float32, got Double"),
    "novograd_m_shape": ("novograd_step_", _set(2, 0, lambda t: t.t().contiguous()),
                         "exp_avgs[0] has shape [4, 3] but params[0] has shape [3, 4]"),
    "novograd_beta1_shape": ("novograd_step_", _kw(beta1=lambda: torch.ones(2)), "beta1 must be a 0-d tensor, got shape [2]"),
    # the two-phase ops check what their one-call op checks, under their own name, then the reductions
    "reduce_grad_shape": ("lamb_reduce_", _set(1, 1, lambda t: torch.randn(6)),
                          "grads[1] has shape [6] but params[1] has shape [5]"),
    "lamb16_reduce_trust_scale": ("lamb16_reduce_", _kw(trust_scale=-1.0), "invalid trust_scale -1"),
    "lars_reduce_wd_length": ("lars_reduce", _kw(weight_decay=[1e-3] * 4),
                              "weight_decay has 4 values; expected 1 or one per param (3)"),
    "apply_state_dtype": ("lamb16_apply_", _set(3, 0, lambda t: t.float()), "exp_avg_sqs[0] has dtype Float, expected Float8_e5m2"),
    "reductions_shape": ("lamb_apply_", lambda a, k: a.__setitem__(5, torch.rand(3, 4)),
                         "reductions must have shape [3, 2] (params x partial reductions), got [3, 4]"),
    "reductions_rows": ("lamb16_apply_", lambda a, k: a.__setitem__(7, torch.rand(2, 4)),
                        "reductions must have shape [3, 4] (params x partial reductions), got [2, 4]"),
    "reductions_dtype": ("lars_apply_", lambda a, k: a.__setitem__(3, a[3].double()), "reductions must be float32, got Double"),
    # memory that what an op writes shares with anything else of the call (checked last)
    "param_expanded": ("lamb_step_", _set(0, 1, lambda t: torch.randn(1).expand(5)),
                       "params[1] has elements that share memory (an expanded or stride-0 view)"),
    "state_expanded": ("lamb16_step_", _set(3, 1, lambda t: t[:1].expand(5)),
                       "exp_avg_sqs[1] has elements that share memory (an expanded or stride-0 view)"),
    "param_twice": ("lamb_step_", lambda a, k: _alias(a, (0, 2), (0, 0)), "params[0] and params[2] share memory"),
    "param_is_its_state": ("lars_step_", lambda a, k: _alias(a, (2, 1), (0, 1)),
                           "params[1] and momentum_buffers[1] share memory"),
    "overlapping_views": ("adagrad_step_", lambda a, k: a[0].__setitem__(1, a[0][0].view(-1)[3:8]),
                          "params[0] and params[1] share memory"),
    "grad_is_param": ("lamb16_step_", lambda a, k: _alias(a, (1, 0), (0, 0)), "params[0] and grads[0] share memory"),
    "master_is_param": ("adagrad_step_", lambda a, k: k.__setitem__("master_params", list(a[0])),
                        "params[0] and master_params[0] share memory"),
    "v_twice": ("novograd_apply_", lambda a, k: _alias(a, (3, 2), (4, 1)), "exp_avg_sqs[2] and max_exp_avg_sqs[1] share memory"),
    "novograd_reduce_eps": ("novograd_reduce_", _kw(eps=-1.0), "invalid eps -1, expected a value in [0, inf]"),
    "step_twice": ("lamb_reduce_", lambda a, k: _alias(a, (4, 2), (4, 0)), "steps[0] and steps[2] share memory"),
}


def _bad_call(case):
    name, mutate, message = BAD[case]
    args = spec_lists(name, SHAPES, seed=3)
    kwargs = raw_op_kwargs(name, {"lr": torch.tensor(0.01)})
    mutate(args, kwargs)
    return name, args, kwargs, f"{name}: {message}"


def _call(name, args, kwargs):
    getattr(torch.ops.lamb, name)(*args, **kwargs)


def _snapshot(args, kwargs):
    tensors = [t for lst in args for t in lst] + [t for t in kwargs.get("master_params") or []]
    return tensors, [t.clone() for t in tensors]


@pytest.fixture
def reset_path():
    yield
    inductor_lamb.set_compile_path("auto")
    torch._dynamo.reset()


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_same_error_eagerly_and_on_every_compile_path(case, reset_path):
    name, args, kwargs, message = _bad_call(case)
    tensors, before = _snapshot(args, kwargs)
    with pytest.raises(RuntimeError) as eager:
        _call(name, args, kwargs)
    assert message in str(eager.value)
    eager_message = str(eager.value).splitlines()[0]
    for path in PATHS:
        assert inductor_lamb.set_compile_path(path, ops=name) == path
        torch._dynamo.reset()
        with pytest.raises(RuntimeError) as compiled:
            torch.compile(_call, fullgraph=True)(name, args, kwargs)
        assert eager_message in str(compiled.value), path
    assert all(equal(t, b) for t, b in zip(tensors, before))
