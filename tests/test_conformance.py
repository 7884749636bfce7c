"""The torch.optim contract, for every optimizer and every configuration of its
``OptimizerInfo`` (optim_infos.py): state-dict round trips, older state dicts,
frozen and gradient-less groups, closures and hooks, schedulers (eager and
compiled), maximize, dtypes, non-contiguous params, and torch.optim's errors."""

from __future__ import annotations

import copy
import io
import pickle
import re
import warnings

import pytest
import torch
from optim_infos import INFOS, OptimizerErrorEnum
from torch import nn
from torch._dynamo.testing import CompileCounter
from torch.optim import lr_scheduler

import inductor_lamb
from inductor_lamb import reference
from inductor_lamb.optim._buckets import Bucket

CASES = [pytest.param(info, inp, id=f"{info.optim_cls.__name__}-{inp.desc.replace(' ', '_')}")
         for info in INFOS for inp in info.optim_inputs_func("cpu")]
BY_CLASS = {info.optim_cls.__name__: info for info in INFOS}


# ---- the problem: a few params of mixed shapes (0-d, empty, odd sizes) ---------------------------

def make_params(dtype=torch.float32, seed=0, noncontiguous=False) -> list[nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(8, 6), (8,), (3, 8), (), (0, 4)]
    values = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes]
    if noncontiguous:  # the same values transposed (2-d) or with gaps between elements (1-d)
        values = [v.t().contiguous().t() if v.dim() == 2 and v.numel() else
                  torch.stack([v, v], -1)[..., 0] if v.dim() == 1 else v for v in values]
    return [nn.Parameter(v) for v in values]


def loss_of(params, step: int) -> torch.Tensor:
    w1, b1, w2, s, e = params
    x = torch.randn(16, 6, generator=torch.Generator().manual_seed(1000 + step), dtype=torch.float64).to(w1.dtype)
    out = (torch.tanh(x @ w1.t() + b1) @ w2.t()) * s
    return (out.float() - 0.5).pow(2).mean() + e.float().sum()


def backward(params, step: int, scale: float = 1.0) -> torch.Tensor:
    loss = loss_of(params, step)
    (loss * scale).backward()
    return loss


def build(info, inp, params, **extra):
    kwargs = {**copy.deepcopy(inp.kwargs), **extra}
    return info.optim_cls(params, **kwargs)


def run(opt, params, steps, scheduler=None):
    for k in steps:
        opt.zero_grad()
        backward(params, k)
        opt.step()
        if scheduler is not None:
            scheduler.step()


def clones(params):
    return [p.detach().clone() for p in params]


def assert_same_tensors(a, b, msg=""):
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x,
                                                  y.view(torch.uint8) if y.element_size() == 1 else y), \
            f"{msg} tensor {i} differs"


def assert_same(a, b, path="state_dict"):
    """Exactly equal state dicts: same keys, Python types and values, tensors bit for bit."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), f"{path}: keys {sorted(map(str, a))} != {sorted(map(str, b))}"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert_same_tensors([a], [b], path)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def checkpoint(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# ---- state dicts -------------------------------------------------------------------------

@pytest.mark.parametrize("info,inp", CASES)
def test_state_dict_round_trip(info, inp):
    params = make_params()
    opt = build(info, inp, params)
    run(opt, params, range(3))
    sd = copy.deepcopy(opt.state_dict())
    # what an optimizer saves is what it reads back: after load_state_dict, deepcopy and torch.load
    for how, load in [("load_state_dict", lambda o: o.load_state_dict(copy.deepcopy(sd))),
                      ("torch.load(weights_only=True)", lambda o: o.load_state_dict(checkpoint(sd)))]:
        twin_params = [nn.Parameter(p.detach().clone()) for p in params]
        twin = build(info, inp, twin_params, lr=0.5)
        load(twin)
        assert_same(twin.state_dict(), sd, how)
        run(twin, twin_params, range(3, 5))
        assert_same(copy.deepcopy(twin).state_dict(), twin.state_dict(), "deepcopy")
    run(opt, params, range(3, 5))
    assert_same_tensors(params, twin_params, "resumed run")
    assert_same(copy.deepcopy(opt).state_dict(), opt.state_dict(), "deepcopy")


@pytest.mark.parametrize("info,inp", CASES)
def test_loads_older_state_dicts(info, inp):
    """Options added in later releases may be missing (their old behaviour is kept),
    and ``step`` may be a Python number, as in old torch.optim checkpoints."""
    params = make_params()
    opt = build(info, inp, params)
    run(opt, params, range(2))
    sd = copy.deepcopy(opt.state_dict())
    for key in [k for k in sd["param_groups"][0] if k not in ("params", "lr")]:
        old = copy.deepcopy(sd)
        for group in old["param_groups"]:
            del group[key]
        twin_params = [nn.Parameter(p.detach().clone()) for p in params]
        twin = build(info, inp, twin_params)
        twin.load_state_dict(old)
        expected = {**twin.defaults, **type(twin)._options_before_they_existed}[key]
        assert all(g[key] == expected or isinstance(g[key], (torch.Tensor, tuple)) for g in twin.param_groups), key
        run(twin, twin_params, range(2, 3))
    old = copy.deepcopy(sd)
    for state in old["state"].values():
        if "step" in state:
            state["step"] = state["step"].item()
    twin_params = [nn.Parameter(p.detach().clone()) for p in params]
    twin = build(info, inp, twin_params)
    twin.load_state_dict(old)
    run(twin, twin_params, range(2, 4))
    run(opt, params, range(2, 4))
    assert_same_tensors(params, twin_params, "python-number steps")


# ---- frozen groups, groups without grads, steps without grads ---------------------------------------

def _three_groups(info, inp, params, **extra):
    """Group 0 trains; group 1 is frozen; group 2's params get grads on even steps only."""
    params[2].requires_grad_(False)
    groups = [{"params": params[:2]}, {"params": [params[2]], "lr": 0.3}, {"params": params[3:]}]
    return build(info, inp, groups, **extra)


