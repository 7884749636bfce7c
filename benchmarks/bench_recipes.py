"""The recipes users compile with, for every optimizer, beside torch's AdamW in the same recipe.

    python -m benchmarks.bench_recipes [--device cpu] [--threads 1] [--opt lamb lars ...] [--json out.json]
    python -m benchmarks.bench_recipes --device cuda          # adds mode="reduce-overhead"

Two tables.

**The optimizer step alone**, ``opt.step()`` eagerly against each compiled form users write
(``torch.compile(opt.step)``, ``opt.step = torch.compile(opt.step)``, the tutorials' compiled
function calling ``opt.step()``, and the same with an LR scheduler inside it, against the eager
step and scheduler), on two lists: ``blocks`` (a 12-block stack of width 64: 148 tensors, 0.66M
params) and ``small`` (1000 params of 16 elements, where host cost is all there is). An
optimizer's rows run in one process, alternating in blocks of calls over fixed grads (each
figure: the best block's median), so their ratios are side by side. In parentheses: compilations
after the first call over 20 steps while the lr changes every step (0: no recompile), and the
cold compile time.

**Training-step recipes** on the ``blocks`` model (batch 64): eager; a compiled model with an
eager step; a compiled model with ``torch.compile(opt.step)``; the whole step (forward,
backward, step, ``zero_grad``) as one graph (``trace_autograd_ops``); on CUDA also
``mode="reduce-overhead"`` for the last two. Each recipe's optimizers (ours and
``torch.optim.AdamW(fused=True)``) run in one process, alternating; "x AdamW" is the ratio to
AdamW in the same recipe from the same process.

**Compile time** of every cell comes from a fresh process with an empty Inductor cache
(``TORCHINDUCTOR_CACHE_DIR`` in a new temporary directory): the first call's time less an
eager step's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from benchmarks.common import median_seconds

ROOT = Path(__file__).resolve().parent.parent
OPTIMIZERS = ("lamb", "lamb16", "lars", "adagrad", "novograd", "adamw")
LISTS = ("blocks", "small")
RECIPES = ("eager", "compiled_model", "compiled_opt_step", "whole_step")
CUDA_RECIPES = ("compiled_opt_step_ro", "whole_step_ro")
LABELS = {"eager": "eager", "compiled_model": "compiled model, eager step",
          "compiled_opt_step": "compiled model + torch.compile(opt.step)", "whole_step": "whole step, one graph",
          "compiled_opt_step_ro": "compiled model + compiled opt.step, reduce-overhead",
          "whole_step_ro": "whole step, reduce-overhead"}


def make_optimizer(name: str, params, lr: float | torch.Tensor = 1e-3) -> torch.optim.Optimizer:
    import inductor_lamb

    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01, fused=True)
    cls = {c._ops.spec.family: c for c in inductor_lamb.optim.OPTIMIZERS}[name]
    return cls(params, lr=lr, weight_decay=0.01)


def blocks_model() -> nn.Module:
    """12 pre-LayerNorm blocks of width 64 (attention-sized and MLP matrices): 148 tensors."""

    class Block(nn.Module):
        def __init__(self, w: int) -> None:
            super().__init__()
            self.ln1, self.qkv, self.proj = nn.LayerNorm(w), nn.Linear(w, 3 * w), nn.Linear(w, w)
            self.ln2, self.up, self.down = nn.LayerNorm(w), nn.Linear(w, 4 * w), nn.Linear(4 * w, w)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.proj(self.qkv(self.ln1(x))[..., :x.shape[-1]])
            return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))

    torch.manual_seed(0)
    return nn.Sequential(*(Block(64) for _ in range(12)), nn.LayerNorm(64), nn.Linear(64, 1000))


def step_params(which: str, device: str) -> list[nn.Parameter]:
    if which == "small":
        gen = torch.Generator().manual_seed(0)
        return [nn.Parameter(torch.randn(16, generator=gen).to(device)) for _ in range(1000)]
    return [nn.Parameter(p.detach().to(device)) for p in blocks_model().parameters()]


def interleaved(fns: dict[str, Callable[[], object]], sync: Callable[[], None], blocks: int = 7,
                iters: int = 30) -> dict[str, float]:
    """Seconds per call of each function, run in turn in blocks of ``iters`` calls: the best
    block's median (the machine's quietest moment, the same moments for every function)."""
    best = {k: float("inf") for k in fns}
    for _ in range(blocks):
        for name, fn in fns.items():
            best[name] = min(best[name], median_seconds(fn, sync, iters))
    return best


# ---- cells (each runs in a process of its own) ---------------------------------------------------

# The compiled forms of the optimizer step users write, timed against the eager step (the last
# against the eager step and scheduler): PyTorch's "Compiling the optimizer" tutorial wraps the
# step in a compiled function, its LR-scheduler tutorial steps a scheduler inside it (tensor lr).
FORMS = ("compile(opt.step)", "opt.step = compile(opt.step)", "tutorial fn", "tutorial fn + scheduler")


def step_cell(opt_name: str, which: str, device: str, timed: bool) -> dict:
    """The optimizer step alone: eager against each compiled form (a fresh optimizer each)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def setup(tensor_lr: bool = False) -> tuple[torch.optim.Optimizer, object]:
        params = step_params(which, device)
        gen = torch.Generator().manual_seed(1)
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(device)
        opt = make_optimizer(opt_name, params, torch.tensor(1e-3, device=device) if tensor_lr else 1e-3)
        return opt, torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.999)

    eager_opt, _ = setup()
    sched_opt, sched = setup(tensor_lr=True)
    fns = {"eager": eager_opt.step, "eager + scheduler": lambda: (sched_opt.step(), sched.step())}
    counters, scheds = {}, {}
    for form in FORMS:
        opt, sched_f = setup(tensor_lr=form.endswith("scheduler"))
        scheds[form] = sched_f
        counter = counters[form] = CompileCounterWithBackend("inductor")
        if form == "compile(opt.step)":
            fns[form] = torch.compile(opt.step, backend=counter)
        elif form == "opt.step = compile(opt.step)":
            opt.step = torch.compile(opt.step, backend=counter)
            fns[form] = opt.step
        else:
            def fn(opt=opt, sched_f=sched_f, with_sched=form.endswith("scheduler")):
                opt.step()
                if with_sched:
                    sched_f.step()
            fns[form] = torch.compile(fn, backend=counter)
    eager_opt.step()
    sync()
    t0 = time.perf_counter()
    eager_opt.step()
    sync()
    eager_s = time.perf_counter() - t0
    out: dict = {"compile_s": {}, "graphs": {}}
    for form in FORMS:
        t0 = time.perf_counter()
        fns[form]()
        sync()
        out["compile_s"][form] = max(0.0, time.perf_counter() - t0 - eager_s)
        first = counters[form].frame_count
        for _ in range(20):  # (the lr changes every step: a recompile would show)
            fns[form]()
            if not form.endswith("scheduler"):
                scheds[form].step()
        out["graphs"][form] = counters[form].frame_count - first  # (compilations after the first call)
    if timed:
        out.update(interleaved(fns, sync))
    return out


