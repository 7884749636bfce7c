"""What the ranks of tests/test_deepspeed.py run (``conftest.spawn``): real DeepSpeed engines (ZeRO stages 1-3,
CPU, gloo on a localhost file store), each rank comparing the model it trained with the same
model trained unsharded by the same optimizer in the same process (every rank on the same
batches: DeepSpeed's averaged grads are then the unsharded ones)."""

from __future__ import annotations

import copy
import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from inductor_lamb import Adagrad, Lamb, Lamb16, Lars, NovoGrad

LRS = [1e-2, 8e-3, 1.2e-2, 5e-3, 9e-3, 7e-3]

OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "lamb": lambda ps: Lamb(ps, lr=LRS[0], weight_decay=0.01),
    "lamb_clip": lambda ps: Lamb(ps, lr=LRS[0], weight_decay=0.01, max_grad_norm=0.5),  # its own global clip
    "lamb16": lambda ps: Lamb16(ps, lr=LRS[0], weight_decay=0.01),
    "lars": lambda ps: Lars(ps, lr=LRS[0], weight_decay=1e-3, exclude_from_weight_decay=["bias"],
                            exclude_from_layer_adaptation=["norm"]),
    "adagrad": lambda ps: Adagrad(ps, lr=LRS[0], weight_decay=1e-3),
    "novograd": lambda ps: NovoGrad(ps, lr=LRS[0], weight_decay=1e-3, grad_averaging=True),
}


def setup_rank() -> None:
    """Run by ``conftest.spawn`` on every rank before its case."""
    import deepspeed.ops

    # DeepSpeed's shared-memory all-reduce serves inference only; unbuilt, it would be compiled
    # (a minute or two) by the first engine. Without it DeepSpeed uses torch.distributed.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


