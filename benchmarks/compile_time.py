"""Compile time of a compiled optimizer step against the number of parameter tensors,
cold and warm, split by compiler stage.

    python -m benchmarks.compile_time [--tensors 32 64 128 256] [--methods lamb lamb-lowering lamb-external adamw]
                                      [--threads 2] [--plot benchmarks/compile_time.png]

Each (method, N) compiles ``torch.compile(opt.step)`` in a fresh process with an
empty Inductor cache (cold), then again in a second fresh process on that cache
(warm: the FX graph cache hit). Params: the first N tensors of a BERT-like list
(small widths: compile time depends on the number of tensors, not their size).
Methods: ``lamb`` (our Lamb on the default ``"auto"`` compile path, which makes
the step of graph-input tensors one external call to our kernel),
``lamb-lowering`` (every tensor through the Inductor lowering), ``lamb-external``
(always external calls), ``adamw`` (torch's AdamW, foreach + capturable, the
usual compiled baseline).

Stages come from dynamo's own timers (``torch._dynamo.utils.compilation_time_metrics``):
dynamo = bytecode tracing + guards; aot = AOT autograd / functionalization
outside Inductor; post-grad = Inductor's FX passes; lowering = GraphLowering.run;
scheduling = Scheduler.__init__ (of which fusion = Scheduler.fused_nodes); codegen
= Scheduler.codegen without the C++ compiles in it; c++ = compile_file +
loading the generated module (which waits for the asynchronous compiles).
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

from benchmarks.common import machine_line

ROOT = Path(__file__).resolve().parent.parent

# Runs in a child process: one cold or warm compile, prints JSON.
CHILD = r"""
import json, sys, time
import torch
from benchmarks.common import bert_like_shapes
import inductor_lamb
from inductor_lamb.optim import Lamb
from torch._dynamo.utils import compilation_time_metrics as metrics
torch.set_num_threads({threads})
method, n = {method!r}, {n}
shapes = (bert_like_shapes(hidden=64, ffn=256, layers=64, vocab=512) * 8)[:n]
g = torch.Generator().manual_seed(0)
params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
for p in params:
    p.grad = torch.randn(p.shape, generator=g)
if method == "adamw":
    opt = torch.optim.AdamW(params, lr=torch.tensor(1e-3), foreach=True, capturable=True)
else:
    if method != "lamb":
        inductor_lamb.set_compile_path(method.removeprefix("lamb-"))
    opt = Lamb(params, lr=1e-3)
step = torch.compile(opt.step)
t0 = time.perf_counter()
step()
first = time.perf_counter() - t0
t0 = time.perf_counter()
for _ in range(20):
    step()
per_call = (time.perf_counter() - t0) / 20
m = {{k: sum(v) for k, v in metrics.items()}}
get = lambda k: m.get(k, 0.0)
cxx = get("compile_file") + get("PyCodeCache.load_by_key_path")
out = dict(
    first_call=first, per_call_ms=per_call * 1e3,
    dynamo=get("bytecode_tracing") + get("build_guards"),
    aot=max(get("create_aot_dispatcher_function") - get("compile_fx.<locals>.fw_compiler_base"), 0.0),
    post_grad=get("_recursive_post_grad_passes"),
    lowering=get("GraphLowering.run"),
    scheduling=get("Scheduler.__init__"), fusion=get("Scheduler.fused_nodes"),
    codegen=max(get("Scheduler.codegen") - get("compile_file"), 0.0),
    cxx=cxx)
print(json.dumps(out))
"""

STAGES = ("dynamo", "aot", "post_grad", "lowering", "scheduling", "codegen", "cxx")


def run_child(method: str, n: int, cache_dir: str, threads: int) -> dict:
    code = CHILD.format(threads=threads, method=method, n=n)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(ROOT), check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for method in dict.fromkeys(r["method"] for r in results):
        rows = [r for r in results if r["method"] == method]
        ns = [r["tensors"] for r in rows]
        ax1.plot(ns, [r["cold"]["first_call"] for r in rows], "o-", label=f"{method} cold")
        ax1.plot(ns, [r["warm"]["first_call"] for r in rows], "o--", label=f"{method} warm")
    ax1.set_xlabel("parameter tensors")
    ax1.set_ylabel("first call of torch.compile(opt.step), s")
    ax1.set_xscale("log", base=2)
    ax1.legend()
    ax1.grid(alpha=0.3)
    first = [r for r in results if r["method"] == results[0]["method"]]
    bottom = [0.0] * len(first)
    for stage in STAGES:
        vals = [r["cold"][stage] for r in first]
        ax2.bar([str(r["tensors"]) for r in first], vals, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_title(f"{results[0]['method']}, cold: where the time goes")
    ax2.set_xlabel("parameter tensors")
    ax2.set_ylabel("s")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tensors", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--methods", nargs="+", default=["lamb", "adamw"],
                    choices=["lamb", "lamb-lowering", "lamb-external", "adamw"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plot", default=None, help="PNG path")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()

    print(f"# {machine_line(args.threads)}")
    results = []
    jobs = [(m, n) for m in args.methods for n in args.tensors]
    for method, n in tqdm(jobs, desc="compiles"):
        with tempfile.TemporaryDirectory(prefix="inductor_cache_") as cache:
            cold = run_child(method, n, cache, args.threads)
            warm = run_child(method, n, cache, args.threads)
        results.append({"method": method, "tensors": n, "cold": cold, "warm": warm})

    print("\n| method | tensors | cold s | warm s | " + " | ".join(STAGES) + " | (fusion) | step ms |")
    print("|---|---|---|---|" + "---|" * len(STAGES) + "---|---|")
    for r in results:
        c = r["cold"]
        print(f"| {r['method']} | {r['tensors']} | {c['first_call']:.1f} | {r['warm']['first_call']:.1f} | "
              + " | ".join(f"{c[s]:.1f}" for s in STAGES) + f" | {c['fusion']:.1f} | {c['per_call_ms']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
