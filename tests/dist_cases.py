"""What the ranks of tests/test_distributed.py run (``conftest.spawn``: real gloo process
groups on a localhost file store), each rank comparing its sharded run with a whole-tensor
run of the same problem in the same process."""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import inductor_lamb
from inductor_lamb import Adagrad, Lamb, Lamb16, Lars, NovoGrad

sys.path.insert(0, os.path.dirname(__file__))
from conftest import assert_tensor_close  # noqa: E402

# One lr per step (written into the param groups as floats, as schedulers do).
LRS = [1e-2, 8e-3, 1.2e-2, 5e-3, 9e-3, 7e-3]

OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "lamb": lambda ps: Lamb(ps, lr=LRS[0], weight_decay=0.01),
    "lamb_clip": lambda ps: Lamb(ps, lr=LRS[0], weight_decay=0.01, max_grad_norm=0.5),
    "lamb_bf16": lambda ps: Lamb(ps, lr=LRS[0], weight_decay=0.01, master_weights=True),
    # bf16 params without master copies, rounded stochastically: sharded like whole, bit for bit
    "lamb_sr_bf16": lambda ps: Lamb(ps, lr=LRS[0], weight_decay=0.01, seed=5),
    "lamb16_sr_bf16": lambda ps: Lamb16(ps, lr=LRS[0], weight_decay=0.01, seed=5),
    "lars_sr_bf16": lambda ps: Lars(ps, lr=LRS[0], weight_decay=1e-3, lars_coeff=0.01, seed=5),
    "adagrad_sr_bf16": lambda ps: Adagrad(ps, lr=LRS[0], weight_decay=1e-3, seed=5),
    "lamb16": lambda ps: Lamb16(ps, lr=LRS[0], weight_decay=0.01),
    "lars": lambda ps: Lars(ps, lr=LRS[0], weight_decay=1e-3, exclude_from_weight_decay=["bias"]),
    "lars_plain": lambda ps: Lars(ps, lr=LRS[0], weight_decay=1e-3, lars_coeff=0.01),
    "adagrad": lambda ps: Adagrad(ps, lr=LRS[0], weight_decay=1e-3),
    "novograd": lambda ps: NovoGrad(ps, lr=LRS[0], weight_decay=1e-3, amsgrad=True),
    "novograd_sr_bf16": lambda ps: NovoGrad(ps, lr=LRS[0], weight_decay=1e-2, decoupled_decay=True, seed=5),
}


