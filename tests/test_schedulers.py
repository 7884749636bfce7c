"""Scheduled hyper-parameters (lr, betas, momentum) are 0-d tensors that torch's
LR schedulers update in place: a compiled step compiles once, whatever the
scheduler changes, on both training-step recipes, and never graph-breaks."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch._dynamo.testing import CompileCounter

from inductor_lamb import Adagrad, Lamb, Lamb16, Lars

OPTIMIZERS = {
    "lamb": (Lamb, dict(lr=0.02, weight_decay=0.01)),
    "lamb16": (Lamb16, dict(lr=0.02, weight_decay=0.01)),
    "lars": (Lars, dict(lr=0.1, momentum=0.9, weight_decay=1e-3)),
    "adagrad": (Adagrad, dict(lr=0.05)),
}
STEPS = 10


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # (every test compiles the same train_step: keep under the recompile limit)
    yield
    torch._dynamo.reset()


def scheduler(kind: str, opt, momentum: bool):
    if kind == "onecycle":  # defaults: cycle_momentum=True
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=STEPS + 2,
                                                   cycle_momentum=momentum)
    if kind == "cyclic":
        return torch.optim.lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.05, step_size_up=3,
                                                 cycle_momentum=momentum, base_momentum=0.8, max_momentum=0.95)
    if kind == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0 / (1 + k))


def setup(opt_name, sched_kind):
    cls, kw = OPTIMIZERS[opt_name]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = cls(model.parameters(), **kw)
    # Adagrad has neither betas nor momentum: cycling them would raise in torch
    return model, opt, scheduler(sched_kind, opt, momentum=opt_name != "adagrad")


def data(step):
    gen = torch.Generator().manual_seed(step)
    return torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)


def train_step(model, opt, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


@pytest.mark.parametrize("recipe", ["whole_step", "opt_step"])
@pytest.mark.parametrize("sched_kind", ["onecycle", "cyclic", "cosine", "lambda"])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_compiles_once_under_schedulers(opt_name, sched_kind, recipe):
    """10 steps, one compilation (dynamo's guards decide recompiles, so the eager
    backend counts them without Inductor's codegen), and the eager trajectory."""
    model, opt, sched = setup(opt_name, sched_kind)
    model_e, opt_e, sched_e = setup(opt_name, sched_kind)
    counter = CompileCounter()
    if recipe == "whole_step":
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            step = torch.compile(train_step, backend=counter, fullgraph=True)
            for k in range(STEPS):
                step(model, opt, *data(k))
                sched.step()
    else:
        step = torch.compile(opt.step, backend=counter, fullgraph=True)
        for k in range(STEPS):
            nn.functional.cross_entropy(model(data(k)[0]), data(k)[1]).backward()
            step()
            opt.zero_grad()
            sched.step()
    for k in range(STEPS):
        train_step(model_e, opt_e, *data(k))
        sched_e.step()
    assert counter.frame_count == 1
    for p, q in zip(model.parameters(), model_e.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    if opt_name in ("lamb", "lamb16") and sched_kind in ("onecycle", "cyclic"):
        beta1 = opt.param_groups[0]["betas"][0]
        assert type(beta1) is float and beta1 != 0.9  # the scheduler moved it (and it reads back as written)
    if opt_name == "lars" and sched_kind in ("onecycle", "cyclic"):
        assert type(opt.param_groups[0]["momentum"]) is float and opt.param_groups[0]["momentum"] != 0.9


@pytest.mark.parametrize("recipe", ["eager", "opt_step", "whole_step"])
@pytest.mark.parametrize("opt_name", ["lamb", "lars"])  # LARS keeps no step count
def test_schedulers_see_whether_the_step_ran(opt_name, recipe):
    """A scheduler warns when its step() comes before the optimizer's first step();
    ``_opt_called`` says so eagerly and on both compiled recipes, never too early."""
    model, opt, sched = setup(opt_name, "lambda")
    with pytest.warns(UserWarning, match=r"before `optimizer.step\(\)`"):
        sched.step()
    model, opt, sched = setup(opt_name, "lambda")
    assert not opt._opt_called
    if recipe == "whole_step":
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            torch.compile(train_step, backend=CompileCounter(), fullgraph=True)(model, opt, *data(0))
    else:
        nn.functional.cross_entropy(model(data(0)[0]), data(0)[1]).backward()
        (opt.step if recipe == "eager" else torch.compile(opt.step, backend=CompileCounter(), fullgraph=True))()
    assert opt._opt_called
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sched.step()


def test_onecycle_betas_with_inductor_lowering():
    """The lowering reads the beta tensors: compiled with Inductor, one compilation,
    same trajectory as eager while OneCycleLR cycles beta1 every step."""
    model, opt, sched = setup("lamb", "onecycle")
    model_e, opt_e, sched_e = setup("lamb", "onecycle")
    counter = CompileCounter()
    backend_calls = []

    def backend(gm, inputs):
        from torch._inductor.compile_fx import compile_fx

        backend_calls.append(1)
        return compile_fx(gm, inputs)

    step = torch.compile(opt.step, backend=backend, fullgraph=True)
    for k in range(STEPS):
        for m, o, st in ((model, opt, step), (model_e, opt_e, opt_e.step)):
            nn.functional.cross_entropy(m(data(k)[0]), data(k)[1]).backward()
            st()
            o.zero_grad()
        sched.step()
        sched_e.step()
    assert len(backend_calls) == 1, counter
    for p, q in zip(model.parameters(), model_e.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_param_groups_read_naturally():
    model, opt, sched = setup("lamb", "onecycle")
    group = opt.param_groups[0]
    assert group["betas"] == (0.95, 0.999) and all(type(b) is float for b in group["betas"])  # (OneCycleLR's)
    text = repr(opt)
    assert "betas: (0.95, 0.999)" in text and "tensor" not in text
    sd = opt.state_dict()
    assert sd["param_groups"][0]["betas"] == (0.95, 0.999) and isinstance(sd["param_groups"][0]["lr"], float)
    # a value written by hand (as schedulers do) reads back as written and is stepped with
    group["betas"] = (0.5, 0.99)
    assert opt.param_groups[0]["betas"] == (0.5, 0.99)
    group["betas"] = (1.5, 0.99)
    opt.param_groups  # (a read never fails: the value can still be corrected; the step refuses it)
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['betas'\]: Invalid beta parameter at index 0: 1.5"):
        opt.step()
    group["betas"] = (0.5, 0.99)
    lars = Lars(model.parameters(), lr=0.1)
    lars.param_groups[0]["momentum"] = -1.0
    with pytest.raises(ValueError, match=r"Lars: param_groups\[0\]\['momentum'\]: Invalid momentum value: -1"):
        lars.step()
    # round trip, also through a deep copy
    opt2 = copy.deepcopy(opt)
    assert float(opt2.param_groups[0]["betas"][0]) == 0.5
    opt3 = Lamb(model.parameters(), lr=0.3, betas=(0.1, 0.2))
    opt3.load_state_dict(opt.state_dict())
    assert opt3.state_dict()["param_groups"][0]["betas"] == (0.5, 0.99)
    assert opt3.param_groups[0]["betas"] == (0.5, 0.99)
