"""TorchTitan runs for tests/test_torchtitan.py: a launcher (run by torchrun) that lets
TorchTitan's trainer run on CPU ranks with gloo, and the trainer configs it is given
(``--module titan_cases --config <name>``). The shims are the test machine's, not the package's:
TorchTitan expects an accelerator.

Environment: ``TITAN_ASSETS`` (a folder with ``tokenizer/`` and ``data/``, made by
``make_assets``), ``TITAN_OPTIMIZER`` (``Lamb``, ``Lamb16``, ``Lars``, ``Adagrad``, ``ReferenceLamb``,
``CheckedLamb``: ``Lamb`` with each step checked against a whole-tensor LAMB's, or ``mixed``: Lamb16 on the
attention, Lars on the feed-forward layers, NovoGrad on the norms, Adagrad on the rest).
"""

from __future__ import annotations

import json
import os
import sys


def make_assets(folder: str) -> None:
    """A byte-level BPE tokenizer of 2048 tokens (the debug model's vocabulary) trained on, and a
    dataset of, CPython's bundled documentation: TorchTitan's own test assets are not in its
    wheel, and nothing is downloaded."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(f"{folder}/tokenizer", exist_ok=True)
    os.makedirs(f"{folder}/data", exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2048, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([topics[k] for k in sorted(topics)], trainer)
    tok.save(f"{folder}/tokenizer/tokenizer.json")
    with open(f"{folder}/tokenizer/tokenizer_config.json", "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}, f)
    with open(f"{folder}/data/train.jsonl", "w") as f:
        for k in sorted(topics):
            f.write(json.dumps({"text": topics[k]}) + "\n")


def _dense_attention():
    """FlexAttention's block-causal attention computed by SDPA on its dense mask: the same math,
    with a CPU backward (FlexAttention has none)."""
    from dataclasses import dataclass

    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_mask
    from torchtitan.models.common.attention import FlexAttention

    class DenseMaskAttention(FlexAttention):
        @dataclass(kw_only=True, slots=True)
        class Config(FlexAttention.Config):
            pass

        def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks, scale=None, enable_gqa=False, **kwargs):
            b, length = q_BLNH.shape[:2]
            mask = create_mask(attention_masks.mask_mod, b, None, length, k_BLNH.shape[1], device=q_BLNH.device)
            out = F.scaled_dot_product_attention(q_BLNH.transpose(1, 2), k_BLNH.transpose(1, 2), v_BLNH.transpose(1, 2),
                                                 attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
            return out.transpose(1, 2)

    return DenseMaskAttention


def _full_norm(t):
    """A tensor's norm; a DTensor's from its full tensor, or with ``TITAN_SHARD_NORMS=1`` (the
    mistake the check must catch) from this rank's shard."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local() if os.environ.get("TITAN_SHARD_NORMS") == "1" else t.full_tensor()
    return t.double().norm()


def reference_step(p, grad, m, v, step, group):
    """One step of a plain LAMB on whole tensors (a DTensor's norms from its full tensor, the
    element-wise math on its shards): the new (p, m, v), ``step`` counting this one."""
    b1, b2 = group["betas"]
    m = m * b1 + grad * (1 - b1)
    v = v * b2 + grad * grad * (1 - b2)
    u = (m / (1 - b1 ** step)) / ((v / (1 - b2 ** step)).sqrt() + group["eps"]) + group["weight_decay"] * p
    pn, un = _full_norm(p), _full_norm(u)
    ratio = float(pn / un) if group["weight_decay"] != 0 and pn > 0 and un > 0 else 1.0
    return p - float(group["lr"]) * ratio * u, m, v


