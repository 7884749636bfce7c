"""fuse_optimizer(): flat-buffer steps equal the unfused trajectories."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import inductor_lamb
from inductor_lamb import Lamb, Lamb16, Lars, fuse_optimizer


class BertAdam(torch.optim.Optimizer):
    """A per-parameter Python optimizer in the style of BERT's BertAdam (no bias correction)."""

    def __init__(self, params, lr=1e-3, b1=0.9, b2=0.999, e=1e-6, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, b1=b1, b2=b2, e=e, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["next_m"] = torch.zeros_like(p)
                    state["next_v"] = torch.zeros_like(p)
                m, v = state["next_m"], state["next_v"]
                m.mul_(group["b1"]).add_(p.grad, alpha=1 - group["b1"])
                v.mul_(group["b2"]).addcmul_(p.grad, p.grad, value=1 - group["b2"])
                update = m / (v.sqrt() + group["e"]) + group["weight_decay"] * p
                p.add_(update, alpha=-group["lr"])
                state["step"] += 1


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 32), nn.LayerNorm(32), nn.Tanh(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 3))


def data(n=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 12, generator=g), torch.randn(8, 3, generator=g)) for _ in range(n)]


def train(model, opt, batches, fused, sched=None, set_to_none=True):
    for x, y in batches:
        opt.zero_grad(set_to_none=set_to_none)
        nn.functional.mse_loss(model(x), y).backward()
        opt.fuse_step() if fused else opt.step()
        if sched:
            sched.step()


OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.05),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.05, lr_decay=0.01),
    "rmsprop": lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.5),
    "bertadam": lambda ps: BertAdam(ps, lr=1e-2),
    "lamb": lambda ps: Lamb(ps, lr=1e-2),
    "lamb16": lambda ps: Lamb16(ps, lr=1e-2, weight_decay=0.01),
    "lars": lambda ps: Lars(ps, lr=0.5, weight_decay=1e-3),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("do_flatten", [True, False])
@pytest.mark.parametrize("set_to_none,piece_numel", [(True, 1 << 16), (False, 1 << 16), (True, 100)])
def test_trajectory_equals_unfused(name, do_flatten, set_to_none, piece_numel):
    """piece_numel=100 cuts the flat buffer into pieces whose edges fall inside params."""
    batches = data()
    ref_model, model = make_model(), make_model()
    ref = OPTIMIZERS[name](ref_model.parameters())
    opt = fuse_optimizer(OPTIMIZERS[name](model.parameters()), do_flatten=do_flatten, piece_numel=piece_numel)
    x = batches[0][0]
    torch.testing.assert_close(model(x), ref_model(x), rtol=0, atol=0)  # flattening keeps the model intact
    train(ref_model, ref, batches, fused=False, set_to_none=set_to_none)
    train(model, opt, batches, fused=True, set_to_none=set_to_none)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_flatten_makes_params_views_of_one_buffer():
    model = make_model()
    opt = fuse_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
    ptrs = sorted(p.data_ptr() for p in model.parameters())
    sizes = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    assert all(a + sizes[a] == b for a, b in zip(ptrs, ptrs[1:]))  # back to back in one buffer
    nn.functional.mse_loss(model(data(1)[0][0]), data(1)[0][1]).backward()
    opt.fuse_step()
    assert len(opt._inductor_lamb_fused.runs) == 1
    assert len(opt._inductor_lamb_fused.shadow.state) == 1  # one flat state for the whole model


def test_no_flatten_groups_memory_neighbours_only():
    storage = torch.randn(60 + 20 + 7)
    a = nn.Parameter(storage[:60].view(6, 10))
    b = nn.Parameter(storage[60:80].view(20))
    c = nn.Parameter(torch.randn(7))  # elsewhere
    opt = fuse_optimizer(torch.optim.SGD([a, b, c], lr=0.1, momentum=0.9), do_flatten=False)
    runs = [run for _, run in opt._inductor_lamb_fused.runs]
    assert [len(run.params) for run in runs] == [2, 1]
    assert a.data_ptr() == storage.data_ptr()  # not moved


