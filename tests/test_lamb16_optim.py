"""inductor_lamb.Lamb16 as a torch.optim.Optimizer: reference trajectory, state
layout and bytes, checkpoints, low precision, validation (GradScaler: test_conformance.py,
with every optimizer)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import batches, checkpoint, equal, make_model, train
from torch import nn

from inductor_lamb import Lamb16, reference

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def test_matches_reference_with_scheduler():
    data = batches(6)
    model = make_model()
    ref_model = copy.deepcopy(model).double()
    opt = Lamb16(model.parameters(), lr=0.02, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    ps = list(ref_model.parameters())
    state = [[torch.zeros(p.shape, dtype=E4M3) for p in ps], [torch.zeros(p.shape, dtype=E5M2) for p in ps],
             [torch.tensor(1.0) for _ in ps], [torch.tensor(1.0) for _ in ps], [torch.tensor(0.0) for _ in ps]]
    lr = 0.02
    for x, y in data:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
        ref_model.zero_grad()
        nn.functional.cross_entropy(ref_model(x.double()), y).backward()
        reference.lamb16_step(ps, [p.grad for p in ps], *state, lr=torch.tensor(lr, dtype=torch.float64),
                              weight_decay=0.01)
        lr *= 0.7
    # the trajectories are chaotic only through rare float8 rounding ties
    for a, b in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5)
    for i, a in enumerate(model.parameters()):
        codes, ref_codes = opt.state[a]["exp_avg"].view(torch.uint8), state[0][i].view(torch.uint8)
        assert (codes != ref_codes).double().mean() < 0.01


def test_state_layout_and_bytes_per_param():
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = Lamb16(model.parameters())
    st = opt.state[model[0].weight]
    assert st["exp_avg"].dtype == E4M3 and st["exp_avg_sq"].dtype == E5M2
    assert st["exp_avg"].shape == model[0].weight.shape
    assert st["exp_avg_scale"].shape == () and st["exp_avg_scale"].dtype == torch.float32
    numel = sum(p.numel() for p in model.parameters())
    # 2 bytes per element plus 12 bytes (step and two scales) per tensor
    assert opt.state_bytes_per_param() == pytest.approx(2 + 12 * 4 / numel)
    assert opt.state_bytes_per_param() < 2.001
    from inductor_lamb import Lamb

    assert Lamb(model.parameters()).state_bytes_per_param() == pytest.approx(8 + 4 * 4 / numel)


@pytest.mark.parametrize("dtype,master", [(torch.float32, False), (torch.bfloat16, True)])
def test_checkpoint_resume_equals_uninterrupted(dtype, master):
    data = batches(7, dtype=dtype)
    model = make_model(dtype=dtype)
    opt = Lamb16(model.parameters(), lr=0.02, weight_decay=0.01, master_weights=master)
    train(model, opt, data)
    expected = [p.detach().clone() for p in model.parameters()]

    model2 = make_model(dtype=dtype)
    opt2 = Lamb16(model2.parameters(), lr=0.02, weight_decay=0.01, master_weights=master)
    train(model2, opt2, data[:3])
    ckpt = checkpoint({"model": model2.state_dict(), "opt": opt2.state_dict()})

    model3 = make_model(seed=1, dtype=dtype)
    opt3 = Lamb16(model3.parameters(), lr=0.5, master_weights=master)
    model3.load_state_dict(ckpt["model"])
    opt3.load_state_dict(ckpt["opt"])
    for p, p2 in zip(model3.parameters(), model2.parameters()):  # float8 moments and scales survive
        st, st2 = opt3.state[p], opt2.state[p2]
        assert st["exp_avg"].dtype == E4M3 and st["exp_avg_sq"].dtype == E5M2
        assert st["exp_avg_scale"].dtype == torch.float32 and st["exp_avg_scale"].dim() == 0
        for k in ("exp_avg", "exp_avg_sq", "exp_avg_scale", "exp_avg_sq_scale"):
            assert equal(st[k], st2[k])
    train(model3, opt3, data[3:])
    for a, b in zip(model3.parameters(), expected):
        assert torch.equal(a, b)


def test_constructor_validation():
    p = [nn.Parameter(torch.randn(3))]
    for kw, match in ((dict(betas=(1.0, 0.9)), "beta parameter at index 0"), (dict(eps=-1.0), "epsilon"),
                      (dict(weight_decay=-1.0), "weight_decay"), (dict(trust_scale=-0.1), "trust_scale"),
                      (dict(lr=-1.0), "learning rate")):
        with pytest.raises(ValueError, match=match):
            Lamb16(p, **kw)
