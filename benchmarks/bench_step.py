"""Optimizer step time: our ops against plain torch and torch's fused twins.

    python benchmarks/bench_step.py [--threads 2] [--plot benchmarks/bench_step_cpu.png]

Workloads: (a) one 1024x1024 tensor; (b) a BERT-like list of ~100 tensors, >= 25M
params. Every row of a workload is measured in the same run, next to a
STREAM-like copy/triad bandwidth, so ratios are comparable on a noisy machine.
GB/s counts the minimum traffic of DESIGN.md (LAMB: 40 bytes/param; the AdamW twin: 28).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_THREADS, bench, bert_like_shapes, machine_line, numel, stream_bandwidth  # noqa: E402

import inductor_lamb  # noqa: E402
from inductor_lamb import reference  # noqa: E402

# Minimum traffic per param (DESIGN.md), fp32: what each method must move at least.
BYTES_PER_PARAM = {"lamb": 40, "adamw": 28}


def make_state(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=g) for s in shapes]
    grads = [torch.randn(s, generator=g) for s in shapes]
    exp_avgs = [torch.randn(s, generator=g) * 0.1 for s in shapes]
    exp_avg_sqs = [torch.rand(s, generator=g) * 0.1 + 1e-3 for s in shapes]
    steps = [torch.tensor(1.0) for _ in shapes]
    return params, grads, exp_avgs, exp_avg_sqs, steps


def lamb_rows(shapes) -> dict[str, Callable[[], object]]:
    """name -> zero-argument step function, each on its own copy of the state."""
    lr = torch.tensor(1e-4)
    rows: dict[str, Callable[[], object]] = {}

    s = make_state(shapes)
    rows["inductor_lamb op"] = lambda s=s: torch.ops.lamb.lamb_step_(*s, lr)

    s = make_state(shapes)
    rows["plain torch reference (eager)"] = lambda s=s: reference.lamb_step(*s, lr)

    s = make_state(shapes)
    compiled_ref = torch.compile(reference.lamb_step)
    rows["torch.compile(reference)"] = lambda s=s: compiled_ref(*s, lr)

    params = [torch.nn.Parameter(t) for t in make_state(shapes)[0]]
    for p, g in zip(params, make_state(shapes, seed=1)[1]):
        p.grad = g
    adamw = torch.optim.AdamW(params, lr=1e-4, fused=True)
    rows["torch AdamW(fused=True) (twin)"] = adamw.step
    return rows


def floor_bytes(method: str) -> int:
    return BYTES_PER_PARAM["adamw" if "AdamW" in method else "lamb"]


def run(args) -> list[dict]:
    torch.set_num_threads(args.threads)
    workloads = {"(a) 1x 1024x1024": [(1024, 1024)], "(b) BERT-like": bert_like_shapes()}
    results = []
    bw = stream_bandwidth()
    print(f"# {machine_line(args.threads)}")
    print(f"# measured bandwidth: copy {bw['copy']:.1f} GB/s, triad {bw['triad']:.1f} GB/s (STREAM bytes), "
          f"in-place a += s*b {bw['rmw']:.1f} GB/s\n")
    jobs = [(w, name, fn) for w, shapes in workloads.items() for name, fn in lamb_rows(shapes).items()]
    times: dict[tuple[str, str], float] = {}
    for w, name, fn in tqdm(jobs, desc="LAMB step", file=sys.stderr):
        with torch.no_grad():
            times[(w, name)] = bench(fn, min_time=args.min_time)
    for w, shapes in workloads.items():
        n = numel(shapes)
        print(f"LAMB, {w}: {len(shapes)} tensors, {n / 1e6:.2f}M params; GB/s at each method's floor "
              f"(LAMB {BYTES_PER_PARAM['lamb']}, AdamW {BYTES_PER_PARAM['adamw']} B/param)")
        print(f"| {'method':34s} | {'ms':>8s} | {'vs ours':>8s} | {'GB/s':>7s} | {'% triad':>7s} | {'% rmw':>7s} |")
        print(f"|{'-' * 36}|{'-' * 10}|{'-' * 10}|{'-' * 9}|{'-' * 9}|{'-' * 9}|")
        ours = times[(w, "inductor_lamb op")]
        for (ww, name), t in times.items():
            if ww != w:
                continue
            gbs = floor_bytes(name) * n / t / 1e9
            print(f"| {name:34s} | {t * 1e3:8.3f} | {t / ours:7.2f}x | {gbs:7.1f} | {100 * gbs / bw['triad']:6.0f}% "
                  f"| {100 * gbs / bw['rmw']:6.0f}% |")
            results.append({"workload": w, "method": name, "ms": t * 1e3, "gbs": gbs})
        print()
    if args.plot:
        plot(results, bw, args.plot)
    return results


def plot(results, bw, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["workload"] for r in results))
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        rows = [r for r in results if r["workload"] == w]
        ax.barh([r["method"] for r in rows], [r["gbs"] for r in rows], color="tab:blue")
        ax.axvline(bw["triad"], color="tab:red", linestyle="--", label=f"triad {bw['triad']:.0f} GB/s")
        ax.axvline(bw["rmw"], color="tab:green", linestyle=":", label=f"a += s*b {bw['rmw']:.0f} GB/s")
        ax.set_title(f"LAMB step, {w}")
        ax.set_xlabel("GB/s at the method's bytes/param floor (higher is better)")
        ax.invert_yaxis()
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds of repeats per row")
    ap.add_argument("--plot", default="", help="save a PNG bar chart here")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