def _step_with_gaps(opt, params, k, scaler=None, compiled_step=None):
    opt.zero_grad()
    if k % 3 == 2:  # no grads at all
        pass
    else:
        loss = loss_of(params, k)
        if scaler is not None:
            loss = scaler.scale(loss)
        loss.backward()
        if k % 2:  # group 2 without grads
            for p in params[3:]:
                p.grad = None
    step = compiled_step or opt.step
    if scaler is not None and k % 3 != 2:  # (GradScaler refuses a step without grads, as for torch.optim)
        scaler.step(opt) if compiled_step is None else (scaler.unscale_(opt), step())
        scaler.update()
    else:
        step()


def _check_gaps(info, inp, make_opt, steps=6):
    """Frozen params never move nor get state; a param without a grad in a step keeps
    its value and state through that step."""
    params = make_params()
    opt = make_opt(params)
    frozen = params[2].detach().clone()
    for k in range(steps):
        before = clones(params)
        state_before = {id(p): copy.deepcopy(opt.state.get(p, {})) for p in params}
        _step_with_gaps(opt, params, k)
        untouched = params if k % 3 == 2 else (params[2:] if k % 2 else params[2:3])
        for p in untouched:
            i = next(i for i, q in enumerate(params) if q is p)
            assert torch.equal(p, before[i]), f"step {k}: param {i} moved without a grad"
            assert_same(dict(opt.state.get(p, {})), state_before[id(p)], f"step {k}: state of param {i}")
    assert torch.equal(params[2], frozen) and params[2] not in opt.state
    return params


@pytest.mark.parametrize("info,inp", CASES)
def test_frozen_and_gradless_groups(info, inp):
    _check_gaps(info, inp, lambda params: _three_groups(info, inp, params))


@pytest.mark.parametrize("name", list(BY_CLASS))
def test_frozen_and_gradless_groups_compiled(name):
    """torch.compile(opt.step) on the same steps: the same values as eager."""
    info = BY_CLASS[name]
    inp = info.optim_inputs_func("cpu")[1]
    torch._dynamo.reset()
    eager = _check_gaps(info, inp, lambda params: _three_groups(info, inp, params))
    params = make_params()
    opt = _three_groups(info, inp, params)
    step = torch.compile(opt.step, fullgraph=True)
    for k in range(6):
        _step_with_gaps(opt, params, k, compiled_step=step)
    for i, (a, b) in enumerate(zip(params, eager)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=lambda m, i=i: f"param {i}: {m}")


@pytest.mark.parametrize("name", list(BY_CLASS))
@pytest.mark.parametrize("in_step", [False, True], ids=["unscale_first", "unscale_in_step"])
def test_frozen_and_gradless_groups_grad_scaler(name, in_step):
    info = BY_CLASS[name]
    inp = info.optim_inputs_func("cpu")[1]
    params = make_params()
    opt = _three_groups(info, inp, params, unscale_in_step=in_step)
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    ref_params = make_params()
    ref = _three_groups(info, inp, ref_params)
    for k in range(6):
        _step_with_gaps(opt, params, k, scaler=scaler)
        _step_with_gaps(ref, ref_params, k)
    for i, (a, b) in enumerate(zip(params, ref_params)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m, i=i: f"param {i}: {m}")


def test_frozen_and_gradless_groups_clipping_and_fuse_optimizer():
    """Lamb's per-group clipping with a group whose params all lack grads (it used
    to crash), and fuse_optimizer around a torch optimizer with such groups."""
    inp = next(i for i in BY_CLASS["Lamb"].optim_inputs_func("cpu") if i.desc == "max_grad_norm")
    _check_gaps(BY_CLASS["Lamb"], inp, lambda params: _three_groups(BY_CLASS["Lamb"], inp, params))
    params = make_params()
    params[2].requires_grad_(False)
    groups = [{"params": params[:2]}, {"params": [params[2]]}, {"params": params[3:]}]
    fused = inductor_lamb.fuse_optimizer(torch.optim.AdamW(groups, lr=0.01))
    for k in range(6):
        _step_with_gaps(fused, params, k)
    lamb16 = inductor_lamb.fuse_optimizer(inductor_lamb.Lamb16(make_params(), lr=0.01))
    lamb16.step()  # no grads at all


# ---- closures, hooks, add_param_group ---------------------------------------------------------

@pytest.mark.parametrize("info,inp", CASES)
def test_closure_hooks_and_add_param_group(info, inp):
    params = make_params()
    opt = build(info, inp, params[:3])
    calls = []
    handles = [
        opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre")),
        opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post")),
        opt.register_state_dict_pre_hook(lambda o: calls.append("sd_pre")),
        opt.register_state_dict_post_hook(lambda o, sd: calls.append("sd_post")),
        opt.register_load_state_dict_pre_hook(lambda o, sd: calls.append("load_pre")),
        opt.register_load_state_dict_post_hook(lambda o: calls.append("load_post")),
    ]

    def closure():
        opt.zero_grad()
        return backward(params, 0)

    before = clones(params)
    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.item() == loss_of(before, 0).item()
    opt.load_state_dict(opt.state_dict())
    assert calls == ["pre", "post", "sd_pre", "sd_post", "load_pre", "load_post"]
    for h in handles:
        h.remove()
    # a group added mid-training starts with fresh state and steps from then on
    opt.add_param_group({"params": params[3:]})
    twin_params = [nn.Parameter(p.detach().clone()) for p in params]
    twin = build(info, inp, [{"params": twin_params[:3]}, {"params": twin_params[3:]}])
    for p, q in zip(params[:3], twin_params[:3]):
        twin.state[q].update(copy.deepcopy(opt.state[p]))
    run(opt, params, range(1, 3))
    run(twin, twin_params, range(1, 3))
    assert_same_tensors(params, twin_params, "after add_param_group")
    assert calls == ["pre", "post", "sd_pre", "sd_post", "load_pre", "load_post"]


@pytest.mark.parametrize("info,inp", CASES)
def test_rebuilt_from_its_defaults(info, inp):
    """``type(opt)(params, **opt.defaults)`` (how torch's ZeroRedundancyOptimizer builds its local
    optimizer) takes every default back and steps the same."""
    params, twin_params = make_params(), make_params()
    opt = build(info, inp, params)
    twin = type(opt)(twin_params, **opt.defaults)
    assert set(twin.defaults) == set(opt.defaults)
    run(opt, params, range(2))
    run(twin, twin_params, range(2))
    assert_same_tensors(params, twin_params, "rebuilt from its defaults")


