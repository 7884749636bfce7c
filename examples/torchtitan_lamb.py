"""TorchTitan with this package's optimizers: TorchTitan's own llama3 configs, their AdamW
replaced by Lamb (or Lamb16, Lars, Adagrad, NovoGrad) through inductor_lamb.integrations.torchtitan.

    pip install torchtitan==0.3.0        # (TorchTitan 0.3.0 needs torch 2.14)
    # from this checkout's root, on a GPU machine: FSDP2 x tensor parallel on 8 GPUs
    torchrun --nproc_per_node 8 -m torchtitan.train --module examples.torchtitan_lamb \\
        --config llama3_8b_lamb --parallelism.tensor_parallel_degree 2
    torchrun --nproc_per_node 2 -m torchtitan.train --module examples.torchtitan_lamb \\
        --config llama3_debugmodel_lamb   # the debug model (TorchTitan's test assets for its tokenizer)

Every parallelism TorchTitan applies keeps LAMB's per-tensor norms exact: FSDP2, tensor
parallel, both at once, HSDP. LAMB takes a larger lr than AdamW (here 4x the config's); sweep it
for your model (docs/optimizers.md).
"""

from __future__ import annotations

from torchtitan.models.llama3.config_registry import llama3_8b, llama3_debugmodel
from torchtitan.trainer import Trainer

from inductor_lamb.integrations.torchtitan import layerwise


def _with(config: Trainer.Config, name: str, lr_scale: float, **kwargs) -> Trainer.Config:
    lr = config.optimizer.param_groups[0].optimizer_kwargs["lr"]  # (the config's AdamW lr)
    config.optimizer = layerwise(name, lr=lr * lr_scale, **kwargs)
    return config


def llama3_debugmodel_lamb() -> Trainer.Config:
    return _with(llama3_debugmodel(), "Lamb", 4.0, weight_decay=0.01)


def llama3_debugmodel_lamb16() -> Trainer.Config:
    return _with(llama3_debugmodel(), "Lamb16", 1.5, weight_decay=0.01)


def llama3_8b_lamb() -> Trainer.Config:
    return _with(llama3_8b(), "Lamb", 4.0, weight_decay=0.01)