class ReferenceLamb(__import__("torch").optim.Optimizer):
    """LAMB in plain torch ops on whole tensors (reference_step)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, **_):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @__import__("torch").no_grad()
    def step(self, closure=None):
        import torch

        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"], st["m"], st["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                st["step"] += 1
                new_p, st["m"], st["v"] = reference_step(p, p.grad, st["m"], st["v"], st["step"], group)
                p.copy_(new_p)


def checked(opt):
    """``opt`` (a ``Lamb``) with every step checked against reference_step from the same params,
    grads and moments: each param, moment and second moment within float32 rounding of the
    reference (a shard's own norms would be off by the size of the update). Rank 0 prints the
    largest error of each step; a larger one fails the run."""
    import torch

    before = {}

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    def pre(opt, args, kwargs):
        before.clear()
        for group in opt.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    st = opt.state[p]
                    zeros = torch.zeros_like(p)
                    before[p] = (group, p.detach().clone(), p.grad.detach().clone(),
                                 st["exp_avg"].clone() if st else zeros, st["exp_avg_sq"].clone() if st else zeros,
                                 float(st["step"]) + 1 if st else 1.0)

    @torch.no_grad()
    def post(opt, args, kwargs):
        worst = 0.0
        for p, (group, p0, grad, m0, v0, step) in before.items():
            group = dict(group, lr=float(group["lr"]), betas=tuple(float(b) for b in group["betas"]))
            want_p, want_m, want_v = reference_step(p0.double(), grad.double(), m0.double(), v0.double(), step, group)
            st = opt.state[p]
            for got, want, scale in ((p, want_p, (want_p - p0.double()).abs()), (st["exp_avg"], want_m, want_m.abs()),
                                     (st["exp_avg_sq"], want_v, want_v.abs())):
                err = local(got.double() - want).abs().max().item() if local(got).numel() else 0.0
                err /= max(local(scale).abs().max().item() if local(scale).numel() else 0.0, 1e-30)
                worst = max(worst, err)
        assert worst < 1e-4, f"Lamb's step is {worst:.2e} away from a whole-tensor LAMB's step"
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"reference check: largest error {worst:.2e}", flush=True)

    opt.register_step_pre_hook(pre)
    opt.register_step_post_hook(post)
    return opt


def _container():
    """The package's container, also building ReferenceLamb (for the comparison)."""
    from dataclasses import dataclass

    from inductor_lamb.integrations.torchtitan import OptimizersContainer

    class WithReference(OptimizersContainer):
        @dataclass(kw_only=True, slots=True)
        class Config(OptimizersContainer.Config):
            pass

        @staticmethod
        def _resolve_optimizer_factory(name):
            if name == "ReferenceLamb":
                return lambda groups, **kw: ReferenceLamb([{k: v for k, v in g.items() if k not in ("fused", "foreach")}
                                                           for g in groups])
            if name == "CheckedLamb":
                lamb = OptimizersContainer._resolve_optimizer_factory("Lamb")
                return lambda *args, **kw: checked(lamb(*args, **kw))
            return OptimizersContainer._resolve_optimizer_factory(name)

    return WithReference


def debug_model():
    """TorchTitan's llama3 debug model with this test's optimizer, on CPU: FlexAttention's masks
    computed densely (_dense_attention), the generated assets, short sequences, no validation."""
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.validate import Validator
    from torchtitan.models.common.attention import FlexAttention
    from torchtitan.models.llama3 import model_registry
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    from inductor_lamb.integrations.torchtitan import layerwise

    assets = os.environ["TITAN_ASSETS"]
    name = os.environ.get("TITAN_OPTIMIZER", "Lamb")
    config = llama3_debugmodel()
    config.model_spec = model_registry("debugmodel", attn_backend="flex")
    dense = _dense_attention()
    for _, _, parent, field in list(config.model_spec.model.traverse(FlexAttention.Config, recurse=True)):
        if isinstance(field, int):
            parent[field] = dense.Config()
        else:
            setattr(parent, field, dense.Config())
    config.model_spec.model.layers = config.model_spec.model.layers[:2]  # (two of its six layers: seconds a run)
    config.loss = config.loss.loss_fn  # (its cross entropy, unchunked: one backward a step)
    config.hf_assets_path = f"{assets}/tokenizer"
    config.dataloader.dataset_path = f"{assets}/data"
    config.training.seq_len = 64
    config.training.local_batch_size = 4
    config.training.steps = 4
    config.debug.seed = 0
    config.validator = Validator.Config(enable=False)
    config.activation_checkpoint = None
    config.checkpoint = CheckpointManager.Config(enable=True, interval=2, last_save_model_only=False)
    kwargs = {"Lamb": dict(lr=2e-2, weight_decay=0.01), "ReferenceLamb": dict(lr=2e-2, weight_decay=0.01),
              "CheckedLamb": dict(lr=2e-2, weight_decay=0.01),
              "Lamb16": dict(lr=1e-2, weight_decay=0.01), "Lars": dict(lr=0.5, weight_decay=1e-4),
              "Adagrad": dict(lr=2e-2), "NovoGrad": dict(lr=1e-2, weight_decay=1e-3)}
    group = layerwise("Lamb").param_groups[0].__class__  # (TorchTitan's ParamGroupConfig)
    if name == "mixed":  # one optimizer per part of the model, all in one container
        config.optimizer = _container().Config(param_groups=[
            group(pattern=r"attention", optimizer_name="Lamb16", optimizer_kwargs=kwargs["Lamb16"]),
            group(pattern=r"feed_forward", optimizer_name="Lars", optimizer_kwargs=kwargs["Lars"]),
            group(pattern=r"norm", optimizer_name="NovoGrad", optimizer_kwargs=kwargs["NovoGrad"]),
            group(pattern=r".*", optimizer_name="Adagrad", optimizer_kwargs=kwargs["Adagrad"])])
    elif name in ("ReferenceLamb", "CheckedLamb"):
        config.optimizer = _container().Config(param_groups=[group(pattern=".*", optimizer_name=name,
                                                                   optimizer_kwargs=kwargs[name])])
    else:
        config.optimizer = layerwise(name, **kwargs[name])
    return config


def _cpu_shims() -> None:
    """What TorchTitan needs of a CPU rank (the test machine has no accelerator)."""
    import torch
    import torch._utils

    torch._utils._get_available_device_type = lambda: "cpu"
    from types import SimpleNamespace

    torch.cpu.current_device = lambda: 0  # (an index, as its barrier's device_ids takes it)
    for name, fn in {"get_device_name": lambda *a: "cpu",
                     "get_device_properties": lambda *a: SimpleNamespace(total_memory=1 << 34, name="cpu"),
                     "memory_stats": lambda *a, **k: {}, "empty_cache": lambda: None,
                     "reset_peak_memory_stats": lambda *a: None, "device_count": lambda: 1}.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, fn)
    # gloo has no PREMUL_SUM: FSDP2 reduces its gradients by a sum, then divides
    import torch.distributed.fsdp as fsdp

    shard = fsdp.fully_shard

    def fully_shard(module, *args, **kwargs):
        out = shard(module, *args, **kwargs)
        for m in out if isinstance(out, list) else [out]:
            m.set_force_sum_reduction_for_comms(True)
        return out

    fsdp.fully_shard = fully_shard


if __name__ == "__main__":
    _cpu_shims()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (--module titan_cases)
    import runpy

    runpy.run_module("torchtitan.train", run_name="__main__")
