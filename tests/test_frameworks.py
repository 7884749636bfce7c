"""The optimizers inside training frameworks: Lightning's Trainer with gradient
clipping under mixed precision (fit, checkpoint, resume), LightningCLI building them by class
path, and HF Trainer's max_grad_norm. Each runs when its framework is installed."""

from __future__ import annotations

import copy
import importlib
import importlib.util

import pytest
import torch
from conftest import STEP_OPTIMIZERS, keys_written, our_group_keys
from torch import nn

import inductor_lamb

OPTIMIZERS = {name: kwargs for name, (_, kwargs) in STEP_OPTIMIZERS.items()}


def _lightning():
    for name in ("lightning.pytorch", "pytorch_lightning"):
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            return importlib.import_module(name)
    pytest.skip("needs lightning (pip install lightning)")


def _module(pl, name):
    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

        def training_step(self, batch, _):
            x, y = batch
            return nn.functional.mse_loss(self.net(x).float(), y)

        def configure_optimizers(self):
            opt = getattr(inductor_lamb, name)(self.parameters(), **OPTIMIZERS[name])
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)}

    return Regression()


def _data():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=gen)
    y = x.sum(1, keepdim=True).sin()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)  # 4 steps an epoch


def _trainer(pl, root, steps, precision):
    return pl.Trainer(max_steps=steps, precision=precision, gradient_clip_val=0.5, accelerator="cpu", devices=1,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=root)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "32-true"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_lightning_clipping_checkpoint_and_resume(name, precision, tmp_path):
    """Trainer(gradient_clip_val=...) accepts the optimizer (Lightning refuses to clip
    for optimizers that unscale inside step); a run checkpointed at step 4 resumes
    with the optimizer state it saved and trains on to step 8."""
    pl = _lightning()
    first = _module(pl, name)
    trainer = _trainer(pl, tmp_path, 4, precision)
    trainer.fit(first, _data())
    ckpt = tmp_path / "half.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = trainer.optimizers[0].state_dict()
    seen = {}

    class Capture(pl.Callback):
        def on_train_start(self, trainer, module):  # after the checkpoint is restored
            seen["state"] = copy.deepcopy(trainer.optimizers[0].state_dict())
            seen["params"] = [p.detach().clone() for p in module.parameters()]

    resumed = _module(pl, name)
    trainer = _trainer(pl, tmp_path, 8, precision)
    trainer.callbacks.append(Capture())
    trainer.fit(resumed, _data(), ckpt_path=ckpt)
    assert trainer.global_step == 8
    assert seen["state"]["state"].keys() == saved["state"].keys()
    for key, state in saved["state"].items():
        for k, v in state.items():
            assert torch.equal(seen["state"]["state"][key][k].view(torch.uint8) if v.element_size() == 1 else
                               seen["state"]["state"][key][k], v.view(torch.uint8) if v.element_size() == 1 else v), k
    assert all(torch.equal(a, b) for a, b in zip(seen["params"], first.parameters()))
    assert all(not torch.equal(a, b) for a, b in zip(seen["params"], resumed.parameters()))
    assert all(torch.isfinite(p).all() for p in resumed.parameters())


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_lightning_cli_builds_each_optimizer_by_class_path(name, tmp_path):
    """``LightningCLI`` with ``--optimizer inductor_lamb.<Name>`` and its options on the command
    line (jsonargparse reads the constructor's signature, the shared options too)."""
    pl = _lightning()
    if importlib.util.find_spec("jsonargparse") is None:
        pytest.skip("needs jsonargparse (pip install 'jsonargparse[signatures]')")
    from lightning.pytorch.cli import LightningCLI

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Linear(8, 1)

        def training_step(self, batch, _):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def train_dataloader(self):
            return _data()

    options = [f"--optimizer.{k}={v}" for k, v in OPTIMIZERS[name].items()]
    cli = LightningCLI(Regression, save_config_callback=None, args=[
        "fit", f"--optimizer=inductor_lamb.{name}", *options, "--optimizer.master_weights=true",
        "--trainer.max_steps=3", "--trainer.accelerator=cpu", "--trainer.logger=false",
        "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
        f"--trainer.default_root_dir={tmp_path}"])
    opt = cli.trainer.optimizers[0]
    assert type(opt) is getattr(inductor_lamb, name) and cli.trainer.global_step == 3
    group = opt.param_groups[0]
    assert all(float(group[k]) == pytest.approx(v) for k, v in OPTIMIZERS[name].items()) and opt.defaults["master_weights"]
    assert all(opt.state[p].get("step", 3) == 3 and "master_param" not in opt.state[p] for p in cli.model.parameters())


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_hf_trainer_max_grad_norm(name, tmp_path):
    """transformers' Trainer with max_grad_norm and our optimizer passed in."""
    torch.manual_seed(0)
    model = _hf_model(nn.Linear(8, 1))
    before = [p.detach().clone() for p in model.parameters()]
    opt = getattr(inductor_lamb, name)(model.parameters(), **OPTIMIZERS[name])
    _hf_train(model, opt, tmp_path, max_grad_norm=0.5, bf16=True)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _hf_model(net: nn.Module) -> nn.Module:
    """A model as HF Trainer takes it (a dict with the loss), around ``net`` (made after seeding)."""
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None:
        pytest.skip("needs transformers and accelerate")

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x, labels):
            return {"loss": nn.functional.mse_loss(self.net(x), labels)}

    return Model()


