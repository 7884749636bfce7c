"""The planned eager step (inductor_lamb/optim/_plan.py): an optimizer reusing its op calls from
step to step equals, bit for bit, one that builds them from scratch every step, whatever changes
between steps; and the plan is reused wherever nothing it depends on changed (grads set to None
and reassigned every step included)."""

from __future__ import annotations

import copy

import pytest
import torch

from inductor_lamb import Adagrad, Lamb, Lamb16, Lars
from inductor_lamb.optim import _plan

OPTIMIZERS = {
    "Lamb": (Lamb, dict(lr=0.02, weight_decay=0.01)),
    "Lamb clip": (Lamb, dict(lr=0.02, weight_decay=0.01, max_grad_norm=0.5)),
    "Lamb16": (Lamb16, dict(lr=0.02, weight_decay=0.01)),
    "Lars": (Lars, dict(lr=0.05, weight_decay=1e-3)),
    "Adagrad": (Adagrad, dict(lr=0.05, lr_decay=0.01, weight_decay=0.1)),
}
SHAPES = [(33, 17), (), (7,), (64, 48), (0,), (5, 3)]


@pytest.fixture
def builds(monkeypatch):
    """How many plans were built."""
    count = [0]
    init = _plan.GroupPlan.__init__

    def counting(self, *args, **kwargs):
        count[0] += 1
        init(self, *args, **kwargs)

    monkeypatch.setattr(_plan.GroupPlan, "__init__", counting)
    return count


def make(name, seed=0, **extra):
    cls, kw = OPTIMIZERS[name]
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]
    groups = [{"params": params[:4]}, {"params": params[4:], "weight_decay": 0.0}]
    return params, cls(groups, **{**kw, **extra})


class Twins:
    """The optimizer under test (planned) and its twin, whose plans are dropped before every
    step (built from scratch), stepped on the same params' copies and grads."""

    def __init__(self, name, **extra):
        self.params, self.opt = make(name, **extra)
        self.twin_params, self.twin = make(name, **extra)
        self.g = torch.Generator().manual_seed(1)

    def grads(self, skip=()):
        for i, (p, q) in enumerate(zip(self.params, self.twin_params)):
            if i in skip:
                p.grad = q.grad = None
            else:
                grad = torch.randn(p.shape, generator=self.g).to(p.dtype)
                p.grad, q.grad = grad.clone(), grad.clone()

    def step(self, skip=()):
        self.grads(skip)
        self.opt.step()
        self.twin._plans.clear()
        self.twin.step()
        self.check()
        self.opt.zero_grad(set_to_none=True)
        self.twin.zero_grad(set_to_none=True)

    def check(self):
        for p, q in zip(self.params, self.twin_params):
            assert p.dtype == q.dtype and torch.equal(p, q)
        for p, q in zip(self.params, self.twin_params):
            a, b = self.opt.state.get(p, {}), self.twin.state.get(q, {})
            assert a.keys() == b.keys()
            for k in a:
                assert torch.equal(a[k].float(), b[k].float()), k


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_grads_reassigned_every_step_reuse_the_plan(name, builds):
    t = Twins(name)
    for _ in range(4):
        t.step()
    assert builds[0] == 2 + 2 * 4  # (one per group for the optimizer, then the twin's each step)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_every_change_between_steps_gives_the_step_from_scratch(name, builds):
    t = Twins(name)
    t.step()
    built = builds[0]

    def changed(fn, *, rebuilds=True, skip=()):
        nonlocal built
        fn(t.opt, t.params)
        fn(t.twin, t.twin_params)
        t.step(skip)
        mine = builds[0] - built - len(t.twin.param_groups)  # (the twin builds one a group every step)
        assert (mine > 0) == rebuilds, (fn, mine)
        built = builds[0]

    changed(lambda o, ps: None, rebuilds=False)
    changed(lambda o, ps: None, skip={1})  # a param without a grad this step
    changed(lambda o, ps: None)  # ... and back
    changed(lambda o, ps: o.param_groups[0].__setitem__("weight_decay", 0.05))
    # a float, as schedulers write: filled into the view's own lr tensor (_scheduled.OpGroup), in place
    changed(lambda o, ps: o.param_groups[1].__setitem__("lr", 0.007), rebuilds=False)
    changed(lambda o, ps: o.param_groups[1].__setitem__("lr", torch.tensor(0.004)))  # a tensor of the user's
    changed(lambda o, ps: o.param_groups[1]["lr"].fill_(0.003), rebuilds=False)  # the same tensor, in place
    changed(lambda o, ps: o.param_groups[1].__setitem__("lr", 0.002))  # a float again: the view's own tensor
    changed(lambda o, ps: o.state[ps[0]].__setitem__(next(iter(o.state[ps[0]])), copy.deepcopy(
        o.state[ps[0]][next(iter(o.state[ps[0]]))])))  # a state tensor replaced
    changed(lambda o, ps: o.load_state_dict(o.state_dict()))
    changed(lambda o, ps: setattr(o, "max_tensors_per_call", 2))
    changed(lambda o, ps: o.param_groups[0]["params"].append(o.param_groups[1]["params"].pop(-1)))
    with torch.no_grad():
        changed(lambda o, ps: setattr(ps[3], "data", ps[3].data.bfloat16()))  # a dtype changed in place

    def new_group(o, ps):
        extra = torch.nn.Parameter(torch.ones(9))
        ps.append(extra)
        o.add_param_group({"params": [extra]})

    changed(new_group)
    for _ in range(2):
        changed(lambda o, ps: None, rebuilds=False)