class Net(nn.Module):
    """Small layers of mixed sizes: ZeRO's partitions cut tensors apart, most tensors lie on
    one rank only, and the 1-element bias (a param group of its own below) leaves the other
    ranks with no piece of that group at all."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(6, 10)
        self.norm = nn.LayerNorm(10)
        self.hidden = nn.Linear(10, 7)
        self.out = nn.Linear(7, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(torch.tanh(self.norm(self.inp(x))))))


def make_net(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return Net().to(dtype)


def param_groups(model: nn.Module) -> list[dict[str, Any]]:
    """Three groups with their own hyper-parameters: weights; biases and LayerNorm without
    decay; the output bias alone (one element: ranks past the first hold none of it)."""
    named = list(model.named_parameters())
    weights = [(n, p) for n, p in named if n.endswith("weight") and "norm" not in n]
    last = [(n, p) for n, p in named if n == "out.bias"]
    rest = [(n, p) for n, p in named if (n, p) not in weights and (n, p) not in last]
    return [{"params": [p for _, p in g], "param_names": [n for n, _ in g], **extra}
            for g, extra in ((weights, {}), (rest, {"weight_decay": 0.0}), (last, {"lr": LRS[1]}))]


def batch(k: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + k)
    return torch.randn(16, 6, generator=gen).to(dtype), torch.randn(16, 1, generator=gen).to(dtype)


def config(stage: int, **extra: Any) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    zero.update(extra.pop("zero", {}))
    return {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 9,
            "zero_optimization": zero, "zero_allow_untested_optimizer": True, "gradient_clipping": 0.0,
            "wall_clock_breakdown": False, **extra}


def lr_lambda(k: int) -> float:
    return LRS[k % len(LRS)] / LRS[0]


def engine_for(opt_name: str, cfg: dict[str, Any], dtype: torch.dtype = torch.float32, scheduler: bool = True):
    import deepspeed

    model = make_net(dtype)
    opt = OPTIMIZERS[opt_name](param_groups(model))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda) if scheduler else None
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=cfg,
                                           dist_init_required=False)
    return engine, opt


def train_engine(engine, steps: range, accumulate: int = 1, dtype: torch.dtype = torch.float32) -> None:
    for k in steps:
        for j in range(accumulate):
            x, y = batch(accumulate * k + j, dtype)
            engine.backward(nn.functional.mse_loss(engine(x).float(), y.float()))
            engine.step()


def train_reference(model: nn.Module, opt: torch.optim.Optimizer, steps: range, accumulate: int = 1,
                    clip: float = 0.0, dtype: torch.dtype = torch.float32) -> None:
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    for k in steps:
        for j in range(accumulate):
            x, y = batch(accumulate * k + j, dtype)
            (nn.functional.mse_loss(model(x).float(), y.float()) / accumulate).backward()
        if clip > 0:  # DeepSpeed's clip: grads / max(1, ||grads|| / clip)
            grads = [p.grad for p in model.parameters()]
            norm = torch.stack([g.double().norm() for g in grads]).norm()
            factor = max(1.0, float(norm) / clip)
            for g in grads:
                g.div_(factor)
        opt.step()
        sched.step()
        opt.zero_grad()


def fp32_params(engine) -> list[torch.Tensor]:
    """The trained model's float32 params (ZeRO's master copies), whole, on every rank."""
    from deepspeed.utils import safe_get_full_fp32_param

    return [safe_get_full_fp32_param(p).detach().clone() for p in engine.module.parameters()]


def assert_close_to(got: list[torch.Tensor], ref: nn.Module, what: str, rtol: float) -> None:
    for (name, q), p in zip(ref.named_parameters(), got):
        torch.testing.assert_close(p.float(), q.detach().float(), rtol=rtol, atol=rtol,
                                   msg=lambda m: f"{what}: {name}: {m}")


def _check(opt_name: str, stage: int, what: str, rtol: float = 1e-6, dtype: torch.dtype = torch.float32,
           accumulate: int = 1, clip: float = 0.0, **cfg: Any) -> None:
    engine, opt = engine_for(opt_name, config(stage, gradient_accumulation_steps=accumulate,
                                              gradient_clipping=clip, **cfg), dtype)
    ref_model = make_net(dtype)
    ref = OPTIMIZERS[opt_name](param_groups(ref_model))
    if dtype != torch.float32:  # (the reference keeps float32 master copies, as ZeRO does)
        for g in ref.param_groups:
            g["master_weights"] = True
    train_engine(engine, range(6), accumulate, dtype)
    train_reference(ref_model, ref, range(6), accumulate, clip, dtype)
    got = fp32_params(engine)
    if dtype != torch.float32:
        ref_master = make_net(torch.float32)
        with torch.no_grad():
            for q, p in zip(ref_master.parameters(), ref_model.parameters()):
                q.copy_(ref.state[p]["master_param"])
        ref_model = ref_master
    assert_close_to(got, ref_model, f"ZeRO-{stage} {opt_name} {what}", rtol)
    # the state made at construction for the model's own tensors is released
    assert not any(p in opt.state for p in engine.module.parameters()), "model params kept their state"


def exact(rank: int, world: int, opt_names: list[str], stages: list[int]) -> None:
    """float32, three param groups, a scheduler: every stage against the unsharded run."""
    for stage in stages:
        for name in opt_names:
            _check(name, stage, "float32")


def features(rank: int, world: int, opt_names: list[str]) -> None:
    """Gradient accumulation, DeepSpeed's gradient clipping, ZeRO-Offload, and DeepSpeed's
    bf16 mode (float32 master partitions) against the unsharded run."""
    for name in opt_names:
        _check(name, 2, "accumulating 2 micro-batches", accumulate=2)
        _check(name, 1, "clipping at 0.05", clip=0.05)
        _check(name, 3, "clipping at 0.05", clip=0.05)
        _check(name, 2, "offloaded", zero={"offload_optimizer": {"device": "cpu"}}, zero_force_ds_cpu_optimizer=False)
        _check(name, 3, "offloaded", zero={"offload_optimizer": {"device": "cpu"}}, zero_force_ds_cpu_optimizer=False)
        _check(name, 2, "bf16", rtol=1e-5, dtype=torch.bfloat16, bf16={"enabled": True})
        _check(name, 1, "bf16", rtol=1e-5, dtype=torch.bfloat16, bf16={"enabled": True})  # (DeepSpeed's BF16_Optimizer)


def checkpoint(rank: int, world: int, opt_names: list[str], stages: list[int], path: str) -> None:
    """``save_checkpoint`` after 3 steps, ``load_checkpoint`` into a new engine: the next 3
    steps are bit for bit those of the engine that went on."""
    for stage in stages:
        for name in opt_names:
            engine, _ = engine_for(name, config(stage))
            train_engine(engine, range(3))
            tag = f"{name}-{stage}"
            engine.save_checkpoint(path, tag=tag)
            train_engine(engine, range(3, 6))
            went_on = fp32_params(engine)
            resumed, _ = engine_for(name, config(stage))
            resumed.load_checkpoint(path, tag=tag)
            train_engine(resumed, range(3, 6))
            for i, (a, b) in enumerate(zip(fp32_params(resumed), went_on)):
                assert torch.equal(a, b), f"ZeRO-{stage} {name}: param {i} differs after resuming"


def same_engine(rank: int, world: int, opt_names: list[str], stages: list[int], path: str) -> None:
    """Steps after a checkpoint loaded into the same engine, and after state tensors replaced
    by copies under the same groups a step later, are bit for bit those the engine took the
    first time, and step the copies (nothing from an earlier step may be reused). A partition's
    grad that DeepSpeed frees after the step is freed (no view of it is kept)."""
    checked = 0
    for stage in stages:
        for name in opt_names:
            engine, opt = engine_for(name, config(stage))
            stepped: list[weakref.ref[torch.Tensor]] = []
            step = opt.step

            def spy(*args: Any, step: Any = step, **kwargs: Any) -> Any:
                stepped.extend(weakref.ref(p.grad) for g in opt.param_groups for p in g["params"] if p.grad is not None)
                return step(*args, **kwargs)

            opt.step = spy  # type: ignore[method-assign]
            train_engine(engine, range(3))
            tag = f"same-{name}-{stage}"
            engine.save_checkpoint(path, tag=tag)
            train_engine(engine, range(3, 6))
            first, first_state = fp32_params(engine), copy.deepcopy(opt.state_dict()["state"])
            engine.load_checkpoint(path, tag=tag)
            train_engine(engine, range(3, 4))
            # (new state tensors under the same groups, as code that moves or copies state makes)
            for g in opt.param_groups:
                for p in g["params"]:
                    opt.state[p] = copy.deepcopy(opt.state[p])
            train_engine(engine, range(4, 6))
            for i, (a, b) in enumerate(zip(fp32_params(engine), first)):
                assert torch.equal(a, b), f"ZeRO-{stage} {name}: param {i} differs after loading into the same engine"
            for k, state in opt.state_dict()["state"].items():
                for key, t in state.items():
                    assert torch.equal(t, first_state[k][key]), f"ZeRO-{stage} {name}: state {k} {key} was not stepped"
            gc.collect()
            if stepped and all(p.grad is None for g in opt.param_groups for p in g["params"]):
                # (DeepSpeed dropped its grads after the step: nothing may keep them)
                assert all(r() is None for r in stepped), f"ZeRO-{stage} {name}: a freed grad partition is kept"
                checked += 1
    assert checked, "DeepSpeed kept every grad: the check that none is kept never ran"


def refusals(rank: int, world: int) -> None:
    """What a layer-wise optimizer cannot map, it refuses, naming what to do."""
    flat = torch.zeros(12, requires_grad=True)
    flat.grad = torch.ones(12)
    model = make_net()
    opt = Lamb(model.parameters())
    opt.param_groups[0]["params"] = [flat]  # an engine's flat partition, from no engine it knows
    for g in opt.param_groups[1:]:
        g["params"] = []
    try:
        opt.step()
    except RuntimeError as e:
        assert "not one of the params it was built with" in str(e) and "DeepSpeed ZeRO" in str(e), e
    else:
        raise AssertionError("a flat tensor of no known engine was stepped per partition")
    opt = Adagrad(model.parameters())  # element-wise: any layout is exact
    opt.param_groups[0]["params"] = [flat]
    opt.step()


# DeepSpeed's own LR schedulers (config "scheduler"), one per stage below
_SCHEDULERS = {
    1: {"type": "WarmupDecayLR", "params": {"warmup_max_lr": LRS[0], "warmup_num_steps": 1, "total_num_steps": 4}},
    2: {"type": "OneCycle", "params": {"cycle_min_lr": LRS[3], "cycle_max_lr": LRS[0], "cycle_first_step_size": 2,
                                       "cycle_momentum": True}},
    3: {"type": "WarmupLR", "params": {"warmup_max_lr": LRS[0], "warmup_num_steps": 2}},
}


def group_keys(rank: int, world: int, ours: list[str]) -> None:
    """The param-group keys DeepSpeed's ZeRO optimizers (stages 1-3) and its own LR schedulers
    add to a torch optimizer's groups, learned by training with each: none is a key of ours."""
    import deepspeed

    for stage, scheduler in _SCHEDULERS.items():
        model = make_net()
        opt = torch.optim.AdamW(param_groups(model), lr=LRS[0])
        before = {k for g in opt.param_groups for k in g}
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config(stage, scheduler=scheduler),
                                               dist_init_required=False)
        train_engine(engine, range(3))
        written = {k for g in opt.param_groups for k in g} - before
        assert not written & set(ours), f"ZeRO stage {stage}, {scheduler['type']}: {sorted(written & set(ours))}"
