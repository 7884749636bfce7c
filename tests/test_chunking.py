"""A bucket with more params than ``max_tensors_per_call`` steps in several op
calls (Inductor's post-grad pass is quadratic in one call's tensors):
the same result as one call, eagerly and compiled."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils._python_dispatch import TorchDispatchMode

import inductor_lamb
from inductor_lamb import Adagrad, Lamb, Lamb16, Lars
from conftest import assert_tensor_close

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
def test_chunked_step_equals_one_call(name):
    dtype_of = (lambda i: torch.bfloat16 if i % 3 == 1 else torch.float32) if "bf16" in name else None
    one = named_params(*(dtype_of,) if dtype_of else ())
    chunked = copy.deepcopy(one)
    opt_one, opt_chunked = OPTIMIZERS[name](one), OPTIMIZERS[name](chunked)
    opt_chunked.max_tensors_per_call = 3
    run(opt_one, [p for _, p in one], 3)
    with CountedCalls() as counted:
        run(opt_chunked, [p for _, p in chunked], 3)
    calls = counted.calls
    assert max(calls) == 3 and sum(calls) == 3 * len(chunked), calls  # 3 steps, 3 calls each
    for (_, a), (_, b) in zip(one, chunked):
        # (Lamb's clip: the group norm computed by the optimizer instead of inside one call)
        assert_tensor_close(b, a, rtol=1e-5, atol=1e-6)
        for key, value in opt_one.state[a].items():
            assert_tensor_close(opt_chunked.state[b][key], value, rtol=1e-5, atol=1e-6)


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
