"""What an optimizer's state costs in memory, measured from its state tensors, and the
quantization block that makes torchao's low-bit optimizers quantize a model's tensors.
Used by the benchmarks that compare optimizers by bytes per parameter."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["state_bytes_per_param", "torchao_block_size"]


def state_bytes_per_param(opt: torch.optim.Optimizer) -> float:
    """Bytes of every tensor in ``opt``'s state per optimized element. A tensor subclass
    (torchao's quantized state) counts the tensors it flattens to: its codes and scales."""

    def nbytes(t: torch.Tensor) -> int:
        inner = getattr(t, "__tensor_flatten__", None)
        if inner is not None and type(t) is not torch.Tensor and type(t) is not nn.Parameter:
            return sum(nbytes(getattr(t, name)) for name in inner()[0])
        return t.numel() * t.element_size()

    n = sum(p.numel() for group in opt.param_groups for p in group["params"])
    total = sum(nbytes(v) for s in opt.state.values() if isinstance(s, dict) for v in s.values()
                if isinstance(v, torch.Tensor))
    return total / n


def torchao_block_size(model: nn.Module, largest: int = 256) -> int:
    """The largest quantization block (at most ``largest``: torchao's default, 256, or 128
    for its 4-bit AdamW) that divides every tensor torchao quantizes (those of 4096 elements
    or more). torchao keeps a tensor's state in float32, without a word, when its block does
    not divide it: with the default block, none of a small CNN's tensors may be quantized and
    the low-bit AdamWs are then ordinary AdamW."""
    g = 0
    for p in model.parameters():
        if p.numel() >= 4096:
            g = math.gcd(g, p.numel())
    return max(d for d in range(1, largest + 1) if g % d == 0) if g else largest