@pytest.mark.parametrize("name", list(BY_CLASS))
def test_load_state_dict_hooks_in_torchs_order(name):
    """torch.optim's order: the pre hooks (which may change the state dict), then the whole load
    (the optimizer's own conversions included), then the post hooks, which see the loaded state
    in the ops' dtypes and may write flags into ``state`` as PyTorch's own tests do. Such entries
    survive state dicts, copies and further loads, and the steps go on unchanged."""
    params = make_params()
    opt = BY_CLASS[name].optim_cls(params, lr=0.01)
    run(opt, params, range(2))
    twin_params = [nn.Parameter(p.detach().clone()) for p in params]
    twin = BY_CLASS[name].optim_cls(twin_params, lr=0.01)
    seen = []

    def pre(o, sd):
        seen.append("pre")
        sd = dict(sd, param_groups=[dict(g, lr=0.02) for g in sd["param_groups"]])
        return sd

    def post(o):
        seen.append("post")
        state = o.state[twin_params[0]]
        # the optimizer's own conversions already ran: state in the ops' dtypes, static addresses
        for key, value in opt.state[params[0]].items():
            assert state[key].dtype == value.dtype, key
            assert getattr(state[key], "_dynamo_static_input_type", None) is not None
        o.state["ran_load_state_dict_post_hook"] = True

    twin.register_load_state_dict_pre_hook(pre)
    twin.register_load_state_dict_post_hook(post)
    twin.load_state_dict(opt.state_dict())
    assert seen == ["pre", "post"] and twin.param_groups[0]["lr"] == 0.02  # (as the hook wrote it)
    assert twin.state["ran_load_state_dict_post_hook"] is True
    opt.param_groups[0]["lr"] = 0.02
    run(opt, params, range(2, 4))
    run(twin, twin_params, range(2, 4))
    assert_same_tensors(twin_params, params, "steps after a load with hooks")
    assert twin.state_dict()["state"]["ran_load_state_dict_post_hook"] is True
    for copied in (copy.deepcopy(twin), pickle.loads(pickle.dumps(twin))):
        assert copied.state["ran_load_state_dict_post_hook"] is True
    assert twin.state_bytes_per_param() == opt.state_bytes_per_param()
    twin.load_state_dict(twin.state_dict())
    assert seen == ["pre", "post"] * 2


# ---- schedulers -------------------------------------------------------------------------------------

def _schedulers(opt, name):
    """Scheduler ``name`` on ``opt``; an lr argument is the group's own lr, as Lightning's
    ``OneCycleLR(opt, max_lr=opt.param_groups[0]["lr"])`` passes it (a float or a tensor)."""
    has_momentum = any(k in opt.defaults for k in ("momentum", "betas"))
    base = opt.param_groups[0]["lr"]
    return {
        "LambdaLR": lambda: lr_scheduler.LambdaLR(opt, lambda k: 0.9 ** k),
        "MultiplicativeLR": lambda: lr_scheduler.MultiplicativeLR(opt, lambda k: 0.95),
        "StepLR": lambda: lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
        "MultiStepLR": lambda: lr_scheduler.MultiStepLR(opt, milestones=[1, 3], gamma=0.3),
        "ConstantLR": lambda: lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2),
        "LinearLR": lambda: lr_scheduler.LinearLR(opt, start_factor=0.2, total_iters=3),
        "ExponentialLR": lambda: lr_scheduler.ExponentialLR(opt, gamma=0.8),
        "PolynomialLR": lambda: lr_scheduler.PolynomialLR(opt, total_iters=4, power=2.0),
        "CosineAnnealingLR": lambda: lr_scheduler.CosineAnnealingLR(opt, T_max=3),
        "CosineAnnealingWarmRestarts": lambda: lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=2),
        "CyclicLR": lambda: lr_scheduler.CyclicLR(opt, base_lr=float(base) / 4, max_lr=base, step_size_up=2,
                                                  cycle_momentum=has_momentum, base_momentum=0.8, max_momentum=0.9),
        "OneCycleLR": lambda: lr_scheduler.OneCycleLR(opt, max_lr=base, total_steps=10,
                                                      cycle_momentum=has_momentum),
        "SequentialLR": lambda: lr_scheduler.SequentialLR(
            opt, [lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2),
                  lr_scheduler.ExponentialLR(opt, gamma=0.9)], milestones=[2]),
        "ChainedScheduler": lambda: lr_scheduler.ChainedScheduler(
            [lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2), lr_scheduler.ExponentialLR(opt, gamma=0.9)]),
        "ReduceLROnPlateau": lambda: lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5),
    }[name]()


# every class of torch.optim.lr_scheduler that schedules by itself (LRScheduler is the base)
SCHEDULERS = ["LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR",
              "PolynomialLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "CyclicLR", "OneCycleLR",
              "SequentialLR", "ChainedScheduler", "ReduceLROnPlateau"]


def test_every_scheduler_class_is_tested():
    classes = {name for name, c in vars(lr_scheduler).items()
               if isinstance(c, type) and issubclass(c, (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau))
               and c is not lr_scheduler.LRScheduler and not name.startswith("_")}
    assert classes - {"_LRScheduler"} <= set(SCHEDULERS), classes - set(SCHEDULERS)