@pytest.mark.parametrize("name", ["adam", "bertadam", "lamb", "adagrad"])
def test_checkpoint_moves_between_fused_and_unfused(name):
    batches = data(12)
    ref_model = make_model()
    ref = OPTIMIZERS[name](ref_model.parameters())
    train(ref_model, ref, batches, fused=False)

    def roundtrip(sd):
        buf = io.BytesIO()
        torch.save(sd, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=False)

    m1 = make_model()
    o1 = fuse_optimizer(OPTIMIZERS[name](m1.parameters()), piece_numel=100)
    train(m1, o1, batches[:4], fused=True)
    ck = roundtrip({"m": m1.state_dict(), "o": o1.state_dict()})
    # the fused state_dict has the unfused format
    unfused_keys = {k for s in OPTIMIZERS[name](make_model().parameters()).state.values() for k in s}
    assert len(ck["o"]["state"]) == len(list(m1.parameters()))
    assert unfused_keys <= set(next(iter(ck["o"]["state"].values())))

    m2 = make_model(seed=3)
    o2 = OPTIMIZERS[name](m2.parameters())
    m2.load_state_dict(ck["m"])
    o2.load_state_dict(ck["o"])
    train(m2, o2, batches[4:8], fused=False)
    ck2 = roundtrip({"m": m2.state_dict(), "o": o2.state_dict()})

    m3 = make_model(seed=4)
    o3 = fuse_optimizer(OPTIMIZERS[name](m3.parameters()))
    m3.load_state_dict(ck2["m"])
    o3.load_state_dict(ck2["o"])
    train(m3, o3, batches[8:], fused=True)
    for p, q in zip(m3.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_lr_scheduler_and_add_param_group():
    batches = data()
    ref_model, model = make_model(), make_model()
    extra_ref, extra = nn.Parameter(torch.ones(5)), nn.Parameter(torch.ones(5))
    ref = torch.optim.Adam(ref_model.parameters(), lr=1e-2)
    opt = fuse_optimizer(torch.optim.Adam(model.parameters(), lr=1e-2))
    s_ref = torch.optim.lr_scheduler.StepLR(ref, 1, 0.8)
    s = torch.optim.lr_scheduler.StepLR(opt, 1, 0.8)
    train(ref_model, ref, batches[:3], fused=False, sched=s_ref)
    train(model, opt, batches[:3], fused=True, sched=s)
    ref.add_param_group({"params": [extra_ref], "lr": 0.1})
    opt.add_param_group({"params": [extra], "lr": 0.1})
    for x, y in batches[3:]:
        for m, e, o, fused in ((ref_model, extra_ref, ref, False), (model, extra, opt, True)):
            o.zero_grad()
            (nn.functional.mse_loss(m(x), y) + (e * e).sum()).backward()
            o.fuse_step() if fused else o.step()
    for p, q in zip(list(model.parameters()) + [extra], list(ref_model.parameters()) + [extra_ref]):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_layerwise_norms_stay_per_tensor():
    """The Bagua #335 bug: a layer-wise optimizer on the concatenation would differ."""
    batches = data(3)
    ref_model, model = make_model(), make_model()
    ref = Lamb(ref_model.parameters(), lr=0.05)
    opt = fuse_optimizer(Lamb(model.parameters(), lr=0.05))
    train(ref_model, ref, batches, fused=False)
    train(model, opt, batches, fused=True)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert inductor_lamb.fuse.is_layerwise(opt)
    marked = inductor_lamb.mark_layerwise(BertAdam(make_model().parameters()))
    assert inductor_lamb.fuse.is_layerwise(marked)


def test_errors():
    model = make_model()
    nonleaf = model[0].weight * 2
    opt = torch.optim.SGD([nn.Parameter(torch.randn(3))], lr=0.1)
    opt.param_groups[0]["params"].append(nonleaf)  # torch.optim's constructor would refuse it already
    with pytest.raises(RuntimeError, match="not a leaf"):
        fuse_optimizer(opt)
    base = torch.randn(10)
    with pytest.raises(RuntimeError, match="share storage"):
        fuse_optimizer(torch.optim.SGD([nn.Parameter(base[:6]), nn.Parameter(base[4:])], lr=0.1))
    emb = nn.Embedding(10, 3, sparse=True)
    opt = fuse_optimizer(torch.optim.SGD(emb.parameters(), lr=0.1))
    opt.zero_grad(set_to_none=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.fuse_step()
