"""How closely LAMB16's stored float8 moments track exact ones: a heavy-tailed
gradient stream like a layer's, and the errors of the moments that
``lamb16_step_`` stores against a float64 EMA of the same gradients (no bias
correction, as LAMB16). ``benchmarks/studies/lamb16_accuracy.py`` reports them; the
tests check the stochastic rounding with them."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .. import ops

__all__ = ["gradient_stream", "track"]

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def gradient_stream(n: int, steps: int, seed: int) -> Iterator[torch.Tensor]:
    """Heavy-tailed gradients like a layer's: a per-element magnitude spread over
    orders of magnitude (log-normal), Student-t(3) noise, a slowly drifting mean."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.randn(n, generator=gen, dtype=torch.float64) * 1.5) * 1e-3
    mean = torch.randn(n, generator=gen, dtype=torch.float64) * 0.3
    t3 = torch.distributions.StudentT(3.0)
    torch.manual_seed(seed)
    for _ in range(steps):
        mean = 0.95 * mean + 0.05 * torch.randn(n, generator=gen, dtype=torch.float64)
        yield (scale * (mean + t3.sample((n,)).double())).float()


def track(n: int, steps: int, seed: int, stochastic: bool, every: int = 0) -> dict[str, object]:
    """Runs the stream through the op; the errors at the end (and every ``every`` steps)."""
    p = [torch.randn(n)]
    m8, v8 = [torch.zeros(n, dtype=E4M3)], [torch.zeros(n, dtype=E5M2)]
    sm, sv, step = [torch.tensor(1.0)], [torch.tensor(1.0)], [torch.tensor(0.0)]
    # the op's betas are float32: the exact EMA uses their float32 values
    b1, b2 = float(torch.tensor(0.9)), float(torch.tensor(0.999))
    m = torch.zeros(n, dtype=torch.float64)
    v = torch.zeros(n, dtype=torch.float64)
    curve = []

    def errors() -> dict[str, float]:
        mb, vb = m8[0].double() * sm[0].item(), v8[0].double() * sv[0].item()
        return {"m": ((mb - m).norm() / m.norm()).item(), "v": ((vb - v).norm() / v.norm()).item(),
                "v_sum": (vb.sum() / v.sum() - 1).item()}

    for k, g in enumerate(gradient_stream(n, steps, seed)):
        m = b1 * m + (1 - b1) * g.double()
        v = b2 * v + (1 - b2) * g.double() ** 2
        ops.lamb16_step_(p, [g], m8, v8, sm, sv, step, lr=1e-3, stochastic_rounding=stochastic,
                                       seed=seed)
        if every and (k + 1) % every == 0:
            curve.append((k + 1, errors()["v_sum"]))
    return {**errors(), "curve": curve}