def _drive(opt, params, sched, steps, step_fn=None):
    """Steps with ``sched``; returns what the group held at each step: lr, betas, momentum
    (as written: the scheduler's floats, or the user's tensor's value)."""
    seen = []
    for k in steps:
        opt.zero_grad()
        loss = backward(params, k)
        (step_fn or opt.step)()
        g = opt.param_groups[0]
        seen.append((float(g["lr"]), *[float(b) for b in g.get("betas", ())], float(g.get("momentum", 0.0))))
        sched.step(loss.item()) if isinstance(sched, lr_scheduler.ReduceLROnPlateau) else sched.step()
    return seen


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("lr_kind", ["float", "tensor"])
@pytest.mark.parametrize("sched_name", SCHEDULERS)
@pytest.mark.parametrize("name", list(BY_CLASS))
def test_schedulers_drive_the_lr_as_torch_optims(name, sched_name, lr_kind, compiled):
    """Every scheduler drives the lr (and betas, momentum) exactly as it drives torch.optim.SGD's:
    a float lr reads back as the scheduler's float, a tensor lr stays the user's tensor, filled
    in place; the steps are those of a run whose values are written into the group by hand, bit
    for bit; a step traced into a graph (``torch.compile(opt.step, fullgraph=True)``) compiles
    once whatever the scheduler writes (guards and routes are Dynamo's: its eager backend)."""
    torch._dynamo.reset()
    info = BY_CLASS[name]
    inp = info.optim_inputs_func("cpu")[1]
    base = float(build(info, inp, make_params()).defaults["lr"])
    lr = torch.tensor(base) if lr_kind == "tensor" else base
    params = make_params()
    opt = build(info, inp, params, lr=lr)
    counter = CompileCounter()
    step = torch.compile(opt.step, backend=counter, fullgraph=True) if compiled else opt.step
    seen = _drive(opt, params, _schedulers(opt, sched_name), range(6), step)
    assert opt.param_groups[0]["lr"] is lr if lr_kind == "tensor" else type(opt.param_groups[0]["lr"]) is float
    assert counter.frame_count == (1 if compiled else 0)
    sgd_lr = torch.tensor(base) if lr_kind == "tensor" else base
    sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=sgd_lr, momentum=0.9)
    expected = []
    ref_sched = _schedulers(sgd, sched_name)
    for k in range(6):
        expected.append(float(sgd.param_groups[0]["lr"]))
        sgd.step()
        ref_sched.step(loss_of(params, k).item()) if isinstance(ref_sched, lr_scheduler.ReduceLROnPlateau) \
            else ref_sched.step()
    if sched_name != "ReduceLROnPlateau":  # (its decisions follow each run's own losses)
        assert [s[0] for s in seen] == expected  # (the same floats: what was written reads back)
    by_hand = make_params()
    lr2 = torch.tensor(base) if lr_kind == "tensor" else base
    opt2 = build(info, inp, by_hand, lr=lr2)
    for k, values in enumerate(seen):
        g = opt2.param_groups[0]
        if lr_kind == "tensor":
            lr2.fill_(values[0])
        else:
            g["lr"] = values[0]
        if "betas" in g:
            g["betas"] = values[1:3]
        if "momentum" in g:
            g["momentum"] = values[-1]
        opt2.zero_grad()
        backward(by_hand, k)
        opt2.step()
    assert_same_tensors(params, by_hand, sched_name)


@pytest.mark.parametrize("name", list(BY_CLASS))
def test_schedulers_compiled_without_recompiles(name):
    """torch.compile(opt.step) under every scheduler, one after the other on one
    optimizer: no recompile as lr, betas or momentum change, and the eager values."""
    info = BY_CLASS[name]
    inp = info.optim_inputs_func("cpu")[1]
    torch._dynamo.reset()
    params, eager_params = make_params(), make_params()
    opt, eager = build(info, inp, params), build(info, inp, eager_params)
    compiled = torch.compile(opt.step, fullgraph=True)
    calls = 0

    def step():
        # A new scheduler adds keys to the param groups (initial_lr, max_momentum, ...): they
        # never reach the ops or Dynamo's guards (the step reads the groups' views): no recompile.
        nonlocal calls
        calls += 1
        with torch._dynamo.config.patch(error_on_recompile=calls > 1):
            compiled()

    for i, sched_name in enumerate(SCHEDULERS):
        with torch._dynamo.config.patch(recompile_limit=64):
            a = _drive(opt, params, _schedulers(opt, sched_name), range(3 * i, 3 * i + 3), step)
        b = _drive(eager, eager_params, _schedulers(eager, sched_name), range(3 * i, 3 * i + 3))
        assert a == b, sched_name
        for j, (x, y) in enumerate(zip(params, eager_params)):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7, msg=lambda m, j=j: f"{sched_name}: param {j}: {m}")


# ---- maximize, dtypes, layouts ------------------------------------------------------------------

@pytest.mark.parametrize("info,inp", [c for c in CASES if c.values[1].kwargs.get("maximize")])
def test_maximize_equals_minimizing_the_negation(info, inp):
    params, neg = make_params(), make_params()
    opt = build(info, inp, params)
    kwargs = {k: v for k, v in inp.kwargs.items() if k != "maximize"}
    opt_neg = info.optim_cls(neg, **copy.deepcopy(kwargs))
    for k in range(3):
        opt.zero_grad()
        opt_neg.zero_grad()
        backward(params, k)
        backward(neg, k, scale=-1.0)
        opt.step()
        opt_neg.step()
    assert_same_tensors(params, neg)


def _reference_run(info, inp, params64, grads64, lrs):
    """The float64 reference functions driven step by step (inductor_lamb.reference):
    the truth every dtype is compared with."""
    opt = build(info, inp, params64)
    spec = opt._layout.spec
    fn = getattr(reference, spec.reference)
    state = {}
    for k, lr in enumerate(lrs):
        for p, g in zip(params64, grads64[k]):
            p.grad = g
        for group in opt._sync_views():  # (the groups as the ops take them: scheduled values as tensors)
            ps = [p for p in group["params"] if p.grad is not None]
            sts = [state.setdefault(p, opt._init_state(p, group)) for p in ps]
            lists = {"params": ps, "grads": [p.grad for p in ps], "steps": [s.get("step") for s in sts]}
            for key, arg in opt._layout.lists.items():
                lists[arg] = [s[key] for s in sts]
            hypers = opt._hypers(group, Bucket(ps[0].device, {"params": ps}, [None] * len(ps)))
            hypers["lr"] = torch.tensor(lr, dtype=torch.float64)  # (a float would be rounded to float32)
            with torch.no_grad():
                fn(**{a.name: lists[a.name] for a in spec.args if a.name in lists and a.name != "master_params"},
                   **{k2: v for k2, v in hypers.items() if k2 != "lr"}, lr=hypers["lr"])
    return params64


@pytest.mark.parametrize("dtype,master", [(torch.float32, False), (torch.float64, False), (torch.bfloat16, True),
                                          (torch.float16, True), (torch.bfloat16, False)],
                         ids=["float32", "float64", "bfloat16_master", "float16_master", "bfloat16"])
