"""lars_step_ / adagrad_step_ (CPU kernels) and the Lars / Adagrad optimizers."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from conftest import MIXED_SHAPES, clone_lists, noncontiguous_like, randn, raw_op_kwargs
from torch import nn

import inductor_lamb
from inductor_lamb import Adagrad, Lars, reference

LRS = [0.02, 0.011, 0.005, 0.013, 0.001]


def make(shapes, dtype=torch.float32, seed=0, kind="lars"):
    """LARS: params, grads, momentum_buffers; Adagrad: params, grads, sums, steps."""
    gen = torch.Generator().manual_seed(seed)
    p = [randn(s, dtype, gen) for s in shapes]
    g = [randn(s, dtype, gen) for s in shapes]
    if kind == "lars":
        return [p, g, [randn(s, torch.float32, gen, 0.01) for s in shapes]]
    sums = [(torch.rand(s, generator=gen, dtype=torch.float64) + 0.1).float() for s in shapes]
    return [p, g, sums, [torch.tensor(2.0) for _ in shapes]]


def op(kind, lists, lr, master=None, **kw):
    fn = inductor_lamb.ops.lars_step_ if kind == "lars" else inductor_lamb.ops.adagrad_step_
    fn(*lists, lr=torch.tensor(lr), master_params=master, **kw)


def ref(kind, lists, lr, **kw):
    (reference.lars_step if kind == "lars" else reference.adagrad_step)(*lists, lr=lr, **kw)


def assert_close_lists(a_lists, b_lists, rtol=1e-5, atol=2e-6):
    for la, lb in zip(a_lists, b_lists):
        for i, (a, b) in enumerate(zip(la, lb)):
            torch.testing.assert_close(a.double(), b.double(), rtol=rtol, atol=atol, msg=lambda m: f"[{i}] {m}")


CONFIGS = {
    "lars": {
        "default": dict(weight_decay=5e-4),
        "per_param_decay": dict(weight_decay=[5e-4, 0.0, 1e-3, 0.0, 2e-4, 5e-4, 1e-4, 0.0, 3e-4]),
        "no_adaptation_mix": dict(weight_decay=1e-3, layer_adaptation=[True, False] * 4 + [True]),
        "coeff_eps_rescale": dict(weight_decay=1e-2, lars_coeff=0.02, eps=1e-3, rescale_grad=0.5, momentum=0.8),
    },
    "adagrad": {
        "default": dict(),
        "decay": dict(lr_decay=0.1, weight_decay=0.05, eps=1e-6),
        "maximize": dict(maximize=True, weight_decay=0.01),
    },
}
CASES = [(k, c) for k in CONFIGS for c in CONFIGS[k]]


@pytest.mark.parametrize("kind,config", CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_matches_reference_over_steps(kind, config):
    kw = CONFIGS[kind][config]
    lists = make(MIXED_SHAPES, seed=1, kind=kind)
    r = clone_lists(lists, torch.float64)
    for lr in LRS:
        op(kind, lists, lr, **kw)
        ref(kind, r, lr, **kw)
    assert_close_lists(lists, r)


def test_lars_local_lr_is_used_and_zero_norm_falls_back():
    lists = make([(40, 30), (20,)], seed=2)
    lists[0][1].zero_()  # ||p|| = 0: local lr = lr
    r = clone_lists(lists, torch.float64)
    op("lars", lists, 0.1, weight_decay=1e-3)
    ref("lars", r, 0.1, weight_decay=1e-3)
    assert_close_lists(lists, r)
    # the trust ratio is far from 1 here: the adapted update is much smaller than lr * g
    plain = make([(40, 30)], seed=2)
    op("lars", plain, 0.1, weight_decay=1e-3, layer_adaptation=False)
    assert (plain[0][0] - make([(40, 30)], seed=2)[0][0]).abs().max() > 10 * (
        lists[0][0] - make([(40, 30)], seed=2)[0][0]).abs().max()


@pytest.mark.parametrize("kind", ["lars", "adagrad"])
@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_noncontiguous(kind, layout):
    lists = make([(33, 17), (64, 48), (5, 7, 3), (), (0, 4)], seed=3, kind=kind)
    r = clone_lists(lists, torch.float64)
    other = "strided" if layout == "transposed" else "transposed"
    nc = [[noncontiguous_like(t, layout if k != 1 else other) for t in lst] for k, lst in enumerate(lists[:3])]
    nc += lists[3:]
    kw = dict(weight_decay=1e-3) if kind == "lars" else dict(weight_decay=0.01)
    for lr in LRS[:3]:
        op(kind, nc, lr, **kw)
        ref(kind, r, lr, **kw)
    assert_close_lists(nc, r)


@pytest.mark.parametrize("kind", ["lars", "adagrad"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision(kind, dtype):
    kw = dict(weight_decay=1e-3)
    # without master: each step is the float64 step rounded to dtype
    lists = make(MIXED_SHAPES, dtype=dtype, seed=4, kind=kind)
    for lr in LRS[:3]:
        r = clone_lists(lists, torch.float64)
        op(kind, lists, lr, **kw)
        ref(kind, r, lr, **kw)
        for a, b in zip(lists[0], r[0]):
            torch.testing.assert_close(a.double(), b, rtol=2 * torch.finfo(dtype).eps, atol=1e-5)
    # with master: the float32 master follows the float64 trajectory
    lists = make(MIXED_SHAPES, dtype=dtype, seed=5, kind=kind)
    master = [p.float() for p in lists[0]]
    r = clone_lists([master, *lists[1:]], torch.float64)
    for lr in LRS:
        op(kind, lists, lr, master=master, **kw)
        ref(kind, r, lr, **kw)
    assert_close_lists([master, *lists[2:]], [r[0], *r[2:]])
    assert all(torch.equal(p, m.to(dtype)) for p, m in zip(lists[0], master))


@pytest.mark.parametrize("cap", ["default", "avx2", "avx512"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_adagrad_element_steps_alike_wherever_it_sits(cap, dtype):
    """Adagrad is element-wise: an element's new p and sum must not depend on where it sits in a
    loop step (either float vector, or the tail: each an inlined copy of the loop body, where a
    compiler could contract g * grad_mul + wd * p into an FMA differently). The same 100
    elements, stepped alone and shifted by 28 behind others, give the same bits."""
    if ("default", "avx2", "avx512").index(cap) > torch.ops.lamb._max_cpu_capability():
        pytest.skip(f"this CPU has no {cap}")
    inductor_lamb.set_cpu_capability(cap)
    x = make([(100,)], dtype=dtype, seed=3, kind="adagrad")
    pad = make([(28,)], dtype=dtype, seed=4, kind="adagrad")
    y = [[torch.cat([a[0], b[0]])] if k < 3 else clone_lists([b])[0] for k, (a, b) in enumerate(zip(pad, x))]
    for lists in (x, y):
        op("adagrad", lists, 0.1, weight_decay=1e-2, grad_scale=torch.tensor(4.0), lr_decay=0.01)
    for k in range(3):
        assert torch.equal(y[k][0][28:], x[k][0]), f"list {k}"


@pytest.mark.parametrize("kind", ["lars", "adagrad"])
def test_threads_and_generic_isa_agree(kind):
    results = {}
    for threads, cap in ((1, None), (2, None), (2, "default")):
        torch.set_num_threads(threads)
        if cap:
            inductor_lamb.set_cpu_capability(cap)
        lists = make(MIXED_SHAPES + [(100001,)], seed=6, kind=kind)
        for lr in LRS[:2]:
            op(kind, lists, lr, weight_decay=1e-3)
        results[(threads, cap)] = lists
    for a, b in zip(results[(1, None)], results[(2, None)]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))  # bit-identical across thread counts
    assert_close_lists(results[(2, "default")], results[(2, None)], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["lars", "adagrad"])
def test_grad_scale_found_inf(kind):
    lists = make(MIXED_SHAPES, seed=7, kind=kind)
    scaled = clone_lists(lists)
    for g in scaled[1]:
        g.mul_(64.0)
    r = clone_lists(lists, torch.float64)
    op(kind, scaled, 0.01, grad_scale=torch.tensor(64.0), weight_decay=1e-3)
    ref(kind, r, 0.01, weight_decay=1e-3)
    assert_close_lists([scaled[0], *scaled[2:]], [r[0], *r[2:]])
    before = clone_lists(scaled)
    op(kind, scaled, 0.01, grad_scale=torch.tensor(64.0), found_inf=torch.tensor(1.0))
    assert all(torch.equal(a, b) for la, lb in zip(scaled, before) for a, b in zip(la, lb))


@pytest.mark.parametrize("kind", ["lars", "adagrad"])
def test_opcheck(kind):
    for dtype, master in ((torch.float32, False), (torch.bfloat16, True)):
        lists = make([(8, 5), (), (0,), (33,)], dtype=dtype, seed=8, kind=kind)
        mp = [t.float() for t in lists[0]] if master else None
        if kind == "lars":
            args = (*lists, torch.tensor(0.1))
            kw = dict(weight_decay=[1e-3, 0.0, 1e-3, 2e-3], layer_adaptation=[True, True, False, True],
                      grad_scale=torch.tensor(2.0), found_inf=torch.tensor(0.0), master_params=mp)
            target = torch.ops.lamb.lars_step_.default
        else:
            args = (*lists, torch.tensor(0.1))
            kw = dict(lr_decay=0.01, weight_decay=0.01, grad_scale=torch.tensor(2.0), master_params=mp)
            target = torch.ops.lamb.adagrad_step_.default
        with torch.no_grad():
            torch.library.opcheck(target, args, raw_op_kwargs(target._name.split("::")[1], kw))


@pytest.mark.parametrize(
    "kind,mutate,match",
    [
        ("lars", lambda L: L[1].pop(), r"lars_step_: grads has 2 tensors but params has 3"),
        ("lars", lambda L: L[2].__setitem__(1, torch.zeros(4)), r"momentum_buffers\[1\] has shape \[4\]"),
        ("lars", lambda L: L[1].__setitem__(2, torch.randn(3).to_sparse()), r"grads\[2\] has layout"),
        ("adagrad", lambda L: L[2].__setitem__(0, torch.zeros(4, 3, dtype=torch.float64)), r"state_sums\[0\] has dtype"),
        ("adagrad", lambda L: L[3].__setitem__(2, torch.zeros(2)), r"steps\[2\] must be a 0-d tensor"),
        ("adagrad", lambda L: L[1].__setitem__(1, torch.randn(5, dtype=torch.float16)), r"grads\[1\] has dtype Half"),
    ],
)
def test_bad_input(kind, mutate, match):
    lists = make([(4, 3), (5,), (3,)], seed=9, kind=kind)
    mutate(lists)
    before = [t.clone() for lst in lists for t in lst]
    with pytest.raises(RuntimeError, match=match):
        op(kind, lists, 0.01)
    for t, b in zip([t for lst in lists for t in lst], before):
        assert torch.equal(t.to_dense() if t.is_sparse else t, b.to_dense() if b.is_sparse else b)


def test_lars_per_param_lists_length_error():
    lists = make([(4, 3), (5,)], seed=10)
    with pytest.raises(RuntimeError, match=r"weight_decay has 3 values; expected 1 or one per param \(2\)"):
        op("lars", lists, 0.01, weight_decay=[0.1, 0.2, 0.3])


def test_lars_no_tensor_count_limit():
    lists = make([(3,)] * 2500 + [(20, 20)], seed=11)
    r = clone_lists(lists, torch.float64)
    op("lars", lists, 0.05, weight_decay=1e-3)
    ref("lars", r, 0.05, weight_decay=1e-3)
    assert_close_lists(lists, r)


# ---- optimizers ------------------------------------------------------------------------


def model_and_data(seed=0):
    torch.manual_seed(seed)
    # (no bias right before the BatchNorm: its gradient would be pure rounding noise)
    model = nn.Sequential(nn.Linear(10, 24), nn.ReLU(), nn.BatchNorm1d(24), nn.Linear(24, 4))
    gen = torch.Generator().manual_seed(seed + 1)
    data = [(torch.randn(32, 10, generator=gen), torch.randint(0, 4, (32,), generator=gen)) for _ in range(6)]
    return model, data


def run(model, opt, data, sched=None):
    for x, y in data:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if sched:
            sched.step()


def test_lars_exclusions_apply():
    model, data = model_and_data()
    opt = Lars(model.named_parameters(), lr=0.5, weight_decay=1e-2,
               exclude_from_weight_decay=["bias", r"^2\."], exclude_from_layer_adaptation=lambda n: n == "3.weight")
    x, y = data[0]
    nn.functional.cross_entropy(model(x), y).backward()
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach().double().clone() for p in model.parameters()]
    grads = [p.grad.double().clone() for p in model.parameters()]
    opt.step()
    expected_wd = {"0.weight": 1e-2, "0.bias": 0.0, "2.weight": 0.0, "2.bias": 0.0, "3.weight": 1e-2, "3.bias": 0.0}
    expected_adapt = {n: n != "3.weight" for n in names}
    bufs = [torch.zeros_like(p) for p in params]
    reference.lars_step(params, grads, bufs, lr=0.5, weight_decay=[expected_wd[n] for n in names],
                        layer_adaptation=[expected_adapt[n] for n in names])
    for n, p, q in zip(names, model.parameters(), params):
        torch.testing.assert_close(p.double(), q, rtol=1e-5, atol=1e-6, msg=lambda m: f"{n}: {m}")
    # and they matter: without exclusions the result differs for the excluded tensors
    model2, _ = model_and_data()
    opt2 = Lars(model2.parameters(), lr=0.5, weight_decay=1e-2)
    nn.functional.cross_entropy(model2(x), y).backward()
    opt2.step()
    # (2.bias starts at zero: ||p|| = 0 means local lr = lr and no decay either way)
    for n, p, q in zip(names, model.parameters(), model2.parameters()):
        assert torch.equal(p, q) == (n in ("0.weight", "2.bias")), n


def test_lars_exclusions_need_names():
    model, _ = model_and_data()
    with pytest.raises(ValueError, match="named_parameters"):
        Lars(model.parameters(), lr=0.1, exclude_from_weight_decay=["bias"])


@pytest.mark.parametrize("layout", ["contiguous", "noncontiguous"])
def test_adagrad_matches_torch_adagrad(layout):
    """Pinned against torch.optim.Adagrad(foreach=False), including non-contiguous grads
    (where torch 2.13's Adagrad(fused=True) on CPU is wrong)."""
    torch.manual_seed(0)
    shapes = [(64, 48), (31,), (5, 6, 7)]
    ps = [nn.Parameter(torch.randn(s)) for s in shapes]
    qs = [nn.Parameter(p.detach().clone()) for p in ps]
    ours = Adagrad(ps, lr=0.05, lr_decay=0.01, weight_decay=0.02, initial_accumulator_value=0.1)
    theirs = torch.optim.Adagrad(qs, lr=0.05, lr_decay=0.01, weight_decay=0.02, initial_accumulator_value=0.1,
                                 foreach=False)
    for _ in range(4):
        for p, q in zip(ps, qs):
            g = torch.randn(p.shape)
            p.grad = noncontiguous_like(g, "strided") if layout == "noncontiguous" else g.clone()
            q.grad = g.clone()
        ours.step()
        theirs.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours.state[p]["sum"], theirs.state[q]["sum"])


