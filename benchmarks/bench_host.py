"""Host cost per tensor of an eager ``opt.step()``: our optimizers against torch's fused and
foreach AdamW, on many small params (where the per-tensor work before any kernel runs is the
step's time) and on a BERT-like list.

    python -m benchmarks.bench_host [--tensors 100 1000 10000] [--numel 16] [--threads 1]
                                    [--device cpu|cuda] [--rounds 5] [--plot benchmarks/bench_host.png]

Every optimizer steps the same params (random grads, never zeros), in alternating rounds
(``--rounds``; the median of each kept), so every row sees the same machine conditions; one
torch thread by default (the kernels' own work on 16-element tensors is negligible, so the
thread count only adds noise). Columns: microseconds per tensor (the step's time / its tensors)
and the ratio to torch's ``AdamW(fused=True)``. On CUDA the step is timed to its last launch
(``torch.cuda.synchronize`` after the step).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

import inductor_lamb
from benchmarks.common import bert_like_shapes, machine_line, median_seconds

OPTIMIZERS: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {
    "torch AdamW(fused=True)": lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),
    "torch AdamW(foreach=True)": lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=True),
    "Lamb": lambda ps: inductor_lamb.Lamb(ps, lr=1e-3),
    "Lamb16": lambda ps: inductor_lamb.Lamb16(ps, lr=1e-3),
    "Lars": lambda ps: inductor_lamb.Lars(ps, lr=1e-3),
    "Adagrad": lambda ps: inductor_lamb.Adagrad(ps, lr=1e-3),
}
REFERENCE = "torch AdamW(fused=True)"


def params(shapes: list[tuple[int, ...]], device: str, seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator(device=device).manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(s, generator=g, device=device)) for s in shapes]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g, device=device)
    return ps


def seconds_per_step(step: Callable[[], object], sync: Callable[[], None], min_time: float) -> float:
    step()
    sync()
    t0 = time.perf_counter()
    step()
    sync()
    return median_seconds(step, sync, max(5, min(2000, int(min_time / max(time.perf_counter() - t0, 1e-6)))))


def run(workloads: dict[str, list[tuple[int, ...]]], names: list[str], device: str, rounds: int,
        min_time: float) -> dict[str, dict[str, float]]:
    """Microseconds per tensor, workload -> optimizer -> median over the rounds."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out: dict[str, dict[str, float]] = {}
    for w, shapes in workloads.items():
        opts = {n: OPTIMIZERS[n](params(shapes, device)) for n in names}
        times: dict[str, list[float]] = {n: [] for n in names}
        for _ in tqdm(range(rounds), desc=w, file=sys.stderr, leave=False):
            for n, opt in opts.items():  # (alternating: every row sees the same conditions)
                times[n].append(seconds_per_step(opt.step, sync, min_time / rounds) / len(shapes) * 1e6)
        out[w] = {n: statistics.median(v) for n, v in times.items()}
        del opts
    return out


def plot(results: dict[str, dict[str, float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(results)
    names = list(next(iter(results.values())))
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(names)
    for k, n in enumerate(names):
        ax.bar([i + k * width for i in range(len(workloads))], [results[w][n] for w in workloads], width, label=n)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(workloads))], workloads)
    ax.set_ylabel("microseconds per tensor (eager opt.step)")
    ax.set_yscale("log")
    ax.set_title("Host cost per tensor")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tensors", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--numel", type=int, default=16, help="elements per small tensor")
    ap.add_argument("--no-bert", dest="bert", action="store_false", help="leave out the BERT-like list")
    ap.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=list(OPTIMIZERS))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=2.0, help="seconds per row, over all rounds")
    ap.add_argument("--plot", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    names = [REFERENCE] + [n for n in args.optimizers if n != REFERENCE]
    workloads = {f"{n} x {args.numel}": [(args.numel,)] * n for n in args.tensors}
    if args.bert:
        workloads["BERT-like (103 tensors)"] = bert_like_shapes()
    results = run(workloads, names, args.device, args.rounds, args.min_time)
    print(f"# {machine_line(args.threads)}; device {args.device}; median of {args.rounds} alternating rounds\n")
    print("| optimizer | " + " | ".join(f"{w}: us/tensor (x fused AdamW)" for w in workloads) + " |")
    print("|---|" + "---|" * len(workloads))
    for n in names:
        cells = [f"{results[w][n]:.2f} ({results[w][n] / results[w][REFERENCE]:.2f}x)" for w in workloads]
        print(f"| {n} | " + " | ".join(cells) + " |")
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