@pytest.mark.parametrize("name", list(BY_CLASS))
def test_dtypes_match_the_float64_reference(name, dtype, master):
    """4 steps with a changing lr on random grads: float64 params match the float64
    reference to float64 precision, the others to their own precision."""
    info = BY_CLASS[name]
    inp = info.optim_inputs_func("cpu")[1]
    extra = {"stochastic_rounding": False} if name == "Lamb16" else {}
    gen = torch.Generator().manual_seed(7)
    shapes = [(8, 6), (8,), (3, 8), (), (0, 4)]
    start = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype).double() for s in shapes]
    grads = [[torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for s in shapes] for _ in range(4)]
    lrs = [0.02, 0.01, 0.005, 0.0025]
    params = [nn.Parameter(v.to(dtype, copy=True)) for v in start]
    opt = build(info, inp, params, master_weights=master, lr=lrs[0], **extra)
    for k, lr in enumerate(lrs):
        opt.param_groups[0]["lr"] = lr
        for p, g in zip(params, grads[k]):
            p.grad = g.clone()
        opt.step()
    truth = _reference_run(info, copy.deepcopy(inp), [nn.Parameter(v.clone()) for v in start],
                           [[g.double() for g in gs] for gs in grads], lrs) if name != "Lamb16" else None
    if name == "Lamb16":  # (its float8 state rounds at every step: compare with the float64 path of the optimizer)
        ref_params = [nn.Parameter(v.clone()) for v in start]
        ref = build(info, inp, ref_params, lr=lrs[0], **extra)
        for k, lr in enumerate(lrs):
            ref.param_groups[0]["lr"] = lr
            for p, g in zip(ref_params, grads[k]):
                p.grad = g.double()
            ref.step()
        truth = ref_params
    tol = {torch.float64: (1e-12, 1e-14), torch.float32: (2e-5, 1e-6)}.get(dtype, (2e-2, 2e-2) if not master
                                                                       else (1e-2, 1e-2))
    if name == "Lamb16" and dtype != torch.float64:
        tol = (max(tol[0], 5e-4), max(tol[1], 5e-5))
    for i, (p, t) in enumerate(zip(params, truth)):
        got = opt.state[p]["master_param"] if master and dtype != torch.float32 and p.numel() else p
        torch.testing.assert_close(got.detach().double(), t.detach().double(), rtol=tol[0], atol=tol[1],
                                   msg=lambda m: f"param {i}: {m}")
    if dtype == torch.float64:
        state = opt.state[params[0]]
        assert all(v.dtype in (torch.float64, torch.float8_e4m3fn, torch.float8_e5m2) or k in ("step",) or v.dim() == 0
                   for k, v in state.items()), {k: v.dtype for k, v in state.items()}
        assert opt.param_groups[0]["lr"] == lrs[-1] and opt._sync_views()[0]["lr"].dtype == torch.float64


def test_float64_adagrad_equals_torch_optim():
    """An independent float64 check: torch.optim.Adagrad, to the last bits."""
    params, ref_params = make_params(torch.float64), make_params(torch.float64)
    opt = inductor_lamb.Adagrad(params, lr=0.05, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)
    ref = torch.optim.Adagrad(ref_params, lr=0.05, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)
    run(opt, params, range(5))
    run(ref, ref_params, range(5))
    for p, q in zip(params, ref_params):
        torch.testing.assert_close(p, q, rtol=1e-14, atol=1e-16)
        torch.testing.assert_close(opt.state[p]["sum"], ref.state[q]["sum"], rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("name", list(BY_CLASS))
def test_float64_compiled_matches_eager(name):
    info = BY_CLASS[name]
    inp = info.optim_inputs_func("cpu")[1]
    torch._dynamo.reset()
    params, eager_params = make_params(torch.float64), make_params(torch.float64)
    opt, eager = build(info, inp, params), build(info, inp, eager_params)
    step = torch.compile(opt.step)
    for k in range(3):
        for o, ps, s in ((opt, params, step), (eager, eager_params, eager.step)):
            o.zero_grad()
            backward(ps, k)
            s()
    for p, q in zip(params, eager_params):
        torch.testing.assert_close(p, q, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("info,inp", CASES)
def test_noncontiguous_params_step_like_contiguous_ones(info, inp):
    """Params and grads with gaps or transposed strides step like contiguous ones
    (to the rounding of the norms, which sum in memory order)."""
    params, strided = make_params(), make_params(noncontiguous=True)
    assert not all(p.is_contiguous() for p in strided)
    opt, opt_s = build(info, inp, params), build(info, inp, strided)
    for k in range(3):
        opt.zero_grad()
        backward(params, k)  # (the grads of strided params would round differently in the matmuls)
        for p, q in zip(params, strided):
            q.grad = torch.empty_strided(q.shape, q.stride()).copy_(p.grad)
        opt.step()
        opt_s.step()
    for i, (p, q) in enumerate(zip(params, strided)):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=lambda m, i=i: f"param {i}: {m}")
        assert q.stride() == make_params(noncontiguous=True)[i].stride()


# ---- errors --------------------------------------------------------------------------------------

ERROR_CASES = [pytest.param(info, e, id=f"{info.optim_cls.__name__}-{e.optimizer_error_input.desc[:40]}")
               for info in INFOS for e in info.optim_error_inputs_func("cpu", torch.float32)]


@pytest.mark.parametrize("info,error", ERROR_CASES)
def test_constructor_errors(info, error):
    inp = error.optimizer_error_input
    params = inp.params if inp.params is not None else [nn.Parameter(torch.randn(2, 2))]
    assert error.error_on == OptimizerErrorEnum.CONSTRUCTION_ERROR
    if issubclass(error.error_type, Warning):
        with pytest.warns(error.error_type, match=error.error_regex):
            info.optim_cls(params, **inp.kwargs)
    else:
        with pytest.raises(error.error_type, match=error.error_regex):
            info.optim_cls(params, **inp.kwargs)


# The same check as a torch.optim optimizer's: the same message.
SAME_AS_TORCH = [
    ("Lamb", torch.optim.Adam, dict(lr=torch.tensor([0.1, 0.2]))),
    ("Lamb", torch.optim.Adam, dict(lr=-1.0)),
    ("Lamb", torch.optim.Adam, dict(betas=(1.0, 0.9))),
    ("Lamb", torch.optim.Adam, dict(betas=(0.9, -0.5))),
    ("Lamb", torch.optim.Adam, dict(eps=-1e-3)),
    ("Lamb", torch.optim.Adam, dict(weight_decay=-0.1)),
    ("Lamb16", torch.optim.Adam, dict(betas=(0.9, 1.5))),
    ("Lamb16", torch.optim.Adam, dict(lr=torch.zeros(2, 2))),
    ("Lars", torch.optim.SGD, dict(momentum=-0.9)),
    ("Lars", torch.optim.SGD, dict(weight_decay=-0.9)),
    ("Lars", torch.optim.SGD, dict(lr=torch.tensor([0.1, 0.2]))),
    ("Adagrad", torch.optim.Adagrad, dict(lr_decay=-1.0)),
    ("Adagrad", torch.optim.Adagrad, dict(initial_accumulator_value=-1.0)),
    ("Adagrad", torch.optim.Adagrad, dict(eps=-1.0)),
    ("Adagrad", torch.optim.Adagrad, dict(lr=-0.5)),
]


@pytest.mark.parametrize("name,torch_cls,kwargs", SAME_AS_TORCH,
                         ids=[f"{n}-{','.join(k)}" for n, _, k in SAME_AS_TORCH])
def test_errors_match_torch_optim(name, torch_cls, kwargs):
    with pytest.raises(Exception) as theirs:
        torch_cls([nn.Parameter(torch.randn(2))], **kwargs)
    with pytest.raises(type(theirs.value), match=f"^{re.escape(str(theirs.value))}$"):
        getattr(inductor_lamb, name)([nn.Parameter(torch.randn(2))], **kwargs)


BAD_GROUP_VALUES = [("Lamb", "lr", -1.0, ValueError, "Invalid learning rate: -1.0"),
                    ("Lamb", "betas", (1.0, 0.9), ValueError, "Invalid beta parameter at index 0: 1.0"),
                    ("Lamb16", "betas", (0.9, 2.0), ValueError, "Invalid beta parameter at index 1: 2.0"),
                    ("Lars", "momentum", -0.5, ValueError, "Invalid momentum value: -0.5"),
                    ("Adagrad", "lr", -0.1, ValueError, "Invalid learning rate: -0.1")]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name,key,value,error,message", BAD_GROUP_VALUES,
                         ids=[f"{n}-{k}" for n, k, *_ in BAD_GROUP_VALUES])
