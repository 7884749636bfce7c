"""The training runs behind the timm ``Lamb`` checkpoint fixture
(``fixtures/make_timm_lamb.py`` writes it with timm, ``test_conformance.py``
resumes it with ``inductor_lamb.Lamb``). Both optimizers take the same groups."""

from __future__ import annotations

import torch
from torch import nn


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))


def _two_groups(model: nn.Module) -> list[dict]:
    return [{"params": list(model[0].parameters())},
            {"params": list(model[2].parameters()), "weight_decay": 0.0, "always_adapt": True, "trust_clip": True}]


# name: (param groups of the model, optimizer keyword arguments)
CASES = {
    "defaults": (lambda m: m.parameters(), dict(lr=0.02)),  # timm's defaults: max_grad_norm 1.0, wd 0.01
    "two_groups": (_two_groups, dict(lr=0.01, betas=(0.8, 0.99), max_grad_norm=None, weight_decay=0.05)),
}


def run_steps(model: nn.Module, opt: torch.optim.Optimizer, steps) -> None:
    for i in steps:
        gen = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(32, 12, generator=gen), torch.randn(32, 3, generator=gen)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
