"""Two-phase form of the layer-wise ops (reduce, then apply): bit-identical to the
one-call op on every backend, reductions against the float64 reference, the
sharded protocol (partials combined across shards) against the whole-tensor
step, opcheck, and compiled graphs."""

from __future__ import annotations

import pytest
import torch
from bit_cases import available_capabilities
from conftest import assert_tensor_close, clone_lists, equal, raw_op_kwargs, spec_lists

import inductor_lamb
from inductor_lamb import ops, reference
from inductor_lamb.spec import SPECS, Role

PATHS = inductor_lamb._inductor.PATHS
LRS = (0.01, 0.03, 0.005)  # several steps with a changing lr

# (one-call op, kwargs) of the layer-wise ops; op_args adds the lists.
CASES = {
    "lamb": ("lamb_step_", dict(weight_decay=0.01)),
    "lamb_clip_grad_scale": ("lamb_step_", dict(beta1=0.8, beta2=0.99, weight_decay=0.1, trust_clip=True,
                                                max_grad_norm=1.0, grad_scale=torch.tensor(4.0))),
    "lamb_no_adapt": ("lamb_step_", dict(weight_decay=0.0, bias_correction=False, grad_averaging=False)),
    "lamb16": ("lamb16_step_", dict(weight_decay=0.01)),
    "lamb16_grad_scale": ("lamb16_step_", dict(beta1=0.8, eps=1e-5, trust_scale=1.0, grad_scale=torch.tensor(4.0))),
    "lars": ("lars_step_", dict(momentum=0.8, weight_decay=[1e-3, 0.0, 5e-4] * 3,
                                layer_adaptation=[True, True, False] * 3, rescale_grad=0.5)),
    "lars_grad_scale": ("lars_step_", dict(eps=1e-8, grad_scale=torch.tensor(2.0))),
    "novograd": ("novograd_step_", dict(weight_decay=1e-3, grad_averaging=True, amsgrad=True)),
}


def case_args(case, dtype=torch.float32, layout=None, shapes=None):
    name, kwargs = CASES[case]
    extra = {} if shapes is None else {"shapes": shapes}
    shapes = extra.get("shapes", _default_shapes())
    args = spec_lists(name, shapes, dtype=dtype, seed=1, layout=layout)
    # per-param options (LARS) cut or repeated to the number of params
    kwargs = {k: (v * len(shapes))[:len(shapes)] if isinstance(v, list) else v for k, v in kwargs.items()}
    kwargs = raw_op_kwargs(name, kwargs)
    if dtype != torch.float32:
        kwargs["master_params"] = [t.float() for t in args[0]]
    return name, args, kwargs


def _default_shapes():
    from conftest import MIXED_SHAPES

    return MIXED_SHAPES


def one_call(name, args, lr, kwargs):
    getattr(torch.ops.lamb, name)(*args, lr, **kwargs)


def two_phase(name, args, lr, kwargs):
    spec = SPECS[name]
    reductions = getattr(torch.ops.lamb, spec.reduce_op)(*args, lr, **kwargs)
    getattr(torch.ops.lamb, spec.apply_op)(*args, reductions, lr, **kwargs)
    return reductions


def all_tensors(args, kwargs):
    return [t for lst in (*args, kwargs.get("master_params") or []) for t in lst]


def assert_bit_identical(a_args, a_kwargs, b_args, b_kwargs):
    for i, (x, y) in enumerate(zip(all_tensors(a_args, a_kwargs), all_tensors(b_args, b_kwargs))):
        assert equal(x, y), f"tensor {i} differs: max |diff| {(x.double() - y.double()).abs().max()}"


def use_path(path):
    assert inductor_lamb.set_compile_path(path) == path
    torch._dynamo.reset()


@pytest.fixture
def reset_path():
    yield
    inductor_lamb.set_compile_path("auto")
    torch._dynamo.reset()


# The CPU one-call ops run reduce and apply a block of whole tensors at a time
# (8 MiB of pass-1 data and stash: 419K elements for LAMB, 381K for LAMB16, 1M for LARS;
# csrc/cpu/engine.h): these shapes make several blocks, with tensors larger
# than a block alone, empty and 0-d ones between them.
BLOCK_SHAPES = [(600, 1000), (300, 700), (0, 5), (), (1100, 1000), (400, 500), (7,)]