def test_bad_values_written_into_groups_raise_before_any_write(name, key, value, error, message, compiled):
    """A scheduler or a user writes a bad value into a param group: the next step
    raises torch.optim's error, eagerly and compiled, with every tensor untouched."""
    info = BY_CLASS[name]
    torch._dynamo.reset()
    params = make_params()
    opt = build(info, info.optim_inputs_func("cpu")[1], params)
    step = torch.compile(opt.step) if compiled else opt.step
    run(opt, params, range(1))
    backward(params, 1)
    before, state = clones(params), copy.deepcopy(opt.state_dict())
    opt.param_groups[0][key] = value if not compiled else value
    with pytest.raises(error, match=re.escape(message)):
        step()
    assert_same_tensors(params, before)
    for p, saved in zip(params, state["state"].values()):
        assert_same(dict(opt.state[p]), saved)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", ["Lamb", "Lamb16", "Lars"])
def test_sparse_grads_rejected_naming_the_param(name, compiled):
    emb = nn.Embedding(10, 4, sparse=True)
    dense = nn.Linear(4, 2)
    opt = getattr(inductor_lamb, name)([*dense.parameters(), *emb.parameters()], lr=0.01)
    dense(emb(torch.tensor([1, 2]))).sum().backward()
    before = [p.detach().clone() for p in (*dense.parameters(), emb.weight)]
    step = torch.compile(opt.step) if compiled else opt.step
    with pytest.raises(RuntimeError, match=f"{name} does not support sparse gradients \\(param 2 of param group 0\\)"):
        step()
    assert_same_tensors([*dense.parameters(), emb.weight], before)


# ---- sparse Adagrad -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kwargs", [dict(lr=0.1), dict(lr=0.1, lr_decay=0.05, initial_accumulator_value=0.2),
                                    dict(lr=0.05, maximize=True, eps=1e-3)], ids=["default", "lr_decay", "maximize"])
def test_sparse_adagrad_matches_torch_optim(kwargs, dtype):
    """nn.Embedding(sparse=True) next to a dense layer in one group, repeated
    (uncoalesced) indices: the same values as torch.optim.Adagrad, and rows no index
    touched keep their value and state."""
    torch.manual_seed(0)
    emb = nn.Embedding(50, 6, sparse=True).to(dtype)
    lin = nn.Linear(6, 1).to(dtype)
    emb2, lin2 = copy.deepcopy(emb), copy.deepcopy(lin)
    opt = inductor_lamb.Adagrad([*emb.parameters(), *lin.parameters()], **kwargs)
    ref = torch.optim.Adagrad([*emb2.parameters(), *lin2.parameters()], **kwargs)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-14, atol=1e-15)
    for k in range(4):
        idx = torch.randint(0, 50, (12,), generator=torch.Generator().manual_seed(k))
        idx[-1] = idx[0]  # a repeated row
        before = emb.weight.detach().clone()
        for e, lin_, o in ((emb, lin, opt), (emb2, lin2, ref)):
            o.zero_grad()
            lin_(e(idx)).pow(2).sum().backward()
            o.step()
        untouched = torch.ones(50, dtype=torch.bool)
        untouched[idx] = False
        assert torch.equal(emb.weight[untouched], before[untouched])
        torch.testing.assert_close(emb.weight, emb2.weight, **tol)
        torch.testing.assert_close(lin.weight, lin2.weight, **tol)
        torch.testing.assert_close(opt.state[emb.weight]["sum"], ref.state[emb2.weight]["sum"], **tol)


