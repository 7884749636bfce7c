"""torch.ops.lamb.lamb_step_ (CPU kernel) against the float64 reference."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    MIXED_SHAPES,
    assert_lists_equal,
    clone_lists,
    make_lists,
    noncontiguous_like,
    raw_op_kwargs,
    snapshot,
)

import inductor_lamb
from inductor_lamb import reference

LRS = [0.02, 0.011, 0.005, 0.013, 0.001]  # changes every step


def run_op(lists, lr, master=None, **kw):
    p, g, m, v, s = lists
    inductor_lamb.ops.lamb_step_(p, g, m, v, s, lr=torch.tensor(lr), master_params=master, **kw)


def run_ref(lists, lr, **kw):
    reference.lamb_step(*lists, lr=lr, **kw)


def assert_matches(op_lists, ref_lists, rtol=1e-5, atol=2e-6):
    for name, lo, lr in zip(("params", "grads", "exp_avgs", "exp_avg_sqs", "steps"), op_lists, ref_lists):
        for i, (a, b) in enumerate(zip(lo, lr)):
            torch.testing.assert_close(a.double(), b, rtol=rtol, atol=atol, msg=lambda m: f"{name}[{i}]: {m}")


CONFIGS = {
    "default": {},
    "no_decay": dict(weight_decay=0.0),  # trust ratio is 1
    "no_decay_always_adapt": dict(weight_decay=0.0, always_adapt=True),
    "trust_clip": dict(trust_clip=True, weight_decay=0.1),
    "no_bias_correction": dict(bias_correction=False),
    "no_grad_averaging": dict(grad_averaging=False),
    "clip_active": dict(max_grad_norm=1.0),  # ||g|| is ~300 here: clipping changes g
    "clip_inactive": dict(max_grad_norm=1e6),
    "betas_eps": dict(beta1=0.8, beta2=0.99, eps=1e-4, weight_decay=0.3),
    "eps_zero": dict(eps=0.0),  # vector tails hit the exact fallback of the fast 1/(sqrt(v)+eps)
}


@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
def test_matches_reference_over_steps(config):
    kw = CONFIGS[config]
    lists = make_lists(MIXED_SHAPES, seed=1)
    ref = clone_lists(lists, torch.float64)
    for lr in LRS:
        run_op(lists, lr, **kw)
        run_ref(ref, lr, **kw)
    assert_matches(lists, ref)
    assert all(float(s) == len(LRS) for s in lists[4])


def test_trust_ratio_is_used():
    """The trust ratio changes the result (guards against a ratio stuck at 1)."""
    a = make_lists([(50, 20)], seed=2)
    b = clone_lists(a)
    run_op(a, 0.01, weight_decay=0.0)
    run_op(b, 0.01, weight_decay=0.0, always_adapt=True)
    assert not torch.allclose(a[0][0], b[0][0])


def test_zero_norm_param_uses_ratio_one():
    lists = make_lists([(10, 10), (300,)], seed=3)
    lists[0][0].zero_()  # ||p|| = 0 -> ratio 1: p = -lr * u
    ref = clone_lists(lists, torch.float64)
    run_op(lists, 0.01)
    run_ref(ref, 0.01)
    assert_matches(lists, ref)
    assert lists[0][0].abs().sum() > 0


def test_grad_scale_and_found_inf():
    lists = make_lists(MIXED_SHAPES, seed=4)
    scaled = clone_lists(lists)
    for g in scaled[1]:
        g.mul_(1024.0)
    ref = clone_lists(lists, torch.float64)
    run_op(scaled, 0.01, grad_scale=torch.tensor(1024.0), found_inf=torch.tensor(0.0))
    run_ref(ref, 0.01)
    assert_matches([scaled[0], lists[1], *scaled[2:]], ref)

    before = snapshot(scaled)
    run_op(scaled, 0.01, grad_scale=torch.tensor(1024.0), found_inf=torch.tensor(1.0))
    assert_lists_equal(snapshot(scaled), before)  # skipped entirely, steps included


@pytest.mark.parametrize("kind", ["transposed", "strided"])
def test_noncontiguous(kind):
    shapes = [(33, 17), (64, 48), (5, 7, 3), (), (0, 4)]
    lists = make_lists(shapes, seed=5)
    ref = clone_lists(lists, torch.float64)
    # every combination of layouts: params permuted/strided, grads the other way, states mixed
    other = "strided" if kind == "transposed" else "transposed"
    nc = [
        [noncontiguous_like(t, kind) for t in lists[0]],
        [noncontiguous_like(t, other) for t in lists[1]],
        [noncontiguous_like(t, kind) for t in lists[2]],
        [noncontiguous_like(t, other) for t in lists[3]],
        lists[4],
    ]
    ptrs = [t.data_ptr() for t in nc[0]]
    for lr in LRS[:3]:
        run_op(nc, lr)
        run_ref(ref, lr)
    assert_matches(nc, ref)
    assert [t.data_ptr() for t in nc[0]] == ptrs  # updated in place


def test_same_layout_noncontiguous_in_place():
    """All tensors of an index with the same permuted layout: no copies, still exact."""
    shapes = [(40, 30), (6, 5, 4)]
    lists = make_lists(shapes, seed=6)
    ref = clone_lists(lists, torch.float64)
    nc = [[noncontiguous_like(t, "transposed") for t in lst] for lst in lists[:4]] + [lists[4]]
    for lr in LRS:
        run_op(nc, lr)
        run_ref(ref, lr)
    assert_matches(nc, ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_params_stepwise(dtype):
    """bf16/fp16 params without master: each step equals the float64 step rounded to dtype."""
    lists = make_lists(MIXED_SHAPES, dtype=dtype, seed=7)
    for lr in LRS:
        ref = clone_lists(lists, torch.float64)
        run_op(lists, lr)
        run_ref(ref, lr)
        for a, b in zip(lists[0], ref[0]):
            assert a.dtype == dtype
            # one rounding to dtype (plus float32 noise): within an ulp of dtype
            torch.testing.assert_close(a.double(), b, rtol=2 * torch.finfo(dtype).eps, atol=1e-5)
        assert_matches([[], [], *lists[2:]], [[], [], *ref[2:]])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_params_with_master(dtype):
    lists = make_lists(MIXED_SHAPES, dtype=dtype, seed=8)
    master = [p.float() for p in lists[0]]
    ref = clone_lists([master, *lists[1:]], torch.float64)
    for lr in LRS:
        run_op(lists, lr, master=master)
        run_ref(ref, lr)
    assert_matches([master, [], *lists[2:]], [ref[0], [], *ref[2:]])
    for p, mp in zip(lists[0], master):
        assert torch.equal(p, mp.to(dtype))


def test_thread_count_does_not_change_bits():
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        lists = make_lists(MIXED_SHAPES + [(300000,)], seed=9)
        for lr in LRS[:2]:
            run_op(lists, lr, max_grad_norm=10.0)
        results.append(lists)
    assert_lists_equal(results[0], results[1])


@pytest.mark.parametrize("threads", [1, 2])
def test_matches_reference_threads(threads):
    torch.set_num_threads(threads)
    lists = make_lists(MIXED_SHAPES + [(200001,)], seed=10)
    ref = clone_lists(lists, torch.float64)
    for lr in LRS[:3]:
        run_op(lists, lr)
        run_ref(ref, lr)
    assert_matches(lists, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_generic_isa_matches_best(dtype):
    """The generic (no AVX) build of the kernels agrees with the best one on this CPU."""
    available = ["default", "avx2", "avx512"][: ["default", "avx2", "avx512"].index(inductor_lamb.cpu_capability()) + 1]
    base = make_lists(MIXED_SHAPES, dtype=dtype, seed=11)
    ref = clone_lists(base, torch.float64)
    for lr in LRS[:3]:
        run_ref(ref, lr)
    outputs = {}
    for cap in available:
        inductor_lamb.set_cpu_capability(cap)
        assert inductor_lamb.cpu_capability() == cap
        lists = clone_lists(base)
        for lr in LRS[:3]:
            run_op(lists, lr)
        outputs[cap] = lists
        if dtype == torch.float32:
            assert_matches(lists, ref)
    # float32 noise may flip a 16-bit rounding: allow one ulp of the storage dtype
    rtol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    for cap in available[1:]:
        for a, b in zip(outputs["default"][0], outputs[cap][0]):
            torch.testing.assert_close(a, b, rtol=rtol, atol=1e-5)
    with pytest.raises(ValueError, match="unknown"):
        inductor_lamb.set_cpu_capability("sse9")


def test_opcheck():
    for dtype, master in ((torch.float32, False), (torch.bfloat16, True)):
        p, g, m, v, s = make_lists([(8, 5), (), (0,), (33,)], dtype=dtype, seed=12)
        mp = [t.float() for t in p] if master else None
        args = (p, g, m, v, s, torch.tensor(0.01))
        kwargs = dict(weight_decay=0.02, max_grad_norm=5.0, grad_scale=torch.tensor(2.0),
                      found_inf=torch.tensor(0.0), master_params=mp)
        with torch.no_grad():
            torch.library.opcheck(torch.ops.lamb.lamb_step_.default, args, raw_op_kwargs("lamb_step_", kwargs))


# ---- bad input: clear error naming argument and index; nothing modified ----------

def _bad_cases():
    def base():
        return make_lists([(4, 3), (5,), (2, 2)], seed=13)

    cases = []

    def case(name, mutate, match, **kw):
        cases.append(pytest.param(mutate, match, kw, id=name))

    case("grads_length", lambda L: L[1].pop(), r"grads has 2 tensors but params has 3")
    case("steps_length", lambda L: L[4].pop(), r"steps has 2 tensors but params has 3")
    case("grad_shape", lambda L: L[1].__setitem__(1, torch.randn(6)), r"grads\[1\] has shape \[6\] but params\[1\]")
    case("state_shape", lambda L: L[3].__setitem__(2, torch.rand(4)), r"exp_avg_sqs\[2\] has shape")
    case("grad_dtype", lambda L: L[1].__setitem__(0, torch.randn(4, 3, dtype=torch.float64)), r"grads\[0\] has dtype Double")
    case("state_dtype", lambda L: L[2].__setitem__(1, torch.randn(5, dtype=torch.bfloat16)), r"exp_avgs\[1\] has dtype BFloat16")
    case("param_dtype", lambda L: [L[0].__setitem__(1, torch.randn(5, dtype=torch.float64)),
                                   L[1].__setitem__(1, torch.randn(5, dtype=torch.float64))],
         r"params\[1\] has dtype Double")
    case("device", lambda L: L[1].__setitem__(2, torch.randn(2, 2, device="meta")), r"grads\[2\] is on meta")
    case("sparse", lambda L: L[1].__setitem__(1, torch.randn(5).to_sparse()), r"grads\[1\] has layout")
    case("step_not_0d", lambda L: L[4].__setitem__(1, torch.zeros(1)), r"steps\[1\] must be a 0-d tensor")
    case("step_dtype", lambda L: L[4].__setitem__(0, torch.tensor(0.0, dtype=torch.float64)), r"steps\[0\] must be float32")
    case("lr_not_0d", lambda L: None, r"lr must be a 0-d tensor", lr=torch.tensor([0.01]))
    case("master_length", lambda L: None, r"master_params has 1 tensors but params has 3", master_params=[torch.randn(4, 3)])
    case("master_dtype", lambda L: None, r"master_params\[0\] has dtype BFloat16",
         master_params=[torch.randn(4, 3, dtype=torch.bfloat16), torch.randn(5), torch.randn(2, 2)])
    case("beta1", lambda L: None, r"invalid beta1 1", beta1=1.0)
    case("eps", lambda L: None, r"invalid eps -1", eps=-1.0)
    case("grad_scale", lambda L: None, r"grad_scale must have one element", grad_scale=torch.ones(2))
    return base, cases


_base, _cases = _bad_cases()


@pytest.mark.parametrize("mutate,match,kw", _cases)
def test_bad_input_errors_and_leaves_tensors_untouched(mutate, match, kw):
    lists = _base()
    mutate(lists)
    lr = kw.pop("lr", torch.tensor(0.01))
    tensors = [t for lst in lists for t in lst] + [t for t in kw.get("master_params") or []]
    before = [t.clone() for t in tensors]
    with pytest.raises(RuntimeError, match=match):
        inductor_lamb.ops.lamb_step_(*lists, lr=lr, **kw)
    for t, b in zip(tensors, before):
        if t.device.type == "meta":
            continue
        if t.is_sparse:
            assert torch.equal(t.to_dense(), b.to_dense())
        else:
            assert torch.equal(t, b)
