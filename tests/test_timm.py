"""timm builds this package's optimizers by name (inductor_lamb.integrations.timm) with its
conventions, and where the equations agree they train a small timm model like timm's own
``lamb`` and ``lars``. timm imports torchvision: CI's torch 2.14.1 leg, where it installs."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

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

    names = timm.optim.list_optimizers()
    for name, cls in {"inductorlamb": inductor_lamb.Lamb, "inductorlambc": inductor_lamb.Lamb,
                      "inductorlamb16": inductor_lamb.Lamb16, "inductorlars": inductor_lamb.Lars,
                      "inductoradagrad": inductor_lamb.Adagrad}.items():
        assert name in names
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
    a, b = twins(timm)
    train(a, timm.optim.create_optimizer_v2(a, ours, **kwargs))
    train(b, timm.optim.create_optimizer_v2(b, theirs, **kwargs))
    assert_models_close(a, b, rtol=2e-5)


def test_fusedlamb_drop_in(timm):
    import inductor_lamb
    from inductor_lamb.integrations import timm as il_timm

    registry = timm.optim._optim_factory.OptimizerRegistry()
    il_timm.register(registry, fusedlamb=True)
    model, _ = twins(timm)
    opt = registry.create_optimizer(model, "fusedlamb", lr=1e-3, weight_decay=0.01)
    assert type(opt) is inductor_lamb.Lamb and opt.param_groups[0]["max_grad_norm"] == 1.0
    train(model, opt, steps=1)
