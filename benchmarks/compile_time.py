"""Where the compile time of the whole training step goes, per optimizer, cold and warm.

    python -m benchmarks.compile_time [--opt lamb lamb16 lars adagrad adamw] [--path auto]
                                      [--threads 1] [--json out.json] [--plot benchmarks/compile_time.png]

The whole step (forward, backward, ``opt.step()``, ``zero_grad``; ``trace_autograd_ops``, as
``examples/train_mnist.py`` and recipe (a) of docs/compile.md compile it) of ``bench_recipes``'s
``blocks`` model (148 tensors), compiled in a fresh process with an empty Inductor cache (cold),
then in a second fresh process on that cache (warm: what a restart pays). torch's
``AdamW(fused=True)`` runs the same recipe (its step graph-breaks out of the graph: torch runs its
fused step eagerly).

Stages come from torch's own timers (``benchmarks.common.compile_stages``: Dynamo, AOT autograd,
Inductor's post-grad passes, lowering, scheduling and fusion, code generation, the C++ compile).
``hits``: FX graph and AOT autograd cache hits of the process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tqdm import tqdm

from benchmarks.common import COMPILE_STAGES, machine_line

ROOT = Path(__file__).resolve().parent.parent
OPTIMIZERS = ("lamb", "lamb16", "lars", "adagrad", "adamw")
STAGES = COMPILE_STAGES

# Runs in a child process: one cold or warm compile of the whole step, prints JSON.
CHILD = r"""
import json, time
import torch
import inductor_lamb
from torch._dynamo.utils import counters
from benchmarks.bench_recipes import blocks_model, make_optimizer, recipe_step
from benchmarks.common import compile_stages
torch.set_num_threads({threads})
if {path!r} != "auto":
    inductor_lamb.set_compile_path({path!r})
torch._dynamo.config.trace_autograd_ops = True
gen = torch.Generator().manual_seed(2)
x, y = torch.randn(64, 64, generator=gen), torch.randint(0, 1000, (64,), generator=gen)
model = blocks_model()
opt = make_optimizer({opt!r}, model.parameters())
step = recipe_step("whole_step", model, opt)
t0 = time.perf_counter()
step(x, y)
first = time.perf_counter() - t0
t0 = time.perf_counter()
for _ in range(10):
    step(x, y)
per_step = (time.perf_counter() - t0) / 10
print(json.dumps(dict(
    compile_s=max(first - per_step, 0.0), step_ms=per_step * 1e3, **compile_stages(),
    hits=dict(fx_graph=counters["inductor"]["fxgraph_cache_hit"],
              aot_autograd=counters["aot_autograd"]["autograd_cache_hit"]),
    misses=dict(fx_graph=counters["inductor"]["fxgraph_cache_miss"],
                aot_autograd=counters["aot_autograd"]["autograd_cache_miss"]))))
"""


def run_child(opt: str, path: str, cache_dir: str, threads: int) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    code = CHILD.format(opt=opt, path=path, threads=threads)
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{opt} ({path}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(opt: str, path: str, threads: int) -> dict:
    """A cold compile in a fresh process with an empty cache, then a warm one on that cache."""
    with tempfile.TemporaryDirectory() as cache:
        cold = run_child(opt, path, cache, threads)
        warm = run_child(opt, path, cache, threads)
    return {"opt": opt, "path": path, "cold": cold, "warm": warm}


def plot(rows: list[dict], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['opt']}\n{r['path']}" for r in rows]
    bottom = [0.0] * len(rows)
    for stage in STAGES:
        values = [r["cold"][stage] for r in rows]
        ax.bar(labels, values, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.plot(labels, [r["cold"]["compile_s"] for r in rows], "k_", markersize=40, label="cold compile (total)")
    ax.plot(labels, [r["warm"]["compile_s"] for r in rows], "kD", label="warm start (total)")
    ax.set_ylabel("seconds")
    ax.set_title("Whole training step (148 tensors): cold compile by stage (torch's timers overlap)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--opt", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS)
    ap.add_argument("--path", nargs="+", default=["auto"], choices=["auto", "lowering", "external"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=str, default=None)
    args = ap.parse_args()
    rows = [measure(opt, path, args.threads)
            for opt, path in tqdm([(o, p) for p in args.path for o in args.opt], desc="fresh processes")]
    print(machine_line(args.threads))
    adamw = next((r for r in rows if r["opt"] == "adamw"), None)
    print("\n| optimizer | path | cold s | x AdamW | " + " | ".join(STAGES) + " | warm s | warm hits | step ms |")
    print("|---|---|---|---|" + "---|" * len(STAGES) + "---|---|---|")
    for r in rows:
        c, w = r["cold"], r["warm"]
        ratio = c["compile_s"] / adamw["cold"]["compile_s"] if adamw else float("nan")
        hits = f"{w['hits']['fx_graph']} fx, {w['hits']['aot_autograd']} aot"
        print(f"| {r['opt']} | {r['path']} | {c['compile_s']:.1f} | {ratio:.2f}x | "
              + " | ".join(f"{c[s]:.1f}" for s in STAGES)
              + f" | {w['compile_s']:.1f} | {hits} | {c['step_ms']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