def test_sparse_adagrad_multi_dim_indices_and_master_weights():
    """A sparse grad with 2 sparse dims; bfloat16 params with float32 master copies."""
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(5, 4, 3))
    p16 = nn.Parameter(p.detach().bfloat16())
    q = nn.Parameter(p.detach().clone())
    idx = torch.tensor([[0, 2, 4, 2], [1, 3, 0, 3]])
    values = torch.randn(4, 3)
    opt = inductor_lamb.Adagrad([p], lr=0.1)
    opt16 = inductor_lamb.Adagrad([p16], lr=0.1, master_weights=True)
    ref = torch.optim.Adagrad([q], lr=0.1)
    for _ in range(2):
        p.grad = torch.sparse_coo_tensor(idx, values, p.shape)
        p16.grad = torch.sparse_coo_tensor(idx, values.bfloat16(), p.shape)
        q.grad = torch.sparse_coo_tensor(idx, values, p.shape)
        opt.step()
        opt16.step()
        ref.step()
    torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(opt16.state[p16]["master_param"], q.detach(), rtol=1e-2, atol=1e-2)
    assert torch.equal(p16.detach(), opt16.state[p16]["master_param"].bfloat16())


def test_sparse_adagrad_weight_decay_error_and_state_dict():
    emb = nn.Embedding(10, 4, sparse=True)
    opt = inductor_lamb.Adagrad(emb.parameters(), weight_decay=0.1)
    emb(torch.tensor([1, 2])).sum().backward()
    before = emb.weight.detach().clone()
    with pytest.raises(RuntimeError, match="^weight_decay option is not compatible with sparse gradients$"):
        opt.step()
    assert torch.equal(emb.weight, before)
    ref = torch.optim.Adagrad(emb.parameters(), weight_decay=0.0)
    opt = inductor_lamb.Adagrad(emb.parameters())
    for o in (opt, ref):
        o.step()
    opt2 = inductor_lamb.Adagrad(emb.parameters())
    opt2.load_state_dict(ref.state_dict())  # torch.optim.Adagrad's checkpoints load (and ours into it)
    ref.load_state_dict(opt.state_dict())


# ---- other implementations' checkpoints -------------------------------------------------------

def test_loads_timm_lamb_state_dict():
    """State dicts written by timm's Lamb (per-group step; fixtures/make_timm_lamb.py)
    resume on timm's own trajectory."""
    from pathlib import Path

    from timm_cases import CASES as TIMM_CASES
    from timm_cases import make_model, run_steps

    fixture = torch.load(Path(__file__).parent / "fixtures" / "timm_lamb.pt", weights_only=True)
    for name, (groups, _) in TIMM_CASES.items():
        saved = fixture["cases"][name]
        model = make_model()
        model.load_state_dict(saved["checkpoint"]["model"])
        opt = inductor_lamb.Lamb(groups(model), lr=0.5)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # these settings carry over whole: no warning
            opt.load_state_dict(saved["checkpoint"]["opt"])
        group_step = float(saved["checkpoint"]["opt"]["param_groups"][0]["step"])
        assert all(float(s["step"]) == group_step for s in opt.state.values())
        assert "step" not in opt.state_dict()["param_groups"][0] and "foreach" not in opt.param_groups[0]
        run_steps(model, opt, range(3, 6))
        for key, value in model.state_dict().items():
            torch.testing.assert_close(value, saved["after"][key], rtol=1e-5, atol=1e-6, msg=lambda m, key=key: f"{name}: {key}: {m}")


def test_loads_apex_fused_lamb_layout_and_warns_what_does_not_carry_over():
    """apex FusedLAMB's layout (int step per group, its defaults' keys), and timm
    options this Lamb lacks, named in a warning."""
    params = make_params()
    opt = inductor_lamb.Lamb(params, lr=0.01)
    run(opt, params, range(2))
    ours = opt.state_dict()
    apex = {"state": {i: {k: v for k, v in s.items() if k != "step"} for i, s in ours["state"].items()},
            "param_groups": [{"lr": 0.01, "bias_correction": True, "betas": (0.9, 0.999), "eps": 1e-6,
                              "weight_decay": 0.01, "grad_averaging": True, "max_grad_norm": 1.0, "step": 2,
                              "params": ours["param_groups"][0]["params"]}]}
    twin_params = [nn.Parameter(p.detach().clone()) for p in params]
    twin = inductor_lamb.Lamb(twin_params)
    twin.load_state_dict(copy.deepcopy(apex))
    assert all(float(s["step"]) == 2.0 for s in twin.state.values())
    assert twin.param_groups[0]["max_grad_norm"] == 1.0
    timm_like = copy.deepcopy(apex)
    timm_like["param_groups"][0].update(caution=True, decoupled_decay=True, corrected_weight_decay=True, foreach=None,
                                        max_lr_snapshot=0.02)
    timm_like["param_groups"].append({**timm_like["param_groups"][0], "params": []})
    adopter = inductor_lamb.Lamb([{"params": twin_params}, {"params": []}])
    with pytest.warns(UserWarning, match="caution=True .* not supported") as record:
        adopter.load_state_dict(timm_like)
    assert "max_grad_norm clips by the grad norm of each param group" in str(record[0].message)
    assert "decoupled_decay" not in str(record[0].message)  # (timm's decoupled decay, corrected: taken as is)
    group = adopter.param_groups[0]
    assert group["decoupled_decay"] is True and group["max_lr_snapshot"] == 0.02 and "max_lr" not in group


# ---- torch.amp and training frameworks ----------------------------------------------------------

@pytest.mark.parametrize("name", list(BY_CLASS))
def test_grad_scaler_unscale_and_clip_grad_norm(name):
    """The plain GradScaler recipe with clipping: scale, backward, unscale_,
    clip_grad_norm_, step, update; the same as clipping unscaled grads."""
    info = BY_CLASS[name]
    inp = info.optim_inputs_func("cpu")[1]
    for in_step in (False, True):
        params, ref_params = make_params(), make_params()
        opt, ref = build(info, inp, params, unscale_in_step=in_step), build(info, inp, ref_params)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        for k in range(3):
            opt.zero_grad()
            scaler.scale(loss_of(params, k)).backward()
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(params, 0.1)
            scaler.step(opt)
            scaler.update()
            ref.zero_grad()
            backward(ref_params, k)
            nn.utils.clip_grad_norm_(ref_params, 0.1)
            ref.step()
        for p, q in zip(params, ref_params):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert not getattr(build(info, inp, make_params()), "_step_supports_amp_scaling")


