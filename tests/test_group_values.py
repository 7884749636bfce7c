"""What users' code writes into the param groups: no key of ours collides with one that LR
schedulers write, and a value of another type never reaches an op as the wrong type (it is
converted where torch.optim takes it, else refused naming the optimizer, group and key,
before any tensor changes), eagerly and under ``torch.compile(opt.step)``."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from conftest import keys_written, our_group_keys
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.optim import lr_scheduler

import inductor_lamb
from inductor_lamb.optim._scheduled import renamed_group_keys

OPTIMIZERS = {"Lamb": inductor_lamb.Lamb, "Lamb16": inductor_lamb.Lamb16, "Lars": inductor_lamb.Lars,
              "NovoGrad": inductor_lamb.NovoGrad, "Adagrad": inductor_lamb.Adagrad}


def _scheduler_keys() -> set[str]:
    """The keys torch's LR schedulers write into param groups, learned by running each on a
    torch optimizer and diffing its groups' keys (conftest.keys_written)."""
    def made(build):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.randn(3))], lr=0.1, momentum=0.9)

        def run():
            sched = build(opt)
            for _ in range(3):
                opt.step()
                sched.step(1.0) if isinstance(sched, lr_scheduler.ReduceLROnPlateau) else sched.step()

        return keys_written(opt, run)

    builds = [
        lambda o: lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=10),
        lambda o: lr_scheduler.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=2),
        lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=5),
        lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=2),
        lambda o: lr_scheduler.StepLR(o, step_size=2),
        lambda o: lr_scheduler.ExponentialLR(o, gamma=0.9),
        lambda o: lr_scheduler.LinearLR(o),
        lambda o: lr_scheduler.PolynomialLR(o, total_iters=5),
        lambda o: lr_scheduler.ReduceLROnPlateau(o),
    ]
    return set().union(*(made(b) for b in builds))


def test_scheduler_keys_are_learned():
    keys = _scheduler_keys()
    assert {"initial_lr", "max_lr", "min_lr"} <= keys  # (OneCycleLR's: the test sees what it must)


def test_no_group_key_collides_with_a_schedulers():
    """A key of ours that a scheduler also writes would be overwritten with the scheduler's
    value (keys of torch.optim's own optimizers, lr, betas, momentum, mean the same: excepted).
    Lightning, HF Trainer and accelerate: test_frameworks; DeepSpeed: test_deepspeed; timm:
    test_timm; TorchTitan: test_torchtitan."""
    assert not our_group_keys() & _scheduler_keys()