def recipe_step(recipe: str, model: nn.Module, opt: torch.optim.Optimizer) -> Callable[[torch.Tensor, torch.Tensor], object]:
    """One training step of ``recipe`` on ``model`` and ``opt`` (compiled on first call)."""
    loss_fn = nn.functional.cross_entropy

    def eager_step(m: nn.Module, step: Callable[[], object]) -> Callable[[torch.Tensor, torch.Tensor], object]:
        def run(x: torch.Tensor, y: torch.Tensor) -> object:
            loss_fn(m(x), y).backward()
            step()
            opt.zero_grad(set_to_none=True)

        return run

    if recipe == "eager":
        return eager_step(model, opt.step)
    if recipe == "compiled_model":
        return eager_step(torch.compile(model), opt.step)
    if recipe.startswith("compiled_opt_step"):
        mode = "reduce-overhead" if recipe.endswith("_ro") else None
        return eager_step(torch.compile(model), torch.compile(opt.step, mode=mode))

    def whole(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    mode = "reduce-overhead" if recipe.endswith("_ro") else None
    compiled = torch.compile(whole, mode=mode, fullgraph=not isinstance(opt, torch.optim.AdamW))
    return compiled


def train_cell(recipe: str, opt_names: list[str], device: str, timed: bool) -> dict:
    """Training-step recipe ``recipe`` for each optimizer: cold compile time (first of them),
    and with ``timed`` every optimizer's step time, alternating."""
    torch._dynamo.config.trace_autograd_ops = recipe.startswith("whole_step")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(64, 64, generator=gen).to(device), torch.randint(0, 1000, (64,), generator=gen).to(device)
    steps, out = {}, {}
    for name in opt_names:
        model = blocks_model().to(device)
        opt = make_optimizer(name, model.parameters())
        step = recipe_step(recipe, model, opt)
        t0 = time.perf_counter()
        step(x, y)
        sync()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        step(x, y)
        sync()
        out.setdefault("compile_s", {})[name] = max(0.0, first - 2 * (time.perf_counter() - t0))
        steps[name] = lambda step=step: step(x, y)
    if timed:
        out.update(interleaved(steps, sync, blocks=5, iters=10))
    return out


def run_child(kind: str, spec: dict, threads: int) -> dict:
    """Runs one cell in a fresh process with an empty Inductor cache; returns its JSON."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor", "TRITON_CACHE_DIR": f"{cache}/triton",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_recipes", "--child", kind, json.dumps(spec),
                               "--threads", str(threads)], env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--opt", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS)
    ap.add_argument("--lists", nargs="*", default=list(LISTS), choices=LISTS)
    ap.add_argument("--recipes", nargs="*", default=None, help=f"of {RECIPES + CUDA_RECIPES} (default: all)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        import inductor_lamb  # noqa: F401

        kind, spec = args.child[0], json.loads(args.child[1])
        print(json.dumps((step_cell if kind == "step" else train_cell)(**spec)))
        return
    recipes = args.recipes if args.recipes is not None else \
        list(RECIPES) + (list(CUDA_RECIPES) if args.device == "cuda" else [])
    from benchmarks.common import machine_line

    result: dict = {"machine": machine_line(args.threads), "device": args.device, "step": {}, "train": {}}
    # step times before the cold compiles: a run cut short keeps the times
    jobs = [("step", w, o) for w in args.lists for o in args.opt] + \
           [("train-timed", r, None) for r in recipes] + \
           [("train", r, o) for r in recipes if r != "eager" for o in args.opt]
    for kind, what, opt in tqdm(jobs, desc="cells (a fresh process each)"):
        try:
            run_cell(result, kind, what, opt, args)
        except RuntimeError as e:  # a cell that fails leaves its error, the others still run
            print(f"{kind} {what} {opt or ''}: {str(e)[-2000:]}", file=sys.stderr)
        if args.json:  # (after every cell: a run cut short keeps what it measured)
            args.json.write_text(json.dumps(result, indent=1))
    print(result["machine"])
    print_tables(result, args.opt)


def run_cell(result: dict, kind: str, what: str, opt: str | None, args: argparse.Namespace) -> None:
    """One cell of main's jobs, in a fresh process, its figures added to ``result``."""
    if kind == "step":
        result["step"][f"{what}/{opt}"] = run_child("step", dict(opt_name=opt, which=what, device=args.device,
                                                                 timed=True), args.threads)
    elif kind == "train":
        cell = run_child("train", dict(recipe=what, opt_names=[opt], device=args.device, timed=False),
                         args.threads)
        result["train"].setdefault(what, {}).setdefault("compile_s", {})[opt] = cell["compile_s"][opt]
    else:
        cell = run_child("train", dict(recipe=what, opt_names=list(args.opt), device=args.device, timed=True),
                         args.threads)
        result["train"].setdefault(what, {}).update({k: v for k, v in cell.items() if k != "compile_s"})


def print_tables(result: dict, opts: list[str]) -> None:
    print("\nThe optimizer step alone: each compiled form against the eager step (the scheduler form against")
    print("the eager step and scheduler); compilations after the first call over 20 steps; cold compile\n")
    print("| list | optimizer | eager ms | " + " | ".join(FORMS) + " |")
    print("|---|---|---|" + "---|" * len(FORMS))
    for key, r in result["step"].items():
        which, opt = key.split("/")
        cells = []
        for form in FORMS:
            base = r["eager + scheduler"] if form.endswith("scheduler") else r["eager"]
            cells.append(f"{r[form] / base:.2f}x ({r['graphs'][form]}; {r['compile_s'][form]:.1f} s)")
        print(f"| {which} | {opt} | {r['eager'] * 1e3:.3f} | " + " | ".join(cells) + " |")
    print("\nTraining-step recipes (ms a step; x AdamW in the same recipe; cold compile s)\n")
    print("| recipe | " + " | ".join(opts) + " |")
    print("|---|" + "---|" * len(opts))
    for recipe in (r for r in RECIPES + CUDA_RECIPES if r in result["train"]):
        r = result["train"][recipe]
        cells = []
        for opt in opts:
            ms = r.get(opt, float("nan")) * 1e3
            ratio = r.get(opt, float("nan")) / r.get("adamw", float("nan")) if "adamw" in r else float("nan")
            compile_s = r.get("compile_s", {}).get(opt, 0.0)
            cells.append(f"{ms:.2f} ({ratio:.2f}x; {compile_s:.1f} s)" if opt != "adamw" else
                         f"{ms:.2f} ({compile_s:.1f} s)")
        print(f"| {LABELS[recipe]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
