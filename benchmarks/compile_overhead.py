"""Where a small compiled optimizer step spends its time: our eager kernel vs the
same kernel called from compiled code (the per-call cost of dynamo's guards and
the wrapper) vs the Inductor lowering, at 1 and 2 threads.

    python benchmarks/compile_overhead.py [--params 100] [--total 400000] [--threads 1 2]

Rows come from one process; each thread count recompiles (Inductor bakes the
thread count into the generated C++).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compile import mixed_shapes, step_fn  # noqa: E402
from bench_step import make_state  # noqa: E402
from common import bench, machine_line  # noqa: E402

import inductor_lamb  # noqa: E402


def compiled(path: str, fn):
    inductor_lamb.set_compile_path(path)
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=int, default=100)
    ap.add_argument("--total", type=int, default=400_000, help="total elements (default: cache-resident)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--min-time", type=float, default=0.5)
    args = ap.parse_args()

    shapes = mixed_shapes(args.params, args.total)
    state, lr = make_state(shapes, kind="lamb"), torch.tensor(1e-4)
    step = step_fn("lamb")
    print(machine_line(max(args.threads)))
    print(f"LAMB, {args.params} params, {sum(torch.Size(s).numel() for s in shapes) / 1e6:.2f}M elements")
    print("| threads | eager op ms | compiled external ms | compiled lowering ms | per-call overhead ms | generated code ms |")
    print("|---------|-------------|----------------------|----------------------|----------------------|-------------------|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        eager = bench(lambda: step(state, lr), args.min_time)
        times = {}
        for path in ("external", "lowering"):
            fn = compiled(path, step)
            fn(state, lr)
            times[path] = bench(lambda: fn(state, lr), args.min_time)
        overhead = times["external"] - eager  # the external row only adds the compiled call around our kernel
        print(f"| {threads:7d} | {eager * 1e3:11.3f} | {times['external'] * 1e3:20.3f} | {times['lowering'] * 1e3:20.3f} "
              f"| {overhead * 1e3:20.3f} | {(times['lowering'] - overhead) * 1e3:17.3f} |")
    inductor_lamb.set_compile_path("lowering")


if __name__ == "__main__":
    main()
