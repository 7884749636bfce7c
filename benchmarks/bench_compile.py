"""The optimizer step under torch.compile: our Inductor lowering against its fallbacks,
our eager kernel, torch.compile of the plain-torch reference and of torch's Adam.

    python -m benchmarks.bench_compile [--threads 2] [--ops lamb lars adagrad] [--params 20 100]

For 20 and 100 mixed-shape params, at a cache-resident and a DRAM-sized total,
each row is compiled (cold Inductor cache), timed and then dropped, next to a
STREAM-like bandwidth measured at the start of its table. Columns: step time,
ratio to our eager op, GB/s at the method's bytes/param floor (docs/design.md),
compile time of the first call, and kernels in the generated code
(``cpp_pybinding`` functions; "ext" counts external calls to torch.ops.lamb).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
from torch._inductor.utils import fresh_cache, run_and_get_code
from tqdm import tqdm

import inductor_lamb
from benchmarks.bench_step import BYTES_PER_PARAM, KWARGS, OURS, REFERENCE, make_state
from benchmarks.common import DEFAULT_THREADS, bench, machine_line, numel, stream_bandwidth


def mixed_shapes(n: int, total: int) -> list[tuple[int, ...]]:
    """``n`` shapes (2 matrices per vector, sizes varying 1..4x) with about ``total`` elements."""
    weights = [1 + (i * 7) % 4 for i in range(n)]
    unit = total / sum(weights)
    shapes: list[tuple[int, ...]] = []
    for i, w in enumerate(weights):
        size = max(1, int(unit * w))
        if i % 3 == 2:
            shapes.append((size,))
        else:
            cols = 64 * (1 + i % 5) + 3  # odd widths: vector tails
            shapes.append((max(1, size // cols), cols))
    return shapes


def step_fn(kind: str) -> Callable[..., None]:
    op, kw = OURS[kind], KWARGS[kind]

    def step(state, lr):
        op(*state, lr=lr, **kw)

    return step


def reference_fn(kind: str) -> Callable[..., None]:
    ref, kw = REFERENCE[kind], KWARGS[kind]

    def step(state, lr):
        ref(*state, lr=lr, **kw)

    return step


def compile_and_time(fn, args, min_time, fullgraph=True) -> tuple[float, float, str]:
    """(seconds per call, compile seconds of the first call, kernel summary)."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=fullgraph)
    with fresh_cache():
        t0 = time.perf_counter()
        _, codes = run_and_get_code(compiled, *args)
        compile_s = time.perf_counter() - t0
    code = "\n".join(codes)
    kernels = code.count("async_compile.cpp_pybinding(") + code.count("async_compile.triton(")
    ext = code.count("torch.ops.lamb.")
    t = bench(lambda: compiled(*args), min_time=min_time)
    return t, compile_s, f"{kernels}" + (f" + {ext} ext" if ext else "")


def rows_for(kind: str, shapes, min_time: float) -> list[dict]:
    lr = torch.tensor(1e-4)
    floor = BYTES_PER_PARAM[kind]
    rows = []

    def add(name, floor, timed):
        t, compile_s, kernels = timed
        rows.append({"method": name, "floor": floor, "s": t, "compile_s": compile_s, "kernels": kernels})

    for path in ("lowering", "decomposition", "external"):
        inductor_lamb.set_compile_path(path)
        add(f"compiled, {path}", floor, compile_and_time(step_fn(kind), (make_state(shapes, kind=kind), lr), min_time))
    inductor_lamb.set_compile_path()  # back to the default ("auto")
    torch._dynamo.reset()
    state = make_state(shapes, kind=kind)
    add("eager op (C++ kernel)", floor, (bench(lambda: step_fn(kind)(state, lr), min_time=min_time), 0.0, "-"))
    add("torch.compile(reference)", floor,
        compile_and_time(reference_fn(kind), (make_state(shapes, kind=kind), lr), min_time))
    if kind == "lamb":
        params = [torch.nn.Parameter(t) for t in make_state(shapes)[0]]
        for p, g in zip(params, make_state(shapes, seed=1)[1]):
            p.grad = g
        adam = torch.optim.Adam(params, lr=1e-4, foreach=True)
        with torch.no_grad():
            adam.step()  # creates the state eagerly: the compiled step is then one graph

        def adam_step(opt, lr):
            opt.step()

        # torch.optim's step wrapper graph-breaks once before the step (no fullgraph)
        add("compiled Adam(foreach=True) (twin)", BYTES_PER_PARAM["adamw"],
            compile_and_time(adam_step, (adam, lr), min_time, fullgraph=False))
    return rows


def run(args) -> list[dict]:
    torch.set_num_threads(args.threads)
    print(f"# {machine_line(args.threads)}\n")
    tables = [(kind, n, total) for kind in args.ops for n in args.params for total in args.totals]
    results = []
    for kind, n, total in tqdm(tables, desc="compiled steps", file=sys.stderr):
        shapes = mixed_shapes(n, total)
        elems = numel(shapes)
        bw = stream_bandwidth()
        with torch.no_grad():
            rows = rows_for(kind, shapes, args.min_time)
        eager = next(r["s"] for r in rows if r["method"].startswith("eager op"))
        print(f"{kind.upper()}: {n} params, {elems / 1e6:.2f}M elements; bandwidth now: triad {bw['triad']:.1f} GB/s, "
              f"in-place a += s*b {bw['rmw']:.1f} GB/s")
        print(f"| {'method':36s} | {'ms':>8s} | {'vs eager op':>11s} | {'GB/s':>6s} | {'% rmw':>5s} | "
              f"{'compile s':>9s} | {'kernels':>9s} |")
        print(f"|{'-' * 38}|{'-' * 10}|{'-' * 13}|{'-' * 8}|{'-' * 7}|{'-' * 11}|{'-' * 11}|")
        for r in rows:
            gbs = r["floor"] * elems / r["s"] / 1e9
            print(f"| {r['method']:36s} | {r['s'] * 1e3:8.3f} | {r['s'] / eager:10.2f}x | {gbs:6.1f} | "
                  f"{100 * gbs / bw['rmw']:4.0f}% | {r['compile_s']:9.1f} | {r['kernels']:>9s} |")
            results.append({"op": kind, "params": n, "elements": elems, **r, "gbs": gbs, "bw": bw})
        print(flush=True)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds of repeats per row")
    ap.add_argument("--ops", nargs="+", default=["lamb"], choices=["lamb", "lamb16", "lars", "adagrad"])
    ap.add_argument("--params", nargs="+", type=int, default=[20, 100])
    ap.add_argument("--totals", nargs="+", type=int, default=[400_000, 16_000_000],
                    help="total elements: cache-resident and DRAM-sized by default")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