def test_sparse_grad_after_dense_steps_takes_the_sparse_path(builds):
    """Adagrad steps sparse grads (as torch.optim.Adagrad): a grad that turns sparse is seen."""
    t = Twins("Adagrad", weight_decay=0.0)  # (as torch.optim.Adagrad: no weight decay with sparse grads)
    t.step()
    for p, q in zip(t.params, t.twin_params):
        grad = torch.randn(p.shape, generator=t.g)
        p.grad, q.grad = grad.clone(), grad.clone()
    p, q = t.params[3], t.twin_params[3]  # a (64, 48) param: two of its rows
    rows = torch.sparse_coo_tensor(torch.tensor([[1, 5]]), torch.randn(2, 48, generator=t.g), (64, 48))
    p.grad, q.grad = rows.clone(), rows.clone()
    t.opt.step()
    t.twin.step()
    t.check()


def test_a_step_keeps_no_grad_alive():
    """The plan drops this step's grads when the step ends (zero_grad frees them)."""
    import weakref

    params, opt = make("Lamb")
    for _ in range(2):
        for p in params:
            p.grad = torch.randn(p.shape)
        refs = [weakref.ref(p.grad) for p in params]
        opt.step()
        opt.zero_grad(set_to_none=True)
        assert all(r() is None for r in refs)


def test_bad_input_raises_the_unplanned_error_and_writes_nothing():
    params, opt = make("Lamb")
    for p in params:
        p.grad = torch.randn(p.shape)
    opt.step()
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.randn(p.shape)
    state = opt.state[params[5]]
    good = state["exp_avg"]
    state["exp_avg"] = torch.zeros(4)  # wrong shape, in the second group
    with pytest.raises(RuntimeError, match=r"exp_avgs\[1\] has shape \[4\] but params\[1\] has shape \[5, 3\]"):
        opt.step()
    state["exp_avg"] = good
    params[1].grad = params[1].grad.to_sparse()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        opt.step()
    assert all(torch.equal(p, b) for p, b in zip(params[4:], before[4:]))  # (the groups checked with the call)
    assert all(torch.equal(p, b) for p, b in zip(params[:4], before[:4]))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_step_under_fake_tensor_mode_is_not_planned(name, builds):
    """Fake tensors (a trace of the step: `tools/cuda_codegen.py` makes the state this way) carry
    the Python dispatch key, which the prepared calls do not take: the step runs unplanned."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cls, kw = OPTIMIZERS[name]
    with FakeTensorMode():
        params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
        opt = cls(params, **kw)
        for _ in range(2):
            for p in params:
                p.grad = torch.randn_like(p)
            opt.step()
        assert all(type(s) is not torch.Tensor for st in opt.state.values() for s in st.values()
                   if isinstance(s, torch.Tensor))
    assert builds[0] == 0
    params, opt = make(name)  # (and real tensors after it are planned)
    for p in params:
        p.grad = torch.randn(p.shape)
    opt.step()
    assert builds[0] == 2