@pytest.mark.parametrize("name", ["Lamb", "NovoGrad"])
@pytest.mark.parametrize("tensor_lr", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_onecycle_with_the_groups_lr_as_max_lr(name, tensor_lr, compiled):
    """Lightning's idiom, ``OneCycleLR(opt, max_lr=opt.param_groups[0]["lr"])`` (a 0-d tensor
    here), steps as a run with the same lrs written by hand, and the corrected decay keeps its
    own peak."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    data = [torch.randn(5, 4) for _ in range(2)]

    def run(with_scheduler):
        params = [torch.nn.Parameter(d.clone()) for d in data]
        lr = torch.tensor(0.02) if tensor_lr else 0.02
        opt = OPTIMIZERS[name](params, lr=lr, weight_decay=0.1, decoupled_decay=True, corrected_weight_decay=True)
        step = torch.compile(opt.step) if compiled else opt.step
        sched = lr_scheduler.OneCycleLR(opt, max_lr=opt.param_groups[0]["lr"], total_steps=8,
                                         cycle_momentum=False) \
            if with_scheduler else None
        lrs = []
        for k in range(6):
            for i, p in enumerate(params):
                p.grad = torch.sin(p.detach() * (k + 1) + i)
            if sched is None:
                opt.param_groups[0]["lr"] = scheduled[k]
            lrs.append(float(opt.param_groups[0]["lr"]))
            step()
            if sched is not None:
                sched.step()
        assert opt.param_groups[0]["max_lr_snapshot"] == pytest.approx(0.02)
        return params, lrs

    scheduled: list[float] = []
    ours, lrs = run(True)
    scheduled.extend(lrs)
    by_hand, _ = run(False)
    for a, b in zip(ours, by_hand):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["Lamb", "NovoGrad"])
def test_a_checkpoint_with_the_old_key_loads_and_steps_the_same(name):
    """A group saved with the corrected decay's peak as ``max_lr`` (before it was timm's
    ``max_lr_snapshot``) loads with it under the new key, and the runs go on the same."""
    torch.manual_seed(1)
    params = [torch.nn.Parameter(torch.randn(6, 3))]
    opt = OPTIMIZERS[name](params, lr=0.01, weight_decay=0.2, decoupled_decay=True, corrected_weight_decay=True,
                           max_lr=0.05)
    params[0].grad = torch.randn(6, 3)
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    old = copy.deepcopy(sd)
    old["param_groups"][0]["max_lr"] = old["param_groups"][0].pop("max_lr_snapshot")
    runs = []
    for saved in (sd, old):
        ps = [torch.nn.Parameter(params[0].detach().clone())]
        o = OPTIMIZERS[name](ps, lr=0.01)
        o.load_state_dict(saved)
        assert o.param_groups[0]["max_lr_snapshot"] == 0.05 and "max_lr" not in o.param_groups[0]
        ps[0].grad = torch.cos(ps[0].detach())
        o.step()
        runs.append(ps[0].detach())
    assert torch.equal(runs[0], runs[1])
    # one OneCycleLR wrote beside it (with its min_lr) keeps its max_lr for the schedule
    group = {"max_lr": 0.3, "min_lr": 1e-4, "corrected_weight_decay": False}
    renamed_group_keys(group)
    assert group == {"max_lr": 0.3, "min_lr": 1e-4, "corrected_weight_decay": False, "max_lr_snapshot": 0.0}


# value written into a group key -> the value the op takes (None: refused with a TypeError)
CONVERTED = [(np.float32(0.25), 0.25), (np.float64(0.1), 0.1), (1, 1.0), (torch.tensor(0.5), 0.5),
             (torch.tensor([0.125]), 0.125)]
REFUSED = ["0.1", None, [0.1], torch.ones(2), torch.tensor(0.1, requires_grad=True), 1j]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("compiled", [False, True])
def test_group_values_of_other_types(name, compiled):
    torch._dynamo.reset()
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]
    opt = OPTIMIZERS[name](params, lr=0.01)
    twin_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    twin = OPTIMIZERS[name](twin_params, lr=0.01)
    step = torch.compile(opt.step) if compiled else opt.step
    key = "weight_decay"
    for value, expected in CONVERTED:
        for ps in (params, twin_params):
            for p in ps:
                p.grad = torch.sin(p.detach() * 3)
        opt.param_groups[0][key] = value
        twin.param_groups[0][key] = expected
        step()
        twin.step()
        assert opt.param_groups[0][key] is value  # (read back as written, as in torch.optim)
        for a, b in zip(params, twin_params):
            assert torch.equal(a, b)
    for bad in REFUSED:
        opt.param_groups[0][key] = bad
        before = [p.detach().clone() for p in params]
        with pytest.raises(TypeError, match=rf"{name}: param_groups\[0\]\['{key}'\] must be a float"):
            step()
        for a, b in zip(params, before):
            assert torch.equal(a, b)
    for bad in ("0.1", None, torch.ones(3), True):
        opt.param_groups[0][key] = 0.0
        opt.param_groups[0]["lr"] = bad
        with pytest.raises((TypeError, ValueError), match=rf"{name}: param_groups\[0\]\['lr'\]"):
            step()
    opt.param_groups[0]["lr"] = 0.01  # (corrected: steps again)
    step()


# ---- property: whatever a group holds ---------------------------------------------------------

_NUMBERS = st.one_of(
    st.floats(width=64), st.integers(-(2**70), 2**70), st.booleans(), st.complex_numbers(allow_nan=True),
    st.sampled_from([np.float32(0.5), np.float64(-1.0), np.int64(3), np.bool_(True), np.float16(0.1), np.int8(-2)]))
_TENSORS = st.builds(
    lambda shape, dtype, fill, grad: torch.full(shape, fill if dtype.is_floating_point or math.isfinite(fill) else 1.0,
                                                dtype=dtype).requires_grad_(grad and dtype.is_floating_point),
    st.sampled_from([(), (1,), (2,), (1, 1)]),
    st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.bool]),
    st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.0, math.inf, math.nan]), st.booleans())
# anything a user, a scheduler or a framework may write into a param group
VALUES = st.one_of(_NUMBERS, _TENSORS, st.none(), st.text(max_size=3), st.lists(_NUMBERS, max_size=3),
                   st.tuples(_NUMBERS, _NUMBERS), st.tuples(_NUMBERS), st.tuples(_TENSORS, _TENSORS))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def _outcome(opt, params, step):
    """(error text or None, the params' and state's bits after the step)."""
    try:
        step()
        error = None
    except Exception as e:  # noqa: BLE001  (what is raised is the property's subject)
        error = e
    bits = [t.detach().clone() for p in params for t in (p, *opt.state[p].values())]
    return error, bits


def _chain(e: BaseException) -> str:
    """An exception's text with every exception it was raised from or during (Dynamo wraps)."""
    parts = []
    while e is not None and len(parts) < 5:
        parts.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return "\n".join(parts)