def set_lr(opt: torch.optim.Optimizer, k: int) -> None:
    for g in opt.param_groups:
        g["lr"] = LRS[k % len(LRS)]
    # Like torch's schedulers, read the groups back eagerly: that fills the group's lr
    # tensor from the float, so a compiled step sees a tensor (no recompile).
    opt.param_groups  # noqa: B018


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (float8 gathered as bytes: gloo has no float8)."""
    if not isinstance(t, DTensor):
        return t
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        bits = DTensor.from_local(t.to_local().view(torch.uint8), t.device_mesh, t.placements, shape=t.shape,
                                  stride=t.stride())
        return bits.full_tensor().view(t.dtype)
    return t.full_tensor()


def each(opt_names: list[str], check: Callable[[str], None]) -> None:
    """Runs ``check`` for every optimizer (in one process group: ranks start once)."""
    for name in opt_names:
        try:
            check(name)
        except Exception as e:
            raise AssertionError(f"{name}: {e}") from e


def assert_same_run(opt: torch.optim.Optimizer, ref: torch.optim.Optimizer, what: str) -> None:
    """Params and every state tensor of ``opt`` (sharded) equal ``ref``'s (whole)
    within 1e-6 relative (float8 state: the tie rule of the CUDA tests)."""
    for group, ref_group in zip(opt.param_groups, ref.param_groups):
        for i, (p, q) in enumerate(zip(group["params"], ref_group["params"])):
            torch.testing.assert_close(full(p).detach(), full(q).detach(), rtol=1e-6, atol=1e-6,
                                       msg=lambda m: f"{what}: param {i}: {m}")
            for key, v in ref.state[q].items():
                assert_tensor_close(full(opt.state[p][key]), full(v), rtol=1e-6, atol=1e-6,
                                    msg=lambda m: f"{what}: state {key} of param {i}: {m}")


# ---- DTensor params on 1-D and 2-D meshes ---------------------------------------------
# (shape, placements on a 1-D mesh): uneven rows and columns, fewer rows than ranks
# (a rank holds an empty shard), a replicated param, a 0-d replicated param.
LAYOUTS = [((7, 3), Shard(0)), ((5, 4), Shard(1)), ((1, 6), Shard(0)), ((4,), Replicate()),
           ((9, 2), Shard(0)), ((), Replicate())]


def _placements(pl, mesh_shape: tuple[int, ...]) -> list:
    if len(mesh_shape) == 1:
        return [pl]
    # 2-D: HSDP-style (replicate on dim 0, shard on dim 1) and 2-D sharding
    return [Replicate(), pl] if mesh_shape[0] == 1 else [pl, Shard(0) if isinstance(pl, Shard) else Replicate()]


def dtensor_exact(rank: int, world: int, opt_names: list[str], mesh_shapes: list[tuple[int, ...]]) -> None:
    for mesh_shape in mesh_shapes:
        mesh = init_device_mesh("cpu", mesh_shape)
        each(opt_names, lambda name: _dtensor_exact(name, mesh, mesh_shape))


def _dtensor_exact(opt_name: str, mesh, mesh_shape: tuple[int, ...]) -> None:
    dtype = torch.bfloat16 if opt_name.endswith("bf16") else torch.float32
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(shape, generator=gen).to(dtype) for shape, _ in LAYOUTS]
    placements = [_placements(pl, mesh_shape) for _, pl in LAYOUTS]
    ref_params = [nn.Parameter(v.clone()) for v in values]
    params = [nn.Parameter(distribute_tensor(v.clone(), mesh, pl)) for v, pl in zip(values, placements)]
    names = ["w", "v", "tiny", "bias", "u", "bias0"]
    opt = OPTIMIZERS[opt_name](list(zip(names, params)))
    opt.max_tensors_per_call = 2  # (eager: one call a bucket whatever this says; the clip rule follows it)
    ref = OPTIMIZERS[opt_name](list(zip(names, ref_params)))
    for k in range(5):
        for p, q, pl in zip(params, ref_params, placements):
            g = torch.randn(q.shape, generator=gen).to(dtype)
            q.grad = g.clone()
            p.grad = distribute_tensor(g.clone(), mesh, pl)
        set_lr(opt, k)
        set_lr(ref, k)
        opt.step()
        ref.step()
    assert_same_run(opt, ref, f"{opt_name} on mesh {mesh_shape}")


# Every way a DTensor param is laid out in large-model training (TorchTitan): _StridedShard
# (FSDP2 over tensor parallel), Shard and Replicate combined on a 2-D mesh (FSDP x TP, HSDP x TP),
# uneven shards; per mesh shape, (shape, placements) of each param.
def _strided(dim: int, split: int):
    from torch.distributed.tensor.placement_types import _StridedShard

    return _StridedShard(dim, split_factor=split)


def _layouts(mesh_shape: tuple[int, ...]) -> list[tuple[tuple[int, ...], list]]:
    if len(mesh_shape) == 1:
        return [((8, 3), [_strided(0, 2)]), ((7, 5), [_strided(1, 2)]), ((9, 4), [_strided(0, 3)]),
                ((6,), [Shard(0)]), ((), [Replicate()])]
    return [((8, 6), [_strided(0, 2), Shard(0)]),   # FSDP over row-wise TP (TorchTitan's 2-D)
            ((7, 6), [Shard(0), Shard(1)]),          # 2-D sharding, uneven rows
            ((5, 6), [_strided(1, 2), Shard(1)]),    # FSDP over column-wise TP
            ((10,), [Replicate(), Shard(0)]),        # HSDP-like: replicated, then sharded
            ((9, 2), [Shard(0), Replicate()]),       # sharded, then replicated (uneven)
            ((4, 4), [Replicate(), Replicate()])]


def dtensor_layouts(rank: int, world: int, opt_names: list[str], mesh_shapes: list[tuple[int, ...]]) -> None:
    for mesh_shape in mesh_shapes:
        mesh = init_device_mesh("cpu", mesh_shape)
        each(opt_names, lambda name: _dtensor_layouts(name, mesh, mesh_shape))


def _dtensor_layouts(opt_name: str, mesh, mesh_shape: tuple[int, ...]) -> None:
    layouts = _layouts(mesh_shape)
    dtype = torch.bfloat16 if opt_name.endswith("bf16") else torch.float32
    gen = torch.Generator().manual_seed(1)
    values = [torch.randn(shape, generator=gen).to(dtype) for shape, _ in layouts]
    ref_params = [nn.Parameter(v.clone()) for v in values]
    # (every rank holds the same values: each takes its own shard, no scatter)
    params = [nn.Parameter(distribute_tensor(v.clone(), mesh, pl, src_data_rank=None))
              for v, (_, pl) in zip(values, layouts)]
    for p, v in zip(params, values):  # (the layout is what it says: the shards make the whole)
        assert torch.equal(p.full_tensor(), v)
    opt = OPTIMIZERS[opt_name]([(f"p{i}", p) for i, p in enumerate(params)])
    ref = OPTIMIZERS[opt_name]([(f"p{i}", p) for i, p in enumerate(ref_params)])
    for k in range(4):
        for p, q, (_, pl) in zip(params, ref_params, layouts):
            g = torch.randn(q.shape, generator=gen).to(dtype)
            q.grad = g.clone()
            p.grad = distribute_tensor(g.clone(), mesh, pl, src_data_rank=None)
        set_lr(opt, k)
        set_lr(ref, k)
        opt.step()
        ref.step()
    assert_same_run(opt, ref, f"{opt_name} on mesh {mesh_shape}")


# ---- FSDP2 -------------------------------------------------------------------------------


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    # the last Linear has 1 output row: ranks > 0 hold empty shards of it
    return nn.Sequential(nn.Linear(6, 10), nn.LayerNorm(10), nn.Tanh(), nn.Linear(10, 7), nn.Tanh(), nn.Linear(7, 1))


def shard_model(model: nn.Module, mesh) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def batch(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + k)
    return torch.randn(16, 6, generator=gen), torch.randn(16, 1, generator=gen)


def train(model: nn.Module, opt: torch.optim.Optimizer, steps: range, step_fn=None) -> None:
    step_fn = step_fn or opt.step
    for k in steps:
        x, y = batch(k)
        nn.functional.mse_loss(model(x), y).backward()
        set_lr(opt, k)
        step_fn()
        opt.zero_grad()


def fsdp_exact(rank: int, world: int, opt_names: list[str], scaler_names: list[str] = ()) -> None:
    """FSDP2 with every rank on the same full batch: the averaged grads equal the
    whole model's, so the trajectories must agree. Then fsdp_grad_scaler for
    ``scaler_names`` (one process group: ranks start once)."""
    mesh = init_device_mesh("cpu", (world,))
    each(opt_names, lambda name: _fsdp_exact(name, mesh))
    each(scaler_names, lambda name: _fsdp_grad_scaler(name, mesh, rank))


def _fsdp_exact(opt_name: str, mesh) -> None:
    ref_model = make_model()
    model = shard_model(copy.deepcopy(ref_model), mesh)
    opt = OPTIMIZERS[opt_name](list(model.named_parameters()))
    ref = OPTIMIZERS[opt_name](list(ref_model.named_parameters()))
    train(model, opt, range(5))
    train(ref_model, ref, range(5))
    assert_same_run(opt, ref, f"FSDP2 {opt_name}")
    assert_sharded_like_params(opt)


def fsdp_gaps(rank: int, world: int, opt_names: list[str]) -> None:
    """FSDP2 with a frozen param group, a group without grads every other step and a
    step without any grad: the same run as the whole model's."""
    mesh = init_device_mesh("cpu", (world,))
    each(opt_names, lambda name: _fsdp_gaps(name, mesh))


