"""timm builds this package's optimizers by name (inductor_lamb.integrations.timm) with its
conventions, and where the equations agree they train a small timm model like timm's own
``lamb`` and ``lars``. timm imports torchvision: CI's newest-release step, where it installs."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from conftest import keys_written, our_group_keys, torch_optim_group_keys

pytestmark = pytest.mark.skipif(importlib.util.find_spec("timm") is None or importlib.util.find_spec("torchvision") is None,
                                reason="needs timm and torchvision")


@pytest.fixture(scope="module")
def timm():
    import timm

    from inductor_lamb.integrations import timm as il_timm

    il_timm.register()
    return timm


def twins(timm, seed=0):
    torch.manual_seed(seed)
    model = timm.create_model("test_resnet", num_classes=5)
    return model, copy.deepcopy(model)


def train(model, opt, steps=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        x, y = torch.randn(4, 3, 64, 64, generator=g), torch.randint(0, 5, (4,), generator=g)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def assert_models_close(a, b, rtol):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert ((p - q).norm() / q.norm().clamp_min(1e-12)).item() <= rtol, name


def test_registered_names_build_the_package_optimizers(timm):
    import inductor_lamb
    from inductor_lamb.integrations import timm as il_timm

    names = timm.optim.list_optimizers()
    for name, cls in {"inductorlamb": il_timm.TimmLamb, "inductorlambc": il_timm.TimmLamb,
                      "inductorlamb16": il_timm.TimmLamb16, "inductorlars": il_timm.TimmLars,
                      "inductoradagrad": il_timm.TimmAdagrad, "inductornovograd": il_timm.TimmNovoGrad}.items():
        assert name in names
        # timm's API promises classes: get_optimizer_class, get_optimizer_info().opt_class
        assert timm.optim.get_optimizer_class(name, bind_defaults=False) is cls
        assert timm.optim.get_optimizer_info(name).opt_class is cls
        assert issubclass(cls, (inductor_lamb.Lamb, inductor_lamb.Lamb16, inductor_lamb.Lars, inductor_lamb.Adagrad,
                                inductor_lamb.NovoGrad))
        model, _ = twins(timm)
        opt = timm.optim.create_optimizer_v2(model, name, lr=1e-3, weight_decay=0.05, foreach=True)
        assert type(opt) is cls
        # timm's convention: no weight decay on one-dimensional params (biases, norm weights)
        decays = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
        assert all(decays[id(p)] == (0.0 if p.ndim <= 1 else 0.05) for p in model.parameters())
        train(model, opt, steps=2)
        assert all(torch.isfinite(p).all() for p in model.parameters())
    model, _ = twins(timm)
    assert timm.optim.create_optimizer_v2(model, "inductorlambc", lr=1e-3).param_groups[0]["trust_clip"] is True
    with pytest.raises(ValueError, match="no 'caution' option"):
        timm.optim.create_optimizer_v2(model, "inductorlamb", lr=1e-3, caution=True)


def test_layer_decay_groups(timm):
    model, _ = twins(timm)
    opt = timm.optim.create_optimizer_v2(model, "inductorlamb", lr=1e-3, weight_decay=0.05, layer_decay=0.7)
    scales = {g["lr_scale"] for g in opt.param_groups}
    assert len(scales) > 2 and max(scales) == 1.0  # (timm's schedulers multiply each group's lr by it)
    train(model, opt, steps=1)


@pytest.mark.parametrize("ours, theirs, kwargs", [
    ("inductorlamb", "lamb", dict(lr=2e-3, weight_decay=0.05, max_grad_norm=None)),
    ("inductorlambc", "lambc", dict(lr=2e-3, weight_decay=0.05, max_grad_norm=None)),
    ("inductorlars", "lars", dict(lr=0.1, weight_decay=1e-4, eps=1e-8, trust_coeff=0.001)),
])
def test_trains_like_timms_own(timm, ours, theirs, kwargs):
    """A timm ResNet's first steps. (Its batch norms amplify a one-ulp difference of a step,
    LARS's ``p - lr v`` contracted to one FMA here and two roundings in timm's, a thousandfold
    within 4 steps: the bound allows that, a wrong equation moves by far more.)"""
    a, b = twins(timm)
    train(a, timm.optim.create_optimizer_v2(a, ours, **kwargs))
    train(b, timm.optim.create_optimizer_v2(b, theirs, **kwargs))
    if "lamb" in ours:
        assert_models_close(a, b, rtol=2e-5)
    else:  # (over the whole model: the norm of a near-zero bias makes a per-tensor ratio meaningless)
        diff = torch.cat([(p - q).flatten() for p, q in zip(a.parameters(), b.parameters())]).norm()
        assert (diff / torch.cat([q.flatten() for q in b.parameters()]).norm()).item() <= 1e-5


@pytest.mark.parametrize("ours, theirs, kwargs", [
    ("inductorlamb", "lamb", {}),  # timm's defaults: clipping by the norm of every group's grads at 1.0
    ("inductorlamb", "lamb", dict(betas=(0.8, 0.99), always_adapt=True, grad_averaging=False)),
    ("inductorlambc", "lambc", dict(max_grad_norm=None)),
    ("inductorlars", "lars", {}),  # timm's defaults: momentum 0.9 (the factory's), no decay, lr 1
    ("inductorlars", "lars", dict(momentum=0.8, weight_decay=1e-3, trust_coeff=0.01)),
    ("inductoradagrad", "adagrad", dict(lr_decay=0.01)),
    ("inductorlamb", "lamb", dict(decoupled_decay=True, weight_decay=0.05)),  # (timm's lambw)
    ("inductorlamb", "lamb", dict(decoupled_decay=True, corrected_weight_decay=True, weight_decay=0.05)),
    ("inductornovograd", "novograd", {}),
    ("inductornovograd", "novograd", dict(amsgrad=True, grad_averaging=True, betas=(0.9, 0.99))),
    ("inductornovograd", "novograd", dict(decoupled_decay=True, weight_decay=0.05)),  # (timm's novogradw)
    ("inductornovograd", "novograd", dict(decoupled_decay=True, corrected_weight_decay=True, weight_decay=0.05)),
], ids=lambda x: x if isinstance(x, str) else "-".join(f"{k}={v}" for k, v in x.items()) or "defaults")
def test_each_name_steps_like_its_twin(timm, ours, theirs, kwargs):
    """Each name against its timm twin with the same arguments (timm's groups: no decay on
    one-dimensional params), step by step over 300 steps, with a scheduler: the same params to
    float32 rounding at every step (1e-4 of each tensor's norm), including steps at lr 0 (LARS
    moves nothing there)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    twin = copy.deepcopy(model)
    lr = 0.5 if "lars" in ours else 0.05
    kwargs = {"weight_decay": 0.01, **kwargs}
    opts = [timm.optim.create_optimizer_v2(m, name, lr=lr, **kwargs) for m, name in ((model, ours), (twin, theirs))]
    for opt in opts:
        assert len(opt.param_groups) == 2  # (decay and no decay)
    gen = torch.Generator().manual_seed(1)
    target = torch.nn.Linear(16, 4)
    for step in range(300):
        x = torch.randn(64, 16, generator=gen)
        y = target(x).detach()
        scale = 0.0 if 100 <= step < 110 else 0.5 * (1 + torch.cos(torch.tensor(step / 300 * 3.14159)).item())
        for m, opt in ((model, opts[0]), (twin, opts[1])):
            for group in opt.param_groups:
                group["lr"] = lr * scale
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            # (relative in norm: an element whose grad nearly cancels its decay rounds apart)
            assert ((p - q).norm() / q.norm()).item() <= 1e-4, f"step {step}, {name}"