@settings(max_examples=max(10, settings().max_examples // 20))  # (a compile per example)
@given(st.sampled_from(list(OPTIMIZERS)), st.data(), VALUES)
def test_whatever_a_group_holds_steps_or_is_refused_by_name(name, data, value):
    """A value of any type written into any key of a param group: the step either runs, the same
    eagerly and traced into a graph (``torch.compile(opt.step, fullgraph=True)``), or raises a
    TypeError or ValueError naming the optimizer, the group and the key, with every param and
    state tensor untouched, also compiled (where Dynamo may wrap it). Never an internal error of
    torch's, and the group reads back what was written."""
    torch._dynamo.reset()
    runs = []
    for compiled in (False, True):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]
        opt = OPTIMIZERS[name](params, lr=0.01)
        key = data.draw(st.sampled_from(sorted(k for k in opt.param_groups[0] if k not in ("params",))), "key") \
            if not runs else runs[0][0]
        for p in params:
            p.grad = torch.sin(p.detach() * 3)
        step = torch.compile(opt.step, backend="eager", fullgraph=True) if compiled else opt.step
        before = [t.detach().clone() for p in params for t in (p, *opt.state[p].values())]
        opt.param_groups[0][key] = value
        error, after = _outcome(opt, params, step)
        assert opt.param_groups[0][key] is value
        runs.append((key, error, before, after))
    (key, eager_error, before, eager_after), (_, compiled_error, _, compiled_after) = runs
    if eager_error is None:
        assert compiled_error is None, _chain(compiled_error)
        for a, b in zip(eager_after, compiled_after):
            assert a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))  # (NaN included)
        return
    text = str(eager_error)
    assert isinstance(eager_error, (TypeError, ValueError)), _chain(eager_error)
    assert text.startswith(f"{name}: param_groups[0][{key!r}]"), text
    assert compiled_error is not None and text in _chain(compiled_error).replace('\\"', '"'), _chain(compiled_error)
    for after in (eager_after, compiled_after):
        for a, b in zip(before, after):
            assert torch.equal(_bits(a), _bits(b))
    for e in (eager_error, compiled_error):
        assert "INTERNAL ASSERT" not in _chain(e) and "report a bug" not in _chain(e).lower().replace(
            "please do this especially if you're reporting a bug to pytorch", "")