def _fsdp_gaps(opt_name: str, mesh) -> None:
    ref_model = make_model()
    ref_model[3].requires_grad_(False)
    model = shard_model(copy.deepcopy(ref_model), mesh)

    def groups(m: nn.Module) -> list[dict[str, Any]]:
        named = dict(m.named_parameters())
        return [{"params": [(n, named[n]) for n in named if n.split(".")[0] in layers]}
                for layers in (("0", "1"), ("3",), ("5",))]

    opt, ref = OPTIMIZERS[opt_name](groups(model)), OPTIMIZERS[opt_name](groups(ref_model))
    for k in range(6):
        for m, o in ((model, opt), (ref_model, ref)):
            if k != 2:  # step 2: no grads at all
                x, y = batch(k)
                nn.functional.mse_loss(m(x), y).backward()
            if k % 2:  # the last layer's group without grads
                for p in m[5].parameters():
                    p.grad = None
            set_lr(o, k)
            o.step()
            o.zero_grad()
    assert_same_run(opt, ref, f"FSDP2 {opt_name} with frozen and gradless groups")
    assert all(p not in opt.state for p in model[3].parameters())


def fsdp_in_backward(rank: int, world: int, opt_names: list[str]) -> None:
    """step_in_backward under FSDP2: FSDP2 runs the hooks on the sharded params after each
    group's reduce-scatter; each group's params step as one batch (whatever bucket_bytes says),
    with one collective of partial norms, on every rank alike, and the run is the whole model's
    ordinary one. Then tensor-parallel params (_tp_in_backward), and DDP's plain params:
    refused before anything steps."""
    mesh = init_device_mesh("cpu", (world,))
    each(opt_names, lambda name: _fsdp_in_backward(name, mesh))
    each(opt_names, lambda name: _tp_in_backward(name, mesh))
    _fsdp_compiled_in_backward(mesh)
    model = nn.parallel.DistributedDataParallel(make_model())
    opt = Lamb(model.parameters(), lr=LRS[0])
    inductor_lamb.step_in_backward(opt)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batch(0)
    try:
        nn.functional.mse_loss(model(x), y).backward()
    except RuntimeError as e:
        assert "param 0 of Lamb's param group 0 is a plain tensor in a process group of 2 ranks: DDP averages " \
            "the grads" in str(e), e
    else:
        raise AssertionError("a step in the backward of DDP's params was not refused")
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters()))


