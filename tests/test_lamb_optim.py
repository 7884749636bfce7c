"""inductor_lamb.Lamb as a torch.optim.Optimizer: groups, schedulers, checkpoints, AMP, compile."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import batches, checkpoint, make_model, train
from torch import nn

import inductor_lamb
from inductor_lamb import Lamb, reference


def zero_state(p):
    """exp_avg, exp_avg_sq, step in float64."""
    return [torch.zeros(p.shape, dtype=torch.float64), torch.zeros(p.shape, dtype=torch.float64),
            torch.tensor(0.0, dtype=torch.float64)]


class RefLamb:
    """The float64 reference driven like an optimizer, for trajectory comparisons."""

    def __init__(self, groups):
        self.groups = groups  # list of (params, hyper-params dict incl. lr)
        self.state = {}

    def step(self):
        for params, hp in self.groups:
            ps = [p for p in params if p.grad is not None]
            st = [self.state.setdefault(p, zero_state(p)) for p in ps]
            p64 = [p.detach().double() for p in ps]
            hp = dict(hp)
            lr, (b1, b2) = hp.pop("lr"), hp.pop("betas")
            reference.lamb_step(p64, [p.grad.double() for p in ps], [s[0] for s in st], [s[1] for s in st],
                                [s[2] for s in st], lr=lr, beta1=b1, beta2=b2, **hp)
            with torch.no_grad():
                for p, q in zip(ps, p64):
                    p.copy_(q)


def test_param_groups_and_scheduler_match_reference():
    model = make_model()
    ref_model = copy.deepcopy(model).double()
    hp0 = dict(lr=0.02, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    hp1 = dict(lr=0.01, betas=(0.8, 0.99), eps=1e-5, weight_decay=0.0, always_adapt=True, trust_clip=True)
    groups = [list(model[0].parameters()) + list(model[1].parameters()), list(model[3].parameters())]
    opt = Lamb([{"params": groups[0], **hp0}, {"params": groups[1], **hp1}])
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    ref_groups = [list(ref_model[0].parameters()) + list(ref_model[1].parameters()), list(ref_model[3].parameters())]
    ref = RefLamb([(ref_groups[0], dict(hp0)), (ref_groups[1], dict(hp1))])
    for k, (x, y) in enumerate(batches(6)):
        for m, o in ((model, opt), (ref_model, None)):
            m.zero_grad()
            nn.functional.cross_entropy(m(x.to(next(m.parameters()).dtype)), y).backward()
        opt.step()
        ref.step()
        sched.step()
        for (_, hp), g in zip(ref.groups, opt.param_groups):
            hp["lr"] = hp["lr"] * 0.7
            assert g["lr"] == pytest.approx(hp["lr"], rel=1e-12) and type(g["lr"]) is float  # (the scheduler's)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.double(), q, rtol=1e-5, atol=1e-6)


def test_state_layout():
    model = make_model()
    opt = Lamb(model.parameters(), lr=0.01)
    train(model, opt, batches(2))
    for p in model.parameters():
        st = opt.state[p]
        assert set(st) == {"step", "exp_avg", "exp_avg_sq"}
        assert st["step"].dim() == 0 and float(st["step"]) == 2.0
        assert st["exp_avg"].dtype == torch.float32 and st["exp_avg"].shape == p.shape


def test_params_without_grad_are_skipped():
    model = make_model()
    for p in model[3].parameters():
        p.requires_grad_(False)
    before = [p.clone() for p in model[3].parameters()]
    opt = Lamb(model.parameters(), lr=0.01)
    train(model, opt, batches(2))
    assert all(torch.equal(a, b) for a, b in zip(before, model[3].parameters()))
    assert all(p not in opt.state for p in model[3].parameters())


def test_closure_and_zero_grad():
    model = make_model()
    opt = Lamb(model.parameters(), lr=0.01)
    x, y = batches(1)[0]

    def closure():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    before = [p.clone() for p in model.parameters()]
    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.item() > 0
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("dtype,master", [(torch.float32, False), (torch.bfloat16, True), (torch.bfloat16, False)])
def test_checkpoint_resume_equals_uninterrupted(dtype, master):
    data = batches(8, dtype=dtype)
    model = make_model(dtype=dtype)
    opt = Lamb(model.parameters(), lr=0.02, master_weights=master)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    train(model, opt, data, sched)
    expected = [p.detach().clone() for p in model.parameters()]

    model2 = make_model(dtype=dtype)
    opt2 = Lamb(model2.parameters(), lr=0.02, master_weights=master)
    sched2 = torch.optim.lr_scheduler.ExponentialLR(opt2, gamma=0.9)
    train(model2, opt2, data[:3], sched2)
    ckpt = checkpoint({"model": model2.state_dict(), "opt": opt2.state_dict(), "sched": sched2.state_dict()})

    model3 = make_model(seed=1, dtype=dtype)
    opt3 = Lamb(model3.parameters(), lr=0.5, master_weights=master)
    sched3 = torch.optim.lr_scheduler.ExponentialLR(opt3, gamma=0.9)
    model3.load_state_dict(ckpt["model"])
    opt3.load_state_dict(ckpt["opt"])
    sched3.load_state_dict(ckpt["sched"])
    for st in opt3.state.values():  # state stays float32 whatever the param dtype
        assert all(v.dtype == torch.float32 for v in st.values())
    assert [g["lr"] for g in opt3.param_groups] == [g["lr"] for g in opt2.param_groups]  # (as saved)
    train(model3, opt3, data[3:], sched3)
    for a, b in zip(model3.parameters(), expected):
        assert torch.equal(a, b)


def test_grad_scaler_matches_unscaled_and_skips_overflow():
    data = batches(4)
    model = make_model()
    model_s = copy.deepcopy(model)
    opt = Lamb(model.parameters(), lr=0.01)
    opt_s = Lamb(model_s.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1000)
    train(model, opt, data)
    train(model_s, opt_s, data, scaler=scaler)
    for a, b in zip(model.parameters(), model_s.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

    # an inf grad: GradScaler sets found_inf, the step is skipped and the scale backs off
    before = [p.clone() for p in model_s.parameters()]
    steps = [float(opt_s.state[p]["step"]) for p in model_s.parameters()]
    opt_s.zero_grad()
    x, y = data[0]
    scaler.scale(nn.functional.cross_entropy(model_s(x), y) * float("inf")).backward()
    scaler.step(opt_s)
    scaler.update()
    assert scaler.get_scale() < 256.0
    assert all(torch.equal(a, b) for a, b in zip(before, model_s.parameters()))
    assert steps == [float(opt_s.state[p]["step"]) for p in model_s.parameters()]


def test_global_grad_clipping_across_buckets():
    """max_grad_norm clips by the norm over the whole group, also with several (dtype) buckets."""
    torch.manual_seed(0)
    p32 = nn.Parameter(torch.randn(20, 10))
    p16 = nn.Parameter(torch.randn(30).bfloat16())
    g32, g16 = torch.randn(20, 10) * 3, (torch.randn(30) * 3).bfloat16()
    p32.grad, p16.grad = g32.clone(), g16.clone()
    opt = Lamb([p32, p16], lr=0.01, max_grad_norm=1.0, master_weights=True)
    ref_p = [p32.detach().double(), p16.detach().double()]
    opt.step()
    ref_state = [list(s) for s in zip(*(zero_state(r) for r in ref_p))]
    reference.lamb_step(ref_p, [g32.double(), g16.double()], *ref_state, lr=0.01, max_grad_norm=1.0)
    torch.testing.assert_close(p32.detach().double(), ref_p[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(opt.state[p16]["master_param"].double(), ref_p[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(opt.state[p32]["exp_avg"].double(), ref_state[0][0], rtol=1e-5, atol=1e-7)


def test_constructor_validation():
    p = [nn.Parameter(torch.randn(3))]
    with pytest.raises(ValueError, match="learning rate"):
        Lamb(p, lr=-1.0)
    with pytest.raises(ValueError, match="beta parameter at index 1"):
        Lamb(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="epsilon"):
        Lamb(p, eps=-1.0)
    with pytest.raises(ValueError, match="weight_decay"):
        Lamb(p, weight_decay=-0.1)
    with pytest.raises(TypeError, match="float32, float64, bfloat16 and float16"):
        Lamb([nn.Parameter(torch.randn(3, dtype=torch.complex64))])


def test_sparse_grad_rejected():
    emb = nn.Embedding(10, 4, sparse=True)
    opt = Lamb(emb.parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()


# The torch.compile recipes are tested for every optimizer in test_compile.py.


def test_capability_api():
    assert inductor_lamb.cpu_capability() in ("default", "avx2", "avx512")
