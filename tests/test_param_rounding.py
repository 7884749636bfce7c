"""Stochastic rounding of bfloat16 / float16 params without master copies
(``stochastic_rounding``, on by default): right on average, the same bits on every
thread count, eagerly and compiled, and continued bit for bit from a checkpoint.
(Sharded against whole: tests/dist_cases.py; the C++ and torch roundings against each
other: test_shared_math.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import checkpoint, raw_op_kwargs, spec_lists, use_path
from torch import nn

import inductor_lamb
from inductor_lamb import reference
from inductor_lamb.spec import SPECS

OPS = ["lamb_step_", "lamb16_step_", "lars_step_", "adagrad_step_", "novograd_step_"]
# hyper-parameters whose updates are a fraction of bfloat16's spacing: what rounding to
# nearest loses
# nearest loses (at bfloat16's spacing; float16's is 8 times finer: lr / 8)
SMALL = {"lamb_step_": dict(lr=1e-3, weight_decay=0.0), "lamb16_step_": dict(lr=1e-3),
         "lars_step_": dict(lr=1e-3, weight_decay=[0.0], layer_adaptation=[False], momentum=0.0),
         "adagrad_step_": dict(lr=1e-3), "novograd_step_": dict(lr=1e-3, weight_decay=0.0)}
N = 4096


def _hypers(name, dtype=torch.bfloat16):
    hypers = dict(SMALL[name])
    if dtype == torch.float16:
        hypers["lr"] /= 8
    return hypers


def _call(name, lists, stochastic_rounding, seed=0, **extra):
    hypers = _hypers(name, lists[0][0].dtype if lists[0] else torch.bfloat16)
    kwargs = raw_op_kwargs(name, {**hypers, "lr": torch.tensor(hypers["lr"]), **extra})
    getattr(torch.ops.lamb, name)(*lists, stochastic_rounding=stochastic_rounding, seed=seed, **kwargs)


def _float64_step(name, lists):
    """The step in float64 from the same (bf16 / fp16) starting point: the update rounding must keep."""
    ref = [[t.double() if t.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) and t.dim() else t.clone()
            for t in lst] if isinstance(lst, list) else lst for lst in lists]
    getattr(reference, SPECS[name].reference)(*ref, **_hypers(name, lists[0][0].dtype))
    return ref[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", OPS)
def test_the_expected_value_of_a_rounded_step_is_the_exact_step(name, dtype):
    """Over many seeds, the stored param averages to the float64 step (a z-test on the
    summed errors in units of the grid spacing, which fails far beyond chance for a biased
    rounding); rounded to nearest, most of an update below half a spacing is lost."""
    seeds = 48
    lists = spec_lists(name, [(N,)], dtype=dtype, seed=3)
    p0 = lists[0][0].clone()
    exact = _float64_step(name, lists)[0]
    spacing = torch.finfo(dtype).eps * p0.double().abs().clamp(min=1e-3)  # (bounds a grid step at |p|)
    kept, errors = {}, []
    for stochastic in (True, False):
        total = torch.zeros(N, dtype=torch.float64)
        for seed in range(seeds if stochastic else 1):
            trial = [[t.clone() for t in lst] if isinstance(lst, list) else lst.clone() for lst in lists]
            _call(name, trial, stochastic, seed=seed)
            total += trial[0][0].double()
            if stochastic:
                errors.append((trial[0][0].double() - exact) / spacing)
        mean = total / (seeds if stochastic else 1)
        kept[stochastic] = float((mean - p0.double()).abs().sum() / (exact - p0.double()).abs().sum())
    err = torch.stack(errors)  # each sample: |err| <= 1 (one grid step at most), variance <= 1/4
    z = float(err.sum() / math.sqrt(err.numel() / 4))
    assert abs(z) < 5, f"rounding is biased: z = {z:.1f}"
    assert 0.9 < kept[True] < 1.1, kept  # the update is kept on average
    assert kept[False] < 0.75, kept     # (round to nearest loses most of it: the test can tell)


@pytest.mark.parametrize("name", OPS)
def test_float32_and_master_params_are_not_rounded(name):
    for dtype, master in ((torch.float32, False), (torch.bfloat16, True)):
        a = spec_lists(name, [(N,), (3, 5)], dtype=dtype, seed=4)
        b = [[t.clone() for t in lst] for lst in a]
        extra = lambda lists: {"master_params": [p.float() for p in lists[0]]} if master else {}  # noqa: E731
        ea, eb = extra(a), extra(b)
        _call(name, a, True, **ea)
        _call(name, b, False, **eb)
        assert all(torch.equal(x, y) for x, y in zip(a[0], b[0]))


@pytest.mark.parametrize("name", OPS)
def test_the_same_bits_on_every_thread_count_and_seed_changes_them(name):
    runs = []
    for threads, seed in ((1, 0), (2, 0), (2, 1)):
        torch.set_num_threads(threads)
        lists = spec_lists(name, [(40000,), (33, 17), ()], dtype=torch.bfloat16, seed=5)
        _call(name, lists, True, seed=seed)
        runs.append(lists[0])
    assert all(torch.equal(x, y) for x, y in zip(runs[0], runs[1]))
    assert not torch.equal(runs[0][0], runs[2][0])


@pytest.mark.parametrize("path", ["lowering", "decomposition", "external"])
@pytest.mark.parametrize("name", OPS)
def test_compiled_steps_round_like_eager(name, path, lowering_path):
    """Every compile path gives the kernels' bits (the rounding is the same integer math;
    its inputs are truncated to bfloat16, so a last-bit difference upstream almost never
    reaches them): 3 steps on mixed shapes."""
    use_path(path)
    shapes = [(4000,), (33, 17), (), (0,)]
    eager = spec_lists(name, shapes, dtype=torch.bfloat16, seed=6)
    compiled = [[t.clone() for t in lst] for lst in eager]
    fn = torch.compile(lambda lists, seed: _call(name, lists, True, seed=seed), fullgraph=True)
    for seed in range(3):
        _call(name, eager, True, seed=seed)
        fn(compiled, seed)
    for x, y in zip(eager[0], compiled[0]):
        differ = (x != y).double().mean() if x.numel() else 0.0
        assert differ <= 1e-3, f"{differ:.2%} of the params differ"


def _lm(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8)).bfloat16()


OPTIMIZERS = {"Lamb": dict(lr=1e-3), "Lamb16": dict(lr=1e-3), "Lars": dict(lr=0.5, momentum=0.9),
              "Adagrad": dict(lr=1e-3), "NovoGrad": dict(lr=1e-3)}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_resumed_checkpoint_continues_bit_for_bit(name):
    """The random bits hash the step count, the seed (a param-group option) and the data,
    so 2 steps, a save and a load into a new optimizer, and 2 more steps give the bits of 4
    steps in a row."""
    cls, kw = getattr(inductor_lamb, name), OPTIMIZERS[name]
    gen = torch.Generator().manual_seed(9)
    data = [(torch.randn(16, 32, generator=gen).bfloat16(), torch.randint(0, 8, (16,), generator=gen))
            for _ in range(4)]

    def train(model, opt, batches):
        for x, y in batches:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x).float(), y).backward()
            opt.step()

    straight = _lm()
    train(straight, cls(straight.parameters(), seed=123, **kw), data)
    resumed = _lm()
    opt = cls(resumed.parameters(), seed=123, **kw)
    train(resumed, opt, data[:2])
    saved = checkpoint({"model": resumed.state_dict(), "opt": opt.state_dict()})
    resumed = _lm(seed=1)
    resumed.load_state_dict(saved["model"])
    opt = cls(resumed.parameters(), **kw)  # (the seed comes back with the param groups)
    opt.load_state_dict(saved["opt"])
    assert opt.param_groups[0]["seed"] == 123 and opt.param_groups[0]["stochastic_rounding"]
    train(resumed, opt, data[2:])
    assert all(torch.equal(a, b) for a, b in zip(straight.parameters(), resumed.parameters()))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_checkpoints_without_the_option_keep_rounding_to_nearest(name):
    cls = getattr(inductor_lamb, name)
    model = _lm()
    sd = cls(model.parameters(), **OPTIMIZERS[name]).state_dict()
    for group in sd["param_groups"]:
        del group["stochastic_rounding"], group["seed"]
    opt = cls(model.parameters(), **OPTIMIZERS[name])
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["stochastic_rounding"] is False and opt.param_groups[0]["seed"] == 0


def test_the_seed_is_checked():
    with pytest.raises(ValueError, match="Invalid seed: 1.5"):
        inductor_lamb.Lamb(_lm().parameters(), seed=1.5)
    with pytest.raises(ValueError, match="Invalid seed"):
        inductor_lamb.Adagrad(_lm().parameters(), seed=2**63)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", OPS)
def test_every_cpu_isa_rounds_special_values_like_the_generic_kernels(name, dtype):
    """The vector kernels' stores (bfloat16: the rounding and the conversion in one) give the
    generic kernels' bits for params at the format's edges: NaN, infinities, the largest
    finite values (which may round up to infinity), subnormals, zeros, and a tail."""
    from bit_cases import available_capabilities

    caps = available_capabilities()
    if len(caps) < 2:
        pytest.skip("this CPU has only the generic kernels")
    info = torch.finfo(dtype)
    edges = torch.tensor([math.nan, math.inf, -math.inf, info.max, -info.max, info.tiny / 4, -info.tiny / 4,
                          info.tiny, 0.0, -0.0], dtype=torch.float32)
    # edge params in one tensor, edge grads in another (LAMB's and LARS's norms spread a NaN
    # over its tensor), and a plain one whose length leaves a tail
    lists = spec_lists(name, [(N + 13,), (len(edges) + 5,), (len(edges) + 5,)], dtype=dtype, seed=11)
    lists[0][1][: len(edges)] = edges.to(dtype)
    lists[1][2][: len(edges)] = edges.to(dtype)
    before = inductor_lamb.cpu_capability()
    results = {}
    try:
        for cap in caps:
            inductor_lamb.set_cpu_capability(cap)
            trial = [[t.clone() for t in lst] if isinstance(lst, list) else lst.clone() for lst in lists]
            _call(name, trial, True, seed=7)
            results[cap] = torch.cat(trial[0])
    finally:
        inductor_lamb.set_cpu_capability(before)
    ref = results["default"]
    nan = ref.isnan()
    assert nan.any() and (~nan).sum() > N
    for cap, got in results.items():
        assert torch.equal(got.isnan(), nan), cap  # (NaN payloads may differ by ISA, as torch's conversions do)
        assert torch.equal(got[~nan].view(torch.int16), ref[~nan].view(torch.int16)), cap