def _in_backward_beside_ordinary(model: nn.Module, opt: Any, ref_model: nn.Module, ref: Any, steps: range,
                                 out: Callable[[nn.Module, torch.Tensor], torch.Tensor] = lambda m, x: m(x)) -> tuple:
    """Trains ``model`` with ``opt`` (stepping in the backward: the caller made its handle) beside
    ``ref_model`` with ``ref`` (ordinary steps), the lr set before each backward; returns the
    batches ``opt`` stepped and the collectives of partial norms they ran."""
    from inductor_lamb.optim import _sharding

    batches, collectives = [], []
    step_batch, combine = opt._step_batch, _sharding.combine
    opt._step_batch = lambda batch, **kw: (batches.append(batch), step_batch(batch, **kw))
    _sharding.combine = lambda *a, **kw: (collectives.append(1), combine(*a, **kw))[1]
    try:
        for k in steps:
            for m, o in ((model, opt), (ref_model, ref)):
                set_lr(o, k)  # (before the backward, which steps)
                x, y = batch(k)
                nn.functional.mse_loss(out(m, x), y).backward()
                o.step()
                o.zero_grad()
    finally:
        _sharding.combine = combine
        del opt._step_batch
    return batches, collectives


def _fsdp_in_backward(opt_name: str, mesh) -> None:
    ref_model = make_model()
    model = shard_model(copy.deepcopy(ref_model), mesh)
    opt = OPTIMIZERS[opt_name](list(model.named_parameters()))
    ref = OPTIMIZERS[opt_name](list(ref_model.named_parameters()))
    inductor_lamb.step_in_backward(opt, bucket_bytes=200)  # (smaller than a group: no matter under FSDP2)
    where = {id(p): (i, j) for i, g in enumerate(opt.param_groups) for j, p in enumerate(g["params"])}
    groups = sorted(sorted(where[id(p)] for p in layer.parameters())
                    for layer in model if any(True for _ in layer.parameters()))
    batches, collectives = _in_backward_beside_ordinary(model, opt, ref_model, ref, range(5))
    assert_same_run(opt, ref, f"FSDP2 {opt_name} stepping in the backward")
    assert all(p.grad is None for p in model.parameters())
    # one batch a fully_shard group and backward, its params all of that group's
    stepped = sorted(sorted((i, j) for i, places in b.items() for j in places) for b in batches)
    assert stepped == sorted(groups * 5), (stepped, groups)
    reductions = opt._layout.spec.reductions
    assert len(collectives) == (len(batches) if reductions else 0), (len(collectives), len(batches))