@pytest.mark.parametrize("variant", ["fp32", "bf16_master", "noncontiguous", "found_inf"])
@pytest.mark.parametrize("shapes", ["mixed", "blocks"])
@pytest.mark.parametrize("case", list(CASES))
def test_one_call_is_reduce_then_apply_bit_for_bit(case, shapes, variant):
    dtype = torch.bfloat16 if variant == "bf16_master" else torch.float32
    name, args, kwargs = case_args(case, dtype=dtype, layout="transposed" if variant == "noncontiguous" else None,
                                   shapes=BLOCK_SHAPES if shapes == "blocks" else None)
    if variant == "found_inf":
        kwargs["found_inf"] = torch.tensor(1.0)
    b_args, b_kwargs = clone_lists(args), dict(kwargs)
    if "master_params" in kwargs:
        b_kwargs["master_params"] = [t.clone() for t in kwargs["master_params"]]
    before = [t.clone() for t in all_tensors(args, kwargs)]
    for lr in LRS:
        one_call(name, args, torch.tensor(lr), kwargs)
        reductions = two_phase(name, b_args, torch.tensor(lr), b_kwargs)
        assert reductions.shape == (len(args[0]), len(SPECS[name].reductions)) and reductions.dtype == torch.float32
    assert_bit_identical(args, kwargs, b_args, b_kwargs)
    changed = [not equal(x, y) for x, y in zip(all_tensors(args, kwargs), before)]
    if variant == "found_inf":
        assert not any(changed) and torch.count_nonzero(reductions) == 0
    else:
        assert changed[0]  # the step ran


@pytest.fixture
def cache_bytes():
    """Sets the last-level cache size the CPU step plans for; the system's again afterwards."""
    yield lambda n: torch.ops.lamb._cpu_cache_bytes(n)
    torch.ops.lamb._cpu_cache_bytes(0)


# LAMB's and LAMB16's one-call steps on CPU stash each element's update (LAMB16's new moments
# too) in pass 1 for pass 2 to apply (csrc/cpu/engine.h), stored plainly where a block fits the
# last-level cache and, for LAMB, streamed where it does not (a 1 MiB cache: every block of more
# than 64K elements; LAMB16 recomputes there), except for bf16 params rounded stochastically,
# which recompute. Every way gives the two-phase form's bits (it recomputes), on every
# instruction set and thread count.
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("cache", ["system", "1MiB"])
@pytest.mark.parametrize("cap", available_capabilities())
@pytest.mark.parametrize("variant", ["fp32", "bf16_rounded", "bf16_nearest", "bf16_master", "noncontiguous"])
@pytest.mark.parametrize("case", ["lamb", "lamb_clip_grad_scale", "lamb_no_adapt", "lamb16", "lamb16_grad_scale"])
def test_stash_gives_the_recomputed_bits(case, variant, cap, cache, threads, cache_bytes):
    inductor_lamb.set_cpu_capability(cap)
    torch.set_num_threads(threads)
    if cache == "1MiB":
        assert cache_bytes(1 << 20) == 1 << 20
    dtype = torch.bfloat16 if variant.startswith("bf16") else torch.float32
    name, args, kwargs = case_args(case, dtype=dtype, layout="transposed" if variant == "noncontiguous" else None,
                                   shapes=BLOCK_SHAPES + [(70000,), (5, 3)])
    if variant in ("bf16_rounded", "bf16_nearest"):  # no master copies: stochastically (recomputes) or to nearest
        del kwargs["master_params"]
        kwargs["stochastic_rounding"] = variant == "bf16_rounded"
    b_args, b_kwargs = clone_lists(args), dict(kwargs)
    if "master_params" in kwargs:
        b_kwargs["master_params"] = [t.clone() for t in kwargs["master_params"]]
    for lr in LRS:
        one_call(name, args, torch.tensor(lr), kwargs)
        two_phase(name, b_args, torch.tensor(lr), b_kwargs)
    assert_bit_identical(args, kwargs, b_args, b_kwargs)


# With several threads LAMB's and LAMB16's one-call steps give each thread whole blocks of its own
# (both passes; a block above a quarter of a thread's share is worked on by all threads; LARS and
# NovoGrad share every block, and must give the same bits either way). Blocks of 64 KiB cut
# these 30 tensors of 20K-160K elements into one block each, every one owned, which the threads
# take largest first; "mixed_blocks" adds tensors large enough to stay shared, empty and 0-d ones.
OWNED_SHAPES = [(20_000 + 37_000 * (i % 4) + 1_000 * i,) for i in range(30)]


@pytest.fixture
def small_blocks():
    assert torch.ops.lamb._cpu_block_bytes(64 << 10) == 64 << 10
    yield
    torch.ops.lamb._cpu_block_bytes(0)


