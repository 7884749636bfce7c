"""The training runs behind the checkpoint-compatibility fixture
(``fixtures/make_checkpoints.py`` writes it with an old release,
``test_checkpoint_compat.py`` resumes it with the current code). Only the public
optimizer API is used, so old and new releases run the same code."""

from __future__ import annotations

import torch
from torch import nn

import inductor_lamb

# name: (optimizer class name, keyword arguments, param dtype, scheduler)
CASES = {
    "lamb": ("Lamb", dict(lr=0.02, weight_decay=0.01), torch.float32, "onecycle"),
    "lamb_bf16_master": ("Lamb", dict(lr=0.02, weight_decay=0.01, master_weights=True), torch.bfloat16, "step"),
    "lamb16": ("Lamb16", dict(lr=0.02, weight_decay=0.01), torch.float32, "onecycle"),
    "lars": ("Lars", dict(lr=0.5, momentum=0.9, weight_decay=1e-3,
                          exclude_from_weight_decay=["bias"]), torch.float32, "cyclic"),
    "adagrad": ("Adagrad", dict(lr=0.05, lr_decay=0.01), torch.float32, "step"),
}


def make_model(name: str):
    cls, kwargs, dtype, sched = CASES[name]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype)
    params = model.named_parameters() if cls == "Lars" else model.parameters()
    opt = getattr(inductor_lamb, cls)(params, **kwargs)
    if sched == "onecycle":
        s = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=10)
    elif sched == "cyclic":
        s = torch.optim.lr_scheduler.CyclicLR(opt, base_lr=0.1, max_lr=0.5, step_size_up=2,
                                              base_momentum=0.8, max_momentum=0.9)
    else:
        s = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, s


def run_steps(name: str, model, opt, sched, steps) -> None:
    dtype = CASES[name][2]
    for i in steps:
        gen = torch.Generator().manual_seed(100 + i)
        x = torch.randn(32, 12, generator=gen).to(dtype)
        y = torch.randn(32, 3, generator=gen).to(dtype)
        loss = nn.functional.mse_loss(model(x).float(), y.float())
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