def _fsdp_compiled_in_backward(mesh) -> None:
    """FSDP2 with its forward compiled (torch.compile(model), the backward eager: TorchTitan's
    recipe) steps in the backward as eagerly; under compiled autograd, whose graph runs FSDP2's
    hooks eagerly right after each grad is made, the step in the backward is refused by name
    (FSDP2's hooks are not traceable into a full graph: torch marks them dynamo-disabled)."""
    ref_model = make_model()
    model = shard_model(copy.deepcopy(ref_model), mesh)
    opt, ref = Lamb(model.parameters(), lr=LRS[0]), Lamb(ref_model.parameters(), lr=LRS[0])
    compiled = torch.compile(model)
    with inductor_lamb.step_in_backward(opt):
        _in_backward_beside_ordinary(compiled, opt, ref_model, ref, range(3))
    assert_same_run(opt, ref, "FSDP2 with a compiled forward, stepping in the backward")

    def train_step(x: torch.Tensor, y: torch.Tensor) -> None:
        nn.functional.mse_loss(compiled(x), y).backward()

    before = [full(p).detach().clone() for p in model.parameters()]
    with inductor_lamb.step_in_backward(opt), torch._dynamo.config.patch(compiled_autograd=True):
        try:
            torch.compile(train_step)(*batch(3))
        except RuntimeError as e:
            assert "step_in_backward under compiled autograd needs its backward compiled with fullgraph=True" \
                in str(e), e
        else:
            raise AssertionError("FSDP2 stepping in a backward under compiled autograd was not refused")
    assert all(torch.equal(full(p), q) for p, q in zip(model.parameters(), before))
    torch._dynamo.reset()