def test_fusedlamb_drop_in(timm):
    from inductor_lamb.integrations import timm as il_timm

    registry = timm.optim._optim_factory.OptimizerRegistry()
    il_timm.register(registry, fusedlamb=True)
    model, _ = twins(timm)
    opt = registry.create_optimizer(model, "fusedlamb", lr=1e-3, weight_decay=0.01)
    assert type(opt) is il_timm.TimmLamb and opt.defaults["max_grad_norm"] == 1.0
    train(model, opt, steps=1)


def test_no_group_key_collides_with_what_timm_writes(timm):
    """The param-group keys timm's schedulers (every kind its factory builds, stepped per epoch and
    per update) and its optimizer factory's layer-decay groups add to a torch optimizer's groups,
    learned by running each: none is a key of ours (torch.optim's own keys mean the same)."""
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2

    written = {}
    for kind in ("cosine", "tanh", "step", "multistep", "plateau", "poly", "wsd", "constant"):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.randn(3))], lr=0.1, momentum=0.9)

        def run():
            sched, _ = create_scheduler_v2(opt, kind, num_epochs=4, warmup_epochs=1, noise=(1, 3), decay_epochs=2,
                                           decay_milestones=[1, 2])
            for epoch in range(4):
                opt.step()
                sched.step_update(num_updates=epoch * 2 + 1, metric=1.0)
                sched.step(epoch + 1, metric=1.0)

        written[kind] = keys_written(opt, run)
    model, _ = twins(timm)
    opt = create_optimizer_v2(model, "sgd", lr=0.1, layer_decay=0.7)
    written["layer_decay"] = {k for g in opt.param_groups for k in g} - torch_optim_group_keys()
    assert "initial_lr" in written["cosine"] and "lr_scale" in written["layer_decay"]  # (what timm writes)
    ours = our_group_keys()
    assert {kind: keys & ours for kind, keys in written.items() if keys & ours} == {}, written