def _hf_train(model: nn.Module, opt: torch.optim.Optimizer, tmp_path, **args_kw) -> None:
    """4 steps of HF Trainer over 32 rows, batch 8, with ``opt`` passed in."""
    from transformers import Trainer, TrainingArguments

    gen = torch.Generator().manual_seed(1)
    rows = [{"x": torch.randn(8, generator=gen), "labels": torch.randn(1, generator=gen)} for _ in range(32)]
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8, report_to=[],
                             use_cpu=True, save_strategy="no", logging_strategy="no", **args_kw)
    Trainer(model=model, args=args, train_dataset=rows, optimizers=(opt, None)).train()


def _schedule_on_sgd(lr, build, steps):
    """The lrs scheduler ``build(opt)`` gives torch's SGD over ``steps`` steps, as its groups hold them."""
    sgd = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    sched = build(sgd)
    out = []
    for _ in range(steps):
        out.append(sgd.param_groups[0]["lr"])
        sgd.step()
        sched.step()
    return out


@pytest.mark.parametrize("mode", ["plain", "frozen_group", "clipping"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_lightning_onecycle_with_the_groups_lr(name, mode, tmp_path):
    """Lightning's recipe ``OneCycleLR(opt, max_lr=opt.param_groups[0]["lr"])`` stepped every batch
    by the Trainer (with a frozen param group, or the Trainer's gradient clipping): the lrs the
    steps see are those the scheduler gives torch's SGD, as the same floats, and read back as
    floats (what Lightning logs)."""
    pl = _lightning()
    steps = 6
    seen = []

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
            self.frozen = nn.Linear(8, 1)
            self.frozen.requires_grad_(False)

        def training_step(self, batch, _):
            x, y = batch
            return nn.functional.mse_loss(self.net(x) + 0 * self.frozen(x), y)

        def configure_optimizers(self):
            groups = [{"params": self.net.parameters()}]
            if mode == "frozen_group":
                groups.append({"params": self.frozen.parameters(), "lr": 0.001})
            opt = getattr(inductor_lamb, name)(groups, **OPTIMIZERS[name])
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=opt.param_groups[0]["lr"], total_steps=steps,
                                                        cycle_momentum=False)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    class Record(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    module = Regression()
    before = [p.detach().clone() for p in module.net.parameters()]
    trainer = pl.Trainer(max_steps=steps, gradient_clip_val=0.5 if mode == "clipping" else None, accelerator="cpu",
                         devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, callbacks=[Record()])
    trainer.fit(module, _data())
    assert trainer.global_step == steps
    expected = _schedule_on_sgd(OPTIMIZERS[name]["lr"], lambda o: torch.optim.lr_scheduler.OneCycleLR(
        o, max_lr=o.param_groups[0]["lr"], total_steps=steps, cycle_momentum=False), steps)
    assert seen == expected and all(type(lr) is float for lr in seen)
    assert all(not torch.equal(a, b) and torch.isfinite(b).all() for a, b in zip(before, module.net.parameters()))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_hf_trainer_default_scheduler(name, tmp_path):
    """transformers' Trainer with our optimizer and its own default scheduler (linear decay, with
    warmup): every step's lr is the schedule's, as the same floats on torch's SGD, and the
    Trainer logs it as a number."""
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None:
        pytest.skip("needs transformers and accelerate")
    from transformers import Trainer, TrainerCallback, TrainingArguments, get_scheduler

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Linear(8, 1)

        def forward(self, x, labels):
            return {"loss": nn.functional.mse_loss(self.net(x), labels)}

    seen = []

    class Record(TrainerCallback):
        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            seen.append(optimizer.param_groups[0]["lr"])

    steps = 6
    gen = torch.Generator().manual_seed(1)
    rows = [{"x": torch.randn(8, generator=gen), "labels": torch.randn(1, generator=gen)} for _ in range(48)]
    model = Model()
    opt = getattr(inductor_lamb, name)(model.parameters(), **OPTIMIZERS[name])
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=8,
                             warmup_steps=2, report_to=[], use_cpu=True, save_strategy="no",
                             logging_strategy="steps", logging_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=rows, optimizers=(opt, None), callbacks=[Record()])
    trainer.train()
    expected = _schedule_on_sgd(OPTIMIZERS[name]["lr"], lambda o: get_scheduler(
        "linear", o, num_warmup_steps=2, num_training_steps=steps), steps)
    assert seen == expected and all(type(lr) is float for lr in seen)
    logged = [row["learning_rate"] for row in trainer.state.log_history if "learning_rate" in row]
    assert len(logged) == steps and all(isinstance(lr, float) for lr in logged)


def test_no_group_key_collides_with_what_frameworks_write(tmp_path):
    """The param-group keys Lightning's Trainer (with a step-wise OneCycleLR, gradient clipping and
    its LearningRateMonitor), HF's Trainer (its default scheduler and its own param groups) and
    accelerate's prepared optimizer and scheduler add to a torch optimizer's groups, learned by
    running each: none is a key of ours (torch.optim's own keys mean the same for both)."""
    written: dict[str, set[str]] = {}
    if importlib.util.find_spec("lightning") is not None or importlib.util.find_spec("pytorch_lightning") is not None:
        pl = _lightning()
        from lightning.pytorch.callbacks import LearningRateMonitor
        from lightning.pytorch.loggers import CSVLogger

        made = {}

        class Regression(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = nn.Linear(8, 1)

            def training_step(self, batch, _):
                return nn.functional.mse_loss(self.net(batch[0]), batch[1])

            def configure_optimizers(self):
                opt = made["opt"] = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
                made["before"] = {k for g in opt.param_groups for k in g}
                sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=4)
                return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        pl.Trainer(max_steps=4, gradient_clip_val=0.5, accelerator="cpu", devices=1, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                   logger=CSVLogger(tmp_path), callbacks=[LearningRateMonitor()]).fit(Regression(), _data())
        written["lightning"] = {k for g in made["opt"].param_groups for k in g} - made["before"]
    if importlib.util.find_spec("transformers") is not None and importlib.util.find_spec("accelerate") is not None:
        from accelerate import Accelerator
        from transformers import Trainer, TrainingArguments

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = nn.Linear(8, 1)

            def forward(self, x, labels):
                return {"loss": nn.functional.mse_loss(self.net(x), labels)}

        rows = [{"x": torch.randn(8), "labels": torch.randn(1)} for _ in range(16)]
        for given_opt in (True, False):  # (ours passed in; the Trainer's own groups)
            model = Model()
            opt = torch.optim.SGD(model.parameters(), lr=0.1) if given_opt else None
            args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=2, per_device_train_batch_size=8,
                                     warmup_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                                     logging_strategy="no", optim="sgd")
            trainer = Trainer(model=model, args=args, train_dataset=rows, optimizers=(opt, None))
            trainer.create_optimizer()
            before = {k for g in trainer.optimizer.param_groups for k in g}
            trainer.train()
            written[f"hf_trainer{'' if given_opt else '_own_groups'}"] = \
                {k for g in trainer.optimizer.param_groups for k in g} - before
        model = nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def prepared():
            accelerator = Accelerator(cpu=True)
            m, o, s = accelerator.prepare(model, opt, torch.optim.lr_scheduler.LinearLR(opt))
            for _ in range(2):
                accelerator.backward(m(torch.randn(4, 8)).square().mean())
                o.step()
                s.step()
                o.zero_grad()

        written["accelerate"] = keys_written(opt, prepared)
    if not written:
        pytest.skip("needs lightning or transformers and accelerate")
    ours = our_group_keys()
    assert {name: keys & ours for name, keys in written.items() if keys & ours} == {}, written
    if "lightning" in written:
        assert {"initial_lr", "max_lr", "min_lr"} <= written["lightning"]  # (the run wrote what it must)