def _tp_in_backward(opt_name: str, mesh) -> None:
    """Tensor-parallel DTensor params (their grads accumulated by autograd itself, a hook per
    param) batch by bucket_bytes, with one collective a batch; a plain param among them, in a
    process group of several ranks, is refused before anything steps."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


    torch.manual_seed(1)
    # (4 outputs, averaged: a Linear sharded by rows needs as many rows as ranks for its grad
    # to come back sharded like it)
    ref_model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 7), nn.Tanh(), nn.Linear(7, 4))
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel(), "4": ColwiseParallel(output_layouts=Replicate())}
    model = parallelize_module(copy.deepcopy(ref_model), mesh, plan)
    opt = OPTIMIZERS[opt_name](list(model.named_parameters()))
    ref = OPTIMIZERS[opt_name](list(ref_model.named_parameters()))
    handle = inductor_lamb.step_in_backward(opt, bucket_bytes=200)
    batches, collectives = _in_backward_beside_ordinary(model, opt, ref_model, ref, range(4),
                                                        lambda m, x: m(x).mean(-1, keepdim=True))
    assert_same_run(opt, ref, f"tensor-parallel {opt_name} stepping in the backward")
    assert 4 < len(batches) < 4 * len(list(model.parameters())), batches
    assert len(collectives) == (len(batches) if opt._layout.spec.reductions else 0), (len(collectives), batches)
    handle.remove()
    # A plain param whose grad is made last (its hook fires after the DTensor params'): refused
    # at the backward's first hook, before anything steps.
    scale = nn.Parameter(torch.ones(()))
    opt = OPTIMIZERS[opt_name]([("scale", scale)] + list(model.named_parameters()))
    inductor_lamb.step_in_backward(opt)
    before = [full(p).detach().clone() for p in model.parameters()]
    x, y = batch(0)
    try:
        nn.functional.mse_loss(model(x * scale).mean(-1, keepdim=True), y).backward()
    except RuntimeError as e:
        assert f"param 0 of {type(opt).__name__}'s param group 0 is a plain tensor in a process group of 2 " \
            "ranks" in str(e), e
    else:
        raise AssertionError("a plain param among DTensor params was not refused")
    assert all(torch.equal(full(p), q) for p, q in zip(model.parameters(), before))


# ---- bad input ----------------------------------------------------------------------------


def _expect_error(fn: Callable[[], Any], *needles: str) -> None:
    try:
        fn()
    except ValueError as e:
        for needle in needles:
            assert needle in str(e), f"{needle!r} not in {str(e)!r}"
        return
    raise AssertionError(f"no error; expected one naming {needles}")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def bad_input(rank: int, world: int) -> None:
    mesh = init_device_mesh("cpu", (world,))
    mesh2d = init_device_mesh("cpu", (world, 1))
    gen = torch.Generator().manual_seed(0)

    def sharded(shape, mesh=mesh, pl=(Shard(0),)):
        return nn.Parameter(distribute_tensor(torch.randn(shape, generator=gen), mesh, list(pl)))

    def check(params: list, needles: tuple[str, ...], prepare=None) -> None:
        for p in params:
            if p.grad is None:
                p.grad = distribute_tensor(torch.randn(p.shape, generator=gen), p.device_mesh, list(p.placements)) \
                    if isinstance(p, DTensor) else torch.randn(p.shape, generator=gen)
        for opt_name in ("lamb", "lamb16", "lars", "adagrad", "novograd"):
            opt = OPTIMIZERS[opt_name]([(f"layer{i}.weight", p) for i, p in enumerate(params)])
            if prepare:
                prepare(opt)
            before = [full(t).clone() for p in params for t in (p, *opt.state[p].values())
                      if isinstance(t, torch.Tensor)]
            _expect_error(opt.step, *needles)
            after = [full(t) for p in params for t in (p, *opt.state[p].values()) if isinstance(t, torch.Tensor)]
            assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(before, after)), \
                "a tensor changed"

    a = sharded((6, 3))
    partial = nn.Parameter(DTensor.from_local(torch.randn(4, 3, generator=gen), mesh, [Partial()]))
    check([a, partial], ("'layer1.weight'", "Partial"))
    check([sharded((5, 2)), sharded((4, 4), mesh2d, (Shard(0), Replicate()))], ("'layer1.weight'", "mesh"))
    b = sharded((6, 2))
    b.grad = distribute_tensor(torch.randn(6, 2, generator=gen), mesh, [Replicate()])
    check([sharded((3, 3)), b], ("grad of param 'layer1.weight'", "sharded alike"))
    c = sharded((6, 2))

    def replicate_state(opt):
        key = next(k for k, v in opt.state[c].items() if v.dim() > 0)
        opt.state[c][key] = DTensor.from_local(full(opt.state[c][key]), mesh, [Replicate()])

    check([sharded((3, 3)), c], ("of param 'layer1.weight'", "sharded alike"), replicate_state)
    d = sharded((6, 2))
    d.grad = torch.randn(d.shape, generator=gen)
    check([d], ("grad of param 'layer0.weight'", "plain tensor"))

    try:
        inductor_lamb.fuse_optimizer(torch.optim.SGD([sharded((4, 3))], lr=0.1))
    except RuntimeError as e:
        assert "parameter 0 is a DTensor" in str(e), str(e)
    else:
        raise AssertionError("fuse_optimizer accepted a DTensor param")


def assert_sharded_like_params(opt: torch.optim.Optimizer) -> None:
    """State tensors are DTensors laid out like their params; per-tensor scalars
    (step, LAMB16's scales) are plain 0-d tensors, equal on every rank."""
    for group in opt.param_groups:
        for p in group["params"]:
            for key, v in opt.state[p].items():
                if v.dim() == 0 and not isinstance(v, DTensor):
                    continue
                assert isinstance(v, DTensor), f"state {key} is not a DTensor"
                assert v.device_mesh == p.device_mesh and v.placements == p.placements, f"state {key}: {v.placements}"


# ---- checkpoints (torch.distributed.checkpoint) ---------------------------------------------


def dcp_save(rank: int, world: int, opt_names: list[str], path: str, in_backward: bool = False) -> None:
    each(opt_names, lambda name: _dcp_save(name, world, os.path.join(path, name), in_backward))


def _train_maybe_in_backward(model: nn.Module, opt: torch.optim.Optimizer, steps: range, in_backward: bool) -> None:
    """``train``, or with the steps inside the backward (step_in_backward): each step's lr set
    before its backward, which steps (the same lr a step of ``train`` reads)."""
    if not in_backward:
        train(model, opt, steps)
        return
    with inductor_lamb.step_in_backward(opt):
        for k in steps:
            set_lr(opt, k)
            x, y = batch(k)
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()


def _dcp_save(opt_name: str, world: int, path: str, in_backward: bool = False) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = shard_model(make_model(), init_device_mesh("cpu", (world,)))
    opt = OPTIMIZERS[opt_name](list(model.named_parameters()))
    _train_maybe_in_backward(model, opt, range(3), in_backward)
    assert_sharded_like_params(opt)
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)


