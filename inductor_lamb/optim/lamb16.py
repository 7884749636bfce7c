"""LAMB16: LAMB with float8 optimizer state (2 bytes per parameter)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor
from typing_extensions import Unpack

from ..spec import LAMB16
from ._base import FusedOptimizer, FusedOptions, OpFamily, check_betas, check_nonnegative

__all__ = ["Lamb16"]


class Lamb16(FusedOptimizer):
    r"""LAMB with its moments stored in float8: one ``torch.ops.lamb.lamb16_step_``
    call per (device, dtype, sharding) bucket of each param group.

    ``m`` is kept as ``float8_e4m3fn`` and ``v`` as ``float8_e5m2``, each with a
    per-tensor float32 scale (``amax / float8_max``, so stored values never
    saturate): 2 bytes of state per parameter instead of LAMB's 8, and 26 bytes
    of memory traffic per parameter and step instead of 40. The math runs in
    float32::

        m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2     (no bias correction)
        u = m / (sqrt(v) + eps) + weight_decay p
        r = clamp((||p|| / ||u|| * 1e-3 / lr) ** trust_scale, 0, 2)    (1 when a norm is 0)
        p = p - lr * r * u

    Storing rounds m and v to float8 **stochastically** by default: up or down
    with the probabilities that make the stored value right on average, so the
    moments do not drift (at ``beta2 = 0.999`` a step changes v by 0.1%, far
    below float8's 12-25% spacing, and round to nearest loses it). The random
    bits hash (``seed``, step, the element's gradient, its stored m and v codes), so the
    result is the same on every backend, shard and thread count, and a resumed
    checkpoint (the seed is a param-group option) continues bit for bit.

    Args:
        params: iterable of parameters or dicts defining parameter groups.
        lr: learning rate (kept as a 0-d tensor so schedulers never force a recompile).
        betas: coefficients of the running averages of the gradient and its square.
        eps: term added to the denominator.
        weight_decay: decoupled weight decay, part of the update ``u``.
        trust_scale: exponent of the lr-rescaled trust ratio (0 disables adaptation).
        master_weights: keep a float32 master copy of bfloat16/float16 params.
        stochastic_rounding: round the stored moments stochastically (default), and
            bfloat16/float16 params that have no master copy too; ``False`` rounds
            both to nearest even.
        seed: seed of the stochastic rounding's random bits (any int); the same
            on every rank of a sharded run.
        {unscale_in_step_arg}

    State per parameter: ``step`` (0-d float32), ``exp_avg`` (float8_e4m3fn),
    ``exp_avg_sq`` (float8_e5m2), ``exp_avg_scale`` and ``exp_avg_sq_scale``
    (0-d float32), and ``master_param`` with ``master_weights``. See
    :meth:`state_bytes_per_param`.
    """

    _ops = OpFamily.of(LAMB16)
    _state_keys = ("exp_avg", "exp_avg_sq")
    _scalar_state_keys = ("exp_avg_scale", "exp_avg_sq_scale")

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | Tensor = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        trust_scale: float = 0.382,
        **options: Unpack[FusedOptions],
    ) -> None:
        check_betas(betas)
        check_nonnegative(eps=eps, weight_decay=weight_decay, trust_scale=trust_scale)
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, trust_scale=trust_scale,
        )
        super().__init__(params, defaults, **options)

    def _state_fill(self, key: str, group: dict[str, Any]) -> float:
        return 1.0 if key in self._layout.scalar_state_keys else 0.0