@pytest.mark.parametrize("name", list(BY_CLASS))
def test_docstring_documents_every_argument(name):
    """Each constructor argument is documented once, shared docs filled in."""
    import inspect

    cls = BY_CLASS[name].optim_cls
    doc = cls.__doc__
    assert "{" not in doc.split("Args:")[-1].split("State per parameter")[0], "an unfilled placeholder"
    from inductor_lamb.optim._base import FusedOptions

    args = [a for a, p in inspect.signature(cls.__init__).parameters.items() if p.kind is not p.VAR_KEYWORD]
    for arg in [*args, *FusedOptions.__annotations__]:  # (**options: the options every optimizer takes)
        if arg not in ("self", "params"):
            assert len(re.findall(rf"^ {{8}}{arg}: ", doc, re.M)) == 1, arg


# ---- copies and a user's lr tensor ---------------------------------------------------------------

COPIES = {"pickle": lambda x: pickle.loads(pickle.dumps(x)), "deepcopy": copy.deepcopy}


@pytest.mark.parametrize("when", ["before_a_step", "after_steps"])
@pytest.mark.parametrize("how", list(COPIES))
@pytest.mark.parametrize("info,inp", CASES)
def test_copies_step_like_the_original(info, inp, how, when):
    """An optimizer pickled or deep-copied with its params, before any step or after some (float8
    state, master copies, exclusions, every configuration), steps to the original's bits, and
    its compiled ``opt.step`` works (the copy's own, not the original's)."""
    dtype = torch.bfloat16 if inp.kwargs.get("master_weights") else torch.float32
    params = make_params(dtype)
    opt = build(info, inp, params)
    if when == "after_steps":
        run(opt, params, range(2))
    params_copy, opt_copy = COPIES[how]((params, opt))
    assert type(opt_copy) is type(opt) and opt_copy.param_groups[0]["params"][0] is params_copy[0]
    run(opt, params, range(2, 4))
    run(opt_copy, params_copy, range(2, 4))
    assert_same_tensors(params_copy, params, "param")
    assert_same(opt_copy.state_dict(), opt.state_dict())
    torch._dynamo.reset()
    step = torch.compile(opt_copy.step)
    for k in range(4, 6):
        for o, ps, st in ((opt, params, opt.step), (opt_copy, params_copy, step)):
            o.zero_grad()
            backward(ps, k)
            st()
    assert_same_tensors(params_copy, params, "param after compiled steps")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", list(BY_CLASS))
def test_a_users_lr_tensor_is_the_lr(name, compiled):
    """``lr=torch.tensor(...)`` stays the group's lr (``group["lr"] is lr``), as torch.optim
    keeps it: changing it in place changes the next step, eager or compiled (no recompile),
    down to lr 0, where nothing moves (LARS with ``lr_in_momentum=False``; its default, the
    paper's velocity, keeps moving by its momentum). A float written over it afterwards leaves
    the user's tensor alone."""
    from torch._dynamo.testing import CompileCounterWithBackend

    extra = {"lr_in_momentum": False} if name == "Lars" else {}
    lrs = [1e-2, 5e-3, 0.0, 0.0, 2e-3]
    floats, tensors = make_params(), make_params()
    opt_f = BY_CLASS[name].optim_cls(floats, lr=lrs[0], **extra)
    lr = torch.tensor(lrs[0])
    opt_t = BY_CLASS[name].optim_cls(tensors, lr=lr, **extra)
    assert opt_t.param_groups[0]["lr"] is lr
    counter = CompileCounterWithBackend("inductor")
    torch._dynamo.reset()
    step_t = torch.compile(opt_t.step, backend=counter) if compiled else opt_t.step
    for k, value in enumerate(lrs):
        opt_f.param_groups[0]["lr"] = value
        lr.fill_(value)
        before = clones(tensors)
        for o, ps, st in ((opt_f, floats, opt_f.step), (opt_t, tensors, step_t)):
            o.zero_grad()
            backward(ps, k)
            st()
        assert_same_tensors(tensors, floats, f"step {k}")
        if value == 0.0:
            assert_same_tensors(tensors, before, f"step {k} at lr 0")
        if k == 0:
            first = counter.frame_count
    assert counter.frame_count == first  # (no recompile)
    opt_t.param_groups[0]["lr"] = 0.5
    assert lr.item() == torch.tensor(lrs[-1]).item() and float(opt_t.param_groups[0]["lr"]) == 0.5


def test_lars_lr_in_the_momentum_keeps_moving_at_lr_zero():
    """The paper's (and PaddlePaddle's) LARS carries the lr in its velocity: at lr 0 the params
    still move by the momentum they have; ``lr_in_momentum=False`` (torch SGD's form, timm's)
    moves nothing."""
    for in_momentum, moves in ((True, True), (False, False)):
        params = make_params()
        opt = inductor_lamb.Lars(params, lr=0.1, momentum=0.9, lr_in_momentum=in_momentum)
        run(opt, params, range(2))
        opt.param_groups[0]["lr"] = 0.0
        before = clones(params)
        run(opt, params, range(2, 3))
        assert any(not torch.equal(p, b) for p, b in zip(params, before)) == moves


@pytest.mark.parametrize("how", list(COPIES))
def test_copies_keep_lars_exclusions(how):
    params = make_params()
    names = ["w1", "b1", "w2", "s", "e"]
    opt = inductor_lamb.Lars(list(zip(names, params)), lr=0.1, weight_decay=1e-2, exclude_from_weight_decay=["^b"],
                             exclude_from_layer_adaptation=lambda n: n == "s")
    run(opt, params, range(2))
    if how == "pickle":  # (a lambda does not pickle: patterns do)
        opt = inductor_lamb.Lars(list(zip(names, params)), lr=0.1, weight_decay=1e-2, exclude_from_weight_decay=["^b"],
                                 exclude_from_layer_adaptation=["^s$"])
        run(opt, params, range(2))
    params_copy, opt_copy = COPIES[how]((params, opt))
    run(opt, params, range(2, 4))
    run(opt_copy, params_copy, range(2, 4))
    assert_same_tensors(params_copy, params, "param")
    hypers = opt_copy._hypers(opt_copy.param_groups[0], Bucket(params_copy[0].device, {"params": params_copy}, names))
    assert hypers["weight_decay"] == [1e-2, 0.0, 1e-2, 1e-2, 1e-2] and hypers["layer_adaptation"][3] is False