def _roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_adagrad_state_dict_interchange_with_torch():
    torch.manual_seed(0)
    model, data = model_and_data()
    ref_model = copy.deepcopy(model)
    ref_opt = torch.optim.Adagrad(ref_model.parameters(), lr=0.05, lr_decay=0.01, foreach=False)
    run(ref_model, ref_opt, data[:3])
    # torch -> ours, continue
    ours_model = copy.deepcopy(ref_model)
    ours = Adagrad(ours_model.parameters(), lr=0.05, lr_decay=0.01)
    ours.load_state_dict(_roundtrip(ref_opt.state_dict()))
    run(ref_model, ref_opt, data[3:])
    run(ours_model, ours, data[3:])
    for p, q in zip(ours_model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    # ours -> torch
    back = torch.optim.Adagrad(copy.deepcopy(ours_model).parameters(), lr=0.05, lr_decay=0.01, foreach=False)
    back.load_state_dict(_roundtrip(ours.state_dict()))
    for s_ours, s_back in zip(ours.state.values(), back.state.values()):
        assert torch.equal(s_ours["sum"], s_back["sum"]) and float(s_ours["step"]) == float(s_back["step"])


@pytest.mark.parametrize("cls,kw", [(Lars, dict(lr=0.3, weight_decay=1e-3)), (Adagrad, dict(lr=0.05))])
def test_checkpoint_resume(cls, kw):
    model, data = model_and_data()
    opt = cls(model.parameters(), **kw)
    run(model, opt, data)
    expected = [p.detach().clone() for p in model.parameters()]
    m2, _ = model_and_data()
    o2 = cls(m2.parameters(), **kw)
    run(m2, o2, data[:2])
    ck = _roundtrip({"m": m2.state_dict(), "o": o2.state_dict()})
    m3, _ = model_and_data(seed=5)
    o3 = cls(m3.parameters(), **kw)
    m3.load_state_dict(ck["m"])
    o3.load_state_dict(ck["o"])
    run(m3, o3, data[2:])
    assert all(torch.equal(a, b) for a, b in zip(m3.parameters(), expected))


