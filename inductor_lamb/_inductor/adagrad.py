"""Adagrad step (exactly torch.optim.Adagrad) in the backend vocabulary."""

from __future__ import annotations

from types import SimpleNamespace

from .backend import Backend
from .step_parts import assign_params, increment_steps, master_or_params, param_rounding, scaled_grads

# The fewest kernels Inductor's foreach groups of this lowering launch per call on CUDA (its
# element-wise passes, step counts and per-tensor scalars; more tensors per call take more):
# what the launch model of cost.py adds to the reductions' kernels. tests/test_cuda_codegen.py
# checks it against the code generated for a described H100.
GROUPED_LAUNCHES = 2


def adagrad_step(B: Backend, a: SimpleNamespace) -> None:
    if not a.params:
        return
    B.found_inf = a.found_inf
    t = increment_steps(B, a.steps)
    clr = B.scalar(B.div(a.lr, B.add(B.mul(B.sub(t, 1.0), a.lr_decay), 1.0)))
    g = scaled_grads(B, a.grads, a.grad_scale, factor=-1.0 if a.maximize else 1.0)
    p = master_or_params(B, a.params, a.master_params)
    if a.weight_decay != 0:
        g = B.add(g, B.mul(p, a.weight_decay))
    # The state sum is written before p (the update reads the new sum).
    B.assign(a.state_sums, B.add(a.state_sums, B.mul(g, g)))
    assign_params(B, a.params, a.master_params, B.sub(p, B.mul(B.div(g, B.add(B.sqrt(a.state_sums), a.eps)), clr)),
                  param_rounding(B, a, B.to_float(a.grads), t))  # (a rounded param hashes the grad as stored)