# ---- the step inside the backward (inductor_lamb.step_in_backward) under the frameworks' loops ----


def _counting(opt):
    """step_in_backward(opt), counting the batches that step in the backward (``opt.batches``)."""
    inductor_lamb.step_in_backward(opt)
    opt.batches = 0
    step_batch = opt._step_batch

    def counted(batch, **kw):
        opt.batches += 1
        step_batch(batch, **kw)

    opt._step_batch = counted


def _lightning_in_backward(pl, root, in_backward, **trainer_kw):
    class InBackward(type(_module(pl, "Lamb16"))):
        def configure_optimizers(self):
            out = super().configure_optimizers()
            if in_backward:
                _counting(out["optimizer"])
            return out

    module = InBackward()
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
                         **trainer_kw)
    trainer.fit(module, _data())
    if in_backward:
        assert trainer.optimizers[0].batches == 4  # (every step's backward stepped: one batch each)
    return module


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_lightning_steps_in_the_backward(precision, tmp_path):
    """Lightning's automatic optimization runs the backward inside optimizer.step(closure): the
    params step there, with the ordinary run's bits (its StepLR driving the one optimizer)."""
    pl = _lightning()
    ordinary = _lightning_in_backward(pl, tmp_path / "a", False, precision=precision)
    stepped = _lightning_in_backward(pl, tmp_path / "b", True, precision=precision)
    for p, q in zip(ordinary.parameters(), stepped.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("option,match", [({"gradient_clip_val": 0.5}, "clip_grad_norm_ after a backward"),
                                          ({"accumulate_grad_batches": 2}, r"handle.no_step\(\)")])
def test_lightning_refuses_what_cannot_step_in_the_backward(option, match, tmp_path):
    pl = _lightning()
    with pytest.raises(RuntimeError, match=match):
        _lightning_in_backward(pl, tmp_path, True, **option)


def _hf_in_backward(tmp_path, in_backward, **args_kw):
    torch.manual_seed(0)
    model = _hf_model(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    opt = inductor_lamb.Lamb(model.parameters(), lr=1e-2)
    if in_backward:
        _counting(opt)
    _hf_train(model, opt, tmp_path, **args_kw)
    if in_backward:
        assert opt.batches == 4  # (every step's backward stepped: one batch each)
    return model


def test_hf_trainer_steps_in_the_backward(tmp_path):
    """HF Trainer without clipping (max_grad_norm=0): the ordinary run's bits, its default
    scheduler driving the one optimizer. (Its default max_grad_norm=1.0 clips through accelerate,
    which drops the params without grads before calling torch: not seen, documented.)"""
    ordinary = _hf_in_backward(tmp_path / "a", False, max_grad_norm=0.0, bf16=True)
    stepped = _hf_in_backward(tmp_path / "b", True, max_grad_norm=0.0, bf16=True)
    for p, q in zip(ordinary.parameters(), stepped.parameters()):
        assert torch.equal(p, q)


def test_hf_trainer_accumulation_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match=r"handle.no_step\(\)"):
        _hf_in_backward(tmp_path, True, max_grad_norm=0.0, gradient_accumulation_steps=2)