def dcp_resume(rank: int, world: int, opt_names: list[str], path: str, in_backward: bool = False) -> None:
    """Loads dcp_save's checkpoint (any world size) into a differently initialized
    model and continues: the run must equal an uninterrupted whole-model run."""
    each(opt_names, lambda name: _dcp_resume(name, world, os.path.join(path, name), in_backward))


def _dcp_resume(opt_name: str, world: int, path: str, in_backward: bool = False) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = shard_model(make_model(seed=1), init_device_mesh("cpu", (world,)))
    opt = OPTIMIZERS[opt_name](list(model.named_parameters()))
    model_sd, optim_sd = get_state_dict(model, opt)
    sd = {"model": model_sd, "optim": optim_sd}
    dcp.load(sd, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    assert_sharded_like_params(opt)
    _train_maybe_in_backward(model, opt, range(3, 5), in_backward)
    ref_model = make_model()
    ref = OPTIMIZERS[opt_name](list(ref_model.named_parameters()))
    train(ref_model, ref, range(5))
    assert_same_run(opt, ref, f"{opt_name} resumed at world size {world}")


# ---- compiled -------------------------------------------------------------------------------


def fsdp_compiled(rank: int, world: int, opt_names: list[str], code_dir: str, path: str) -> None:
    """torch.compile(opt.step) under FSDP2, on compile path ``path``, compiles once and
    matches the eager sharded step; rank 0 writes each step's generated code to
    ``code_dir/<name>.py``."""
    inductor_lamb.set_compile_path(path)
    mesh = init_device_mesh("cpu", (world,))
    each(opt_names, lambda name: _fsdp_compiled(name, mesh, rank, os.path.join(code_dir, f"{name}.py")))


def _fsdp_compiled(opt_name: str, mesh, rank: int, code_path: str) -> None:
    from torch._dynamo.utils import counters
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    counters.clear()
    model = shard_model(make_model(), mesh)
    eager_model = shard_model(make_model(), mesh)
    opt = OPTIMIZERS[opt_name](list(model.named_parameters()))
    eager = OPTIMIZERS[opt_name](list(eager_model.named_parameters()))
    step = torch.compile(opt.step)
    codes: list[str] = []

    def step_keeping_code():
        if codes:
            step()
        else:
            codes.extend(run_and_get_code(step)[1])

    train(model, opt, range(5), step_keeping_code)
    train(eager_model, eager, range(5))
    assert_same_run(opt, eager, f"compiled {opt_name}")
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    if rank == 0:
        with open(code_path, "w") as f:
            f.write("\n".join(codes))


# ---- GradScaler --------------------------------------------------------------------------


def _fsdp_grad_scaler(opt_name: str, mesh, rank: int) -> None:
    ref_model = make_model()
    model = shard_model(copy.deepcopy(ref_model), mesh)
    runs = []
    for m in (model, ref_model):
        opt = OPTIMIZERS[opt_name](list(m.named_parameters()))
        runs.append((m, opt, torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2)))
    for k in range(5):
        x, y = batch(k)
        for m, opt, scaler in runs:
            scaler.scale(nn.functional.mse_loss(m(x), y)).backward()
            if k == 2:  # an inf in the last rank's shard of the first weight (the whole grad for the reference)
                g = m[0].weight.grad
                local = g.to_local() if isinstance(g, DTensor) else g
                if not isinstance(g, DTensor) or rank == mesh.size() - 1:
                    local.view(-1)[-1] = float("inf")
            set_lr(opt, k)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    (_, opt, scaler), (_, ref, ref_scaler) = runs
    assert scaler.get_scale() == ref_scaler.get_scale(), (scaler.get_scale(), ref_scaler.get_scale())
    assert_same_run(opt, ref, f"GradScaler {opt_name}")


