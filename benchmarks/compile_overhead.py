"""Where a small compiled optimizer step spends its time: our eager kernel vs the
same kernel called from compiled code (the per-call cost of dynamo's guards and
the wrapper) vs the Inductor lowering, at 1 and 2 threads.

    python -m benchmarks.compile_overhead [--params 100] [--total 400000] [--threads 1 2]
                                          [--opt-params 256 512]

Rows come from one process; each thread count recompiles (Inductor bakes the
thread count into the generated C++). The second table does the same for a whole
``torch.compile(opt.step)`` of ``Lamb``: the eager op calls of its step,
the eager ``opt.step()`` (our Python around them), and the compiled step with the
op left external, whose excess over the op calls is dynamo's per-call cost (guards
on every param, grad and state tensor, and the wrapper).
"""

from __future__ import annotations

import argparse

import torch

import inductor_lamb
from benchmarks.bench_compile import mixed_shapes, step_fn
from benchmarks.bench_step import make_state
from benchmarks.common import bench, machine_line
from inductor_lamb.optim._buckets import group_buckets


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
    ap.add_argument("--opt-params", type=int, nargs="*", default=[256, 512],
                    help="param counts of the Lamb.step table (none: skip it)")
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
    inductor_lamb.set_compile_path()  # back to the default ("auto")
    if args.opt_params:
        optimizer_table(args)


def optimizer_table(args) -> None:
    from inductor_lamb.optim import Lamb

    torch.set_num_threads(max(args.threads))
    print(f"\nLamb.step, {args.total / 1e6:.2f}M elements in all, {max(args.threads)} threads")
    print("| params | op calls ms | eager opt.step ms | compiled external ms | compiled lowering ms | per-call overhead ms |")
    print("|--------|-------------|-------------------|----------------------|----------------------|----------------------|")
    for n in args.opt_params:
        gen = torch.Generator().manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in mixed_shapes(n, args.total)]
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen) * 1e-3
        opt = Lamb(params, lr=1e-4)
        groups = [(g, group_buckets(opt, g, i)) for i, g in enumerate(opt.param_groups)]
        calls = []
        for group, buckets in groups:  # the op calls the step makes, prebuilt
            for bucket in buckets.values():
                args_ = {a.name: bucket.lists[a.name] for a in opt._layout.spec.args if a.name in bucket.lists}
                size = opt.max_tensors_per_call
                for lo in range(0, n, size):
                    calls.append({k: v[lo:lo + size] for k, v in args_.items() if isinstance(v, list)})
        lr = opt.param_groups[0]["lr"]

        def op_calls():
            for c in calls:
                inductor_lamb.ops.lamb_step_(**c, lr=lr)

        row = [bench(op_calls, args.min_time), bench(opt.step, args.min_time)]
        for path in ("external", "lowering"):
            fn = compiled(path, opt.step)
            fn()
            row.append(bench(fn, args.min_time))
        inductor_lamb.set_compile_path()  # back to the default ("auto")
        print(f"| {n:6d} | {row[0] * 1e3:11.3f} | {row[1] * 1e3:17.3f} | {row[2] * 1e3:20.3f} | {row[3] * 1e3:20.3f} "
              f"| {(row[2] - row[0]) * 1e3:20.3f} |")


if __name__ == "__main__":
    main()
