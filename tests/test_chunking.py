"""Op calls per step: an eager step calls each op once per bucket, whatever its number of
params; a step traced into a graph cuts a bucket into calls of at most ``max_tensors_per_call``
params (Inductor's post-grad pass is quadratic in one call's tensors). Both give the same bits,
counted at the dispatcher."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import assert_tensor_close, equal
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils._python_dispatch import TorchDispatchMode

import inductor_lamb
from inductor_lamb import Adagrad, Lamb, Lamb16, Lars

SHAPES = [(33, 17), (), (7,), (64, 48), (0,), (3, 5, 7), (1,), (40, 3)]
OPTIMIZERS = {
    "lamb_clip_bf16": lambda ps: Lamb(ps, lr=1e-2, weight_decay=0.01, max_grad_norm=0.5, master_weights=True),
    "lamb16": lambda ps: Lamb16(ps, lr=1e-2, weight_decay=0.01),
    "lars_excludes": lambda ps: Lars(ps, lr=1e-2, weight_decay=1e-3, exclude_from_weight_decay=["bias"]),
    "adagrad": lambda ps: Adagrad(ps, lr=1e-2, weight_decay=1e-3),
}


def named_params(dtype_of=lambda i: torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [(f"layer{i}.{'bias' if len(s) == 1 else 'weight'}",
             nn.Parameter(torch.randn(s, generator=gen).to(dtype_of(i)))) for i, s in enumerate(SHAPES)]


def run(opt, params, steps, step_fn=None):
    gen = torch.Generator().manual_seed(1)
    for k in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(p.dtype)
        for g in opt.param_groups:
            g["lr"] = [1e-2, 6e-3, 1.3e-2][k % 3]
        opt.param_groups  # noqa: B018  (syncs the lr tensors eagerly, as schedulers do)
        (step_fn or opt.step)()


class CountedCalls(TorchDispatchMode):
    """The number of params of each call of an optimizer's one-call op (``lamb.*_step_``), seen
    at the dispatcher: planned eager steps call the ops from C++ (optim/_plan.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "lamb" and func._opname.endswith("_step_"):
            self.calls.append(len(args[0] if args else kwargs["params"]))
        return func(*args, **kwargs)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_eager_step_is_one_call_per_bucket(name):
    """Eager steps (planned, and the unplanned first step) call the op once per bucket, also
    above ``max_tensors_per_call``, which changes no bit of the result."""
    dtype_of = (lambda i: torch.bfloat16 if i % 3 == 1 else torch.float32) if "bf16" in name else None
    one = named_params(*(dtype_of,) if dtype_of else ())
    small = copy.deepcopy(one)
    opt_one, opt_small = OPTIMIZERS[name](one), OPTIMIZERS[name](small)
    opt_small.max_tensors_per_call = 3
    run(opt_one, [p for _, p in one], 3)
    with CountedCalls() as counted:
        run(opt_small, [p for _, p in small], 3)
    buckets = 2 if "bf16" in name else 1  # (float32 and bfloat16 params)
    assert counted.calls and len(counted.calls) == 3 * buckets and sum(counted.calls) == 3 * len(small), counted.calls
    for (_, a), (_, b) in zip(one, small):
        assert equal(b, a)
        for key, value in opt_one.state[a].items():
            assert equal(opt_small.state[b][key], value)


@pytest.mark.parametrize("name", ["lamb_clip_bf16", "lars_excludes"])
def test_traced_step_is_cut_per_max_tensors_per_call_with_the_eager_bits(name):
    """A step traced into a graph (a compiled function calling ``opt.step()``; external op
    calls) calls the op per ``max_tensors_per_call`` params and matches the eager step's bits,
    clipping included (by the group's norm, outside the op, in both)."""
    from torch._inductor.utils import run_and_get_code

    dtype_of = (lambda i: torch.bfloat16 if i % 3 == 1 else torch.float32) if "bf16" in name else None
    eager = named_params(*(dtype_of,) if dtype_of else ())
    traced = copy.deepcopy(eager)
    opt_eager, opt_traced = OPTIMIZERS[name](eager), OPTIMIZERS[name](traced)
    opt_eager.max_tensors_per_call = opt_traced.max_tensors_per_call = 3
    inductor_lamb.set_compile_path("external")
    try:
        torch._dynamo.reset()
        step = torch.compile(lambda: opt_traced.step(), fullgraph=True)
        run(opt_eager, [p for _, p in eager], 3)
        codes = []
        run(opt_traced, [p for _, p in traced], 3, step_fn=lambda: codes.extend(run_and_get_code(step)[1]))
    finally:
        inductor_lamb.set_compile_path("auto")
        torch._dynamo.reset()
    calls = [line for line in codes[0].splitlines() if "torch.ops.lamb." in line and "_step_" in line
             and not line.lstrip().startswith("#")]
    assert len(calls) == sum((n + 2) // 3 for n in ((5, 3) if "bf16" in name else (8,))), calls
    for (_, a), (_, b) in zip(eager, traced):
        assert equal(b, a)
        for key, value in opt_eager.state[a].items():
            assert equal(opt_traced.state[b][key], value)


def test_chunked_step_compiles_once_and_matches_eager():
    eager, compiled = named_params(), named_params()
    opt_eager, opt_compiled = Lamb(eager, lr=1e-2, weight_decay=0.01), Lamb(compiled, lr=1e-2, weight_decay=0.01)
    opt_eager.max_tensors_per_call = opt_compiled.max_tensors_per_call = 3
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    step = torch.compile(opt_compiled.step, backend=counter, fullgraph=True)
    run(opt_eager, [p for _, p in eager], 3)
    run(opt_compiled, [p for _, p in compiled], 3, step_fn=step)
    assert counter.frame_count == 1
    for (_, a), (_, b) in zip(eager, compiled):
        assert_tensor_close(b, a, rtol=1e-5, atol=1e-6)