# ---- DDP and ZeroRedundancyOptimizer (whole params on each rank) ---------------------------


def ddp_and_zero(rank: int, world: int, opt_names: list[str]) -> None:
    """Each rank trains on its slice of the batch; DDP averages the grads, so the run
    equals one process on the whole batch. ZeRO steps each param on one rank."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    def check(opt_name: str) -> None:
        ref_model = make_model()
        ref = OPTIMIZERS[opt_name](list(ref_model.named_parameters()))
        ddp_model = DDP(copy.deepcopy(ref_model))
        ddp_opt = OPTIMIZERS[opt_name](list(ddp_model.module.named_parameters()))
        zero_model = DDP(copy.deepcopy(ref_model))
        factory = OPTIMIZERS[opt_name]
        probe = factory([("w", nn.Parameter(torch.zeros(1)))])  # (ZeRO takes a class and its defaults)
        defaults = {k: v for k, v in probe.defaults.items() if k not in ("params", "param_names")}
        zero = ZeroRedundancyOptimizer(zero_model.parameters(), optimizer_class=type(probe),
                                       **{**defaults, "lr": LRS[0]})
        for k in range(5):
            x, y = batch(k)
            part = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
            for model, opt in ((ddp_model, ddp_opt), (zero_model, zero)):
                nn.functional.mse_loss(model(x[part]), y[part]).backward()
                set_lr(opt, k)
                opt.step()
                opt.zero_grad()
            nn.functional.mse_loss(ref_model(x), y).backward()
            set_lr(ref, k)
            ref.step()
            ref.zero_grad()
        assert_same_run(ddp_opt, ref, f"DDP {opt_name}")
        if opt_name.endswith("clip"):
            return  # (each ZeRO rank steps its own params: a group's global grad norm would be partial)
        for p, q in zip(zero_model.module.parameters(), ref_model.parameters()):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-6, msg=lambda m: f"ZeRO: {m}")

    each(opt_names, check)
