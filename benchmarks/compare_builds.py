"""Step time of our four ops in two builds of the package, side by side (a kernel
refactor's "no speed regression" check).

    python -m benchmarks.compare_builds --before /path/to/old/checkout --after . [--rounds 3]
        [--workloads "68 x 4096" "1000 x 4096"]   # some rows only, more rounds in the same time

Each build is a source tree with its extension built in place (``python setup.py
build_ext --inplace``). The two cannot share a process (both register
``torch.ops.lamb``), so every (build, CPU capability) runs in its own process,
alternating before/after for ``--rounds`` rounds; the table keeps each row's
fastest round, so both builds see the same machine conditions. Workloads: the
raw ops on one 1024x1024 tensor (in cache), on 68 and 1000 tensors of 4096 elements
(where per-tensor costs such as the argument checks show) and the BERT-like list of
bench_step.py (DRAM); the optimizers' eager ``opt.step()`` on 200 x (64,) params and on the MNIST
CNN's 8 params (where the Python around the op call shows).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import machine_line

ROOT = Path(__file__).resolve().parent.parent
OPS = ("lamb", "lamb16", "lars", "adagrad")
WORKLOADS = ("1024x1024", "68 x 4096", "1000 x 4096", "BERT-like", "opt.step 200x64", "opt.step MNIST CNN")

# Run in a child process with PYTHONPATH=<build>:<this checkout>: times every op, prints JSON.
CHILD = r"""
import json, sys
import torch
from benchmarks.bench_step import make_state
from benchmarks.common import bench, bert_like_shapes
import inductor_lamb
assert inductor_lamb.__file__.startswith({tree!r}), f"imported {{inductor_lamb.__file__}}, not the build in {tree!r}"
torch.set_num_threads({threads})
inductor_lamb.set_cpu_capability({cap!r})
workloads = {{"1024x1024": [(1024, 1024)], "68 x 4096": [(4096,)] * 68, "1000 x 4096": [(4096,)] * 1000,
             "BERT-like": bert_like_shapes()}}
MNIST_CNN = [(20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (500, 800), (500,), (10, 500), (10,)]
lr = torch.tensor(1e-3)
b1, b2, mom = torch.tensor(0.9), torch.tensor(0.999), torch.tensor(0.9)
calls = {{
    "lamb": lambda s: torch.ops.lamb.lamb_step_(*s, lr, b1, b2),
    "lamb16": lambda s: torch.ops.lamb.lamb16_step_(*s, lr, b1, b2),
    "lars": lambda s: torch.ops.lamb.lars_step_(*s, lr, mom),
    "adagrad": lambda s: torch.ops.lamb.adagrad_step_(*s, lr),
}}
out = {{}}
for w, shapes in workloads.items():
    if w not in {workloads!r}:
        continue
    for op in {ops!r}:
        state = make_state(shapes, kind=op)
        out[f"{{op}} {{w}}"] = bench(lambda: calls[op](state), min_time={min_time}) * 1e3
        del state
# The optimizers' eager opt.step() on small params, where their Python shows
classes = {{"lamb": inductor_lamb.Lamb, "lamb16": inductor_lamb.Lamb16, "lars": inductor_lamb.Lars,
            "adagrad": inductor_lamb.Adagrad}}
torch.manual_seed(0)
for w, shapes in {{"opt.step 200x64": [(64,)] * 200, "opt.step MNIST CNN": MNIST_CNN}}.items():
    if w not in {workloads!r}:
        continue
    for op in {ops!r}:
        params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = classes[op](params, lr=1e-3)
        out[f"{{op}} {{w}}"] = bench(opt.step, min_time={min_time}) * 1e3
print(json.dumps(out))
"""


def child_env(tree: str) -> dict[str, str]:
    """The build in ``tree`` first on the path, then this checkout's benchmark helpers (the child
    runs in an empty folder: `python -c` puts the working directory first, where a checkout would
    shadow both; the child checks which build it imported)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([tree, str(ROOT)]))


def run_build(tree: str, cap: str, args) -> dict[str, float]:
    tree = str(Path(tree).resolve())
    code = CHILD.format(tree=tree, threads=args.threads, cap=cap, ops=list(args.ops),
                        workloads=list(args.workloads), min_time=args.min_time)
    out = subprocess.run([sys.executable, "-c", code], env=child_env(tree), cwd=tempfile.gettempdir(), check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="source tree of the baseline build")
    ap.add_argument("--after", default=str(ROOT), help="source tree of the new build")
    ap.add_argument("--capabilities", nargs="+", default=["default", "avx2", "avx512"])
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.5)
    args = ap.parse_args()

    caps = []
    for cap in args.capabilities:  # only what this CPU supports
        probe = ("import inductor_lamb, sys; c = sys.argv[1]; "
                 "print(['default', 'avx2', 'avx512'].index(c) <= __import__('torch').ops.lamb._max_cpu_capability())")
        after = str(Path(args.after).resolve())
        ok = subprocess.run([sys.executable, "-c", probe, cap], env=child_env(after), cwd=tempfile.gettempdir(),
                            capture_output=True, text=True).stdout.strip()
        if ok == "True":
            caps.append(cap)
    print(f"# {machine_line(args.threads)}")
    print(f"# before: {args.before}  after: {args.after}  rounds: {args.rounds} (fastest kept)\n")
    best: dict[tuple[str, str, str], float] = {}
    for r in range(args.rounds):
        for cap in caps:
            for label, tree in (("before", args.before), ("after", args.after)):
                for row, ms in run_build(tree, cap, args).items():
                    key = (cap, row, label)
                    best[key] = min(ms, best.get(key, float("inf")))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print("| capability | op, workload | before ms | after ms | after / before |")
    print("|---|---|---|---|---|")
    rows = sorted({(cap, row) for cap, row, _ in best}, key=lambda k: (caps.index(k[0]), k[1]))
    for cap, row in rows:
        b, a = best[(cap, row, "before")], best[(cap, row, "after")]
        print(f"| {cap} | {row} | {b:.3f} | {a:.3f} | {a / b:.3f} |")


if __name__ == "__main__":
    main()