@pytest.mark.parametrize("variant", ["fp32", "bf16_rounded", "streamed_stash"])
@pytest.mark.parametrize("shapes", ["owned", "mixed_blocks"])
@pytest.mark.parametrize("case", ["lamb", "lamb16_grad_scale", "lars_grad_scale", "novograd"])
def test_threads_owning_blocks_give_one_threads_bits(case, shapes, variant, small_blocks, cache_bytes):
    if variant == "streamed_stash":
        cache_bytes(1 << 20)
    shape_list = OWNED_SHAPES if shapes == "owned" else [(1_500_000,)] + OWNED_SHAPES[:8] + [(0, 5), (), (3_000_000,)]
    dtype = torch.bfloat16 if variant == "bf16_rounded" else torch.float32
    name, args, kwargs = case_args(case, dtype=dtype, shapes=shape_list)
    if variant == "bf16_rounded":
        kwargs.pop("master_params", None)
        kwargs["stochastic_rounding"] = True
    b_args, b_kwargs = clone_lists(args), dict(kwargs)
    c_args, c_kwargs = clone_lists(args), dict(kwargs)
    for kw in (b_kwargs, c_kwargs):
        if "master_params" in kw:
            kw["master_params"] = [t.clone() for t in kw["master_params"]]
    threads = torch.get_num_threads()
    try:
        for lr in LRS:
            torch.set_num_threads(2)
            one_call(name, args, torch.tensor(lr), kwargs)
            two_phase(name, c_args, torch.tensor(lr), c_kwargs)
            torch.set_num_threads(1)
            one_call(name, b_args, torch.tensor(lr), b_kwargs)
    finally:
        torch.set_num_threads(threads)
    assert_bit_identical(args, kwargs, b_args, b_kwargs)
    assert_bit_identical(args, kwargs, c_args, c_kwargs)


@pytest.mark.parametrize("path", ["lowering", "decomposition"])
@pytest.mark.parametrize("case", ["lamb_clip_grad_scale", "lamb16", "lars"])
def test_compiled_one_call_is_compiled_reduce_then_apply(case, path, reset_path):
    use_path(path)
    name, args, kwargs = case_args(case)
    b_args, b_kwargs = clone_lists(args), dict(kwargs)
    c_one, c_two = torch.compile(one_call, fullgraph=True), torch.compile(two_phase, fullgraph=True)
    for lr in LRS:
        c_one(name, args, torch.tensor(lr), kwargs)
        c_two(name, b_args, torch.tensor(lr), b_kwargs)
    if path == "lowering":
        assert_bit_identical(args, kwargs, b_args, b_kwargs)
    else:  # Inductor may schedule the traced torch ops' reductions differently in the two graphs
        for x, y in zip(all_tensors(args, kwargs), all_tensors(b_args, b_kwargs)):
            assert_tensor_close(x, y, rtol=1e-6, atol=1e-8)
    # and both agree with the eager kernels
    e_name, e_args, e_kwargs = case_args(case)
    for lr in LRS:
        one_call(e_name, e_args, torch.tensor(lr), e_kwargs)
    for x, y in zip(all_tensors(b_args, b_kwargs), all_tensors(e_args, e_kwargs)):
        assert_tensor_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", ["lamb", "lamb16_grad_scale", "lars"])
def test_compiled_reductions_match_eager_and_reference(case, path, reset_path):
    use_path(path)
    name, args, kwargs = case_args(case)
    spec = SPECS[name]
    ref_args = [[t.double() if t.dtype == torch.float32 and t.dim() else t.clone() for t in lst] for lst in args]
    ref_kwargs = {k: v for k, v in kwargs.items() if k != "master_params"}
    reduce_op = getattr(torch.ops.lamb, spec.reduce_op)
    compiled = torch.compile(lambda *a, **k: reduce_op(*a, **k), fullgraph=True)(*clone_lists(args), torch.tensor(0.01),
                                                                                 **kwargs)
    eager = reduce_op(*args, torch.tensor(0.01), **kwargs)
    expected = getattr(reference, spec.reference.replace("_step", "_reduce"))(*ref_args, lr=0.01, **ref_kwargs)
    torch.testing.assert_close(eager.double(), expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-7)
    # the reduce op wrote what pass 1 writes (LAMB: m, v, steps), exactly as the reference
    assert all(float(s) == 3.0 for s in args[-1]) if "steps" in spec.names[-3:] else True


