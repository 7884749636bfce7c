"""How closely LAMB16's stored float8 moments track the exact moments, with and
without stochastic rounding (issue 17's accuracy target).

A heavy-tailed gradient stream (per-element scales ``exp(1.5 * randn)``,
Student-t(3) noise around a drifting mean) runs through ``lamb16_step_`` for
300 steps from zero state; the decoded m and v are compared with a float64 EMA
of the same gradients (no bias correction, as LAMB16): relative L2 error of m
and v, and the relative error of the sum of v (drift). Several stream seeds per
size, since the heavy tails make every statistic noisy.

    PYTHONPATH=. python benchmarks/lamb16_accuracy.py [--steps 300] [--seeds 5] [--plot]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator

import torch

import inductor_lamb

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
SIZES = (288, 4096, 262144)


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
        inductor_lamb.ops.lamb16_step_(p, [g], m8, v8, sm, sv, step, lr=1e-3, stochastic_rounding=stochastic,
                                       seed=seed)
        if every and (k + 1) % every == 0:
            curve.append((k + 1, errors()["v_sum"]))
    return {**errors(), "curve": curve}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--plot", default="", help="PNG of the v-sum drift over the steps (largest size, seed 0)")
    args = ap.parse_args()
    from tqdm import tqdm  # (here: the tests import this module's stream without it)

    torch.set_num_threads(2)
    rows = {}
    jobs = [(n, s, sr) for n in SIZES for sr in (False, True) for s in range(args.seeds)]
    for n, s, sr in tqdm(jobs, desc="streams"):
        rows.setdefault((n, sr), []).append(track(n, args.steps, s, sr, every=10 if s == 0 else 0))
    print(f"\n{args.steps} steps, {args.seeds} stream seeds per row: mean [min, max]\n")
    print("| N | rounding | rel. L2 error of m | rel. L2 error of v | sum of v vs exact |")
    print("|---|---|---|---|---|")

    def cell(xs: list[float], pct: bool = True) -> str:
        f = (lambda x: f"{100 * x:+.1f}%") if not pct else (lambda x: f"{100 * x:.1f}%")
        return f"{f(statistics.mean(xs))} [{f(min(xs))}, {f(max(xs))}]"

    for (n, sr), rs in rows.items():
        print(f"| {n} | {'stochastic' if sr else 'nearest'} | {cell([r['m'] for r in rs])} | "
              f"{cell([r['v'] for r in rs])} | {cell([r['v_sum'] for r in rs], pct=False)} |")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for n in SIZES:
            for sr, style in ((False, "--"), (True, "-")):
                xs, ys = zip(*rows[(n, sr)][0]["curve"])
                ax.plot(xs, [100 * y for y in ys], style, label=f"N={n}, {'stochastic' if sr else 'nearest'}")
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xlabel("step")
        ax.set_ylabel("sum of stored v vs exact EMA (%)")
        ax.set_title("LAMB16 second moment drift (stream seed 0)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
