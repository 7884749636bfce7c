"""Adagrad step (exactly torch.optim.Adagrad) in the backend vocabulary."""

from __future__ import annotations

from .backends import Backend, assign_params, increment_steps, master_or_params, scaled_grads


def adagrad_step(
    B: Backend, params, grads, state_sums, steps, lr, lr_decay, weight_decay, eps, maximize, grad_scale,
    found_inf, master_params,
) -> None:
    if not params:
        return
    B.found_inf = found_inf
    t = increment_steps(B, steps)
    clr = B.scalar(B.div(lr, B.add(B.mul(B.sub(t, 1.0), lr_decay), 1.0)))
    g = scaled_grads(B, grads, grad_scale, factor=-1.0 if maximize else 1.0)
    p = master_or_params(B, params, master_params)
    if weight_decay != 0:
        g = B.add(g, B.mul(p, weight_decay))
    # The state sum is written before p (the update reads the new sum).
    B.assign(state_sums, B.add(state_sums, B.mul(g, g)))
    assign_params(B, params, master_params, B.sub(p, B.mul(B.div(g, B.add(B.sqrt(state_sums), eps)), clr)))