def _shard(t: torch.Tensor, world: int) -> list[torch.Tensor]:
    """Row shards like FSDP2's Shard(0): uneven, trailing ones possibly empty."""
    return [c.clone() for c in torch.tensor_split(t, world, dim=0)]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_sharded_protocol_matches_whole_tensors(case, world):
    """Each rank runs reduce and apply on its row shards; the partials of each
    tensor are combined across ranks (sum or max, per the spec) in between; with
    clipping, the grad norm is combined first and folded into grad_scale. The
    result equals the one-call step on the whole tensors."""
    shapes = [(7, 3), (2, 5), (1, 4), (64,), (5,)]  # uneven shards; a param with fewer rows than ranks
    name, args, kwargs = case_args(case, shapes=shapes)
    spec = SPECS[name]
    whole_args, whole_kwargs = clone_lists(args), dict(kwargs)
    list_args = [a for a in spec.args if a.role in (Role.PARAMS, Role.GRADS, Role.STATE, Role.SCALARS)]
    scalar_lists = {i for i, a in enumerate(list_args) if a.role is Role.SCALARS}  # per-tensor: replicated
    ranks = [[[t.clone() for t in lst] if i in scalar_lists else [_shard(t, world)[r] for t in lst]
              for i, lst in enumerate(args)] for r in range(world)]
    assert any(t.numel() == 0 for t in ranks[-1][0])  # a rank holding an empty shard
    for lr in LRS:
        lr = torch.tensor(lr)
        one_call(name, whole_args, lr, whole_kwargs)
        rank_kwargs = dict(kwargs)
        if kwargs.get("max_grad_norm", 0) > 0:  # protocol step 1: the clip, from the combined grad norm
            grad_sumsq = sum(sum((g.double() ** 2).sum() for g in lists[1]) for lists in ranks)
            clip = ops.clip_factor(grad_sumsq, kwargs["max_grad_norm"], kwargs.get("grad_scale"))
            rank_kwargs.update(max_grad_norm=0.0, grad_scale=kwargs["grad_scale"] * clip)
        partials = [getattr(torch.ops.lamb, spec.reduce_op)(*lists, lr, **rank_kwargs) for lists in ranks]
        combined = torch.stack([
            torch.stack([p[:, j] for p in partials]).sum(0) if col.combine == "sum"
            else torch.stack([p[:, j] for p in partials]).amax(0)
            for j, col in enumerate(spec.reductions)], dim=1)
        for lists in ranks:
            getattr(torch.ops.lamb, spec.apply_op)(*lists, combined, lr, **rank_kwargs)
    for i, whole in enumerate(whole_args):
        for j, w in enumerate(whole):
            if i in scalar_lists:
                got = ranks[0][i][j]
                for r in range(1, world):
                    assert equal(ranks[r][i][j], got)  # every rank computes the same scales and steps
            else:
                got = torch.cat([ranks[r][i][j].reshape(-1) for r in range(world)]).reshape(w.shape)
            assert_tensor_close(got, w, rtol=1e-6, atol=1e-7, msg=lambda m: f"list {i}[{j}]: {m}")


@pytest.mark.parametrize("case", ["lamb", "lamb16", "lars"])
def test_opcheck_two_phase_ops(case):
    name, _ = CASES[case]
    spec = SPECS[name]
    # (LAMB16: test_schema compares tensors with aten.mul, which has no float8 CPU kernel;
    # test_lamb16_op.py says more)
    utils = (("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic") if case == "lamb16"
             else ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
    for dtype in (torch.float32, torch.bfloat16):
        _, args, kwargs = case_args(case, dtype=dtype, shapes=[(4, 3), (5,), (0,), ()])
        kwargs["grad_scale"] = torch.tensor(2.0)
        reductions = getattr(torch.ops.lamb, spec.reduce_op)(*clone_lists(args), torch.tensor(0.01), **kwargs)
        with torch.no_grad():
            torch.library.opcheck(getattr(torch.ops.lamb, spec.reduce_op).default,
                                  (*clone_lists(args), torch.tensor(0.01)), dict(kwargs), test_utils=utils)
            torch.library.opcheck(getattr(torch.ops.lamb, spec.apply_op).default,
                                  (*clone_lists(args), reductions, torch.tensor(0.01)), dict(kwargs), test_utils=utils)


@pytest.mark.parametrize("case", ["lamb", "lamb16", "lars"])
def test_wrappers_and_empty_lists(case):
    name, kwargs = CASES[case]
    spec = SPECS[name]
    reduce, apply = getattr(ops, spec.reduce_op), getattr(ops, spec.apply_op)
    empty = [[] for _ in spec_lists(name, [])]
    out = reduce(*empty, lr=0.01)
    assert out.shape == (0, len(spec.reductions)) and out.dtype == torch.float32
    apply(*empty, out, lr=0.01)
    _, args, raw = case_args(case)
    b_args = clone_lists(args)
    wrapper_kwargs = {k: v for k, v in CASES[case][1].items()}
    apply(*args, reduce(*args, lr=0.02, **wrapper_kwargs), lr=0.02, **wrapper_kwargs)
    one_call(name, b_args, torch.tensor(0.02), raw)
    assert_bit_identical(args, {}, b_args, {})
    if spec.mutates:  # torch 2.13's Inductor cannot lower a mutating op that mutates no tensor and returns one
        return
    compiled = torch.compile(lambda: reduce(*empty, lr=torch.tensor(0.01)), fullgraph=True)()
    assert compiled.shape == (0, len(spec.reductions))
