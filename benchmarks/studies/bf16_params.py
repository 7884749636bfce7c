"""bfloat16 params without float32 master copies: what stochastic rounding keeps, side by side.

    pip install transformers && pip install --no-deps torchao   # (torchao: its row only)
    python -m benchmarks.studies.bf16_params [--steps 500] [--seeds 0 1 2] [--lr-scale 1] [--recipes ...] \
        [--threads 2] [--json benchmarks/studies/bf16_params.json] [--plot benchmarks/studies/bf16_params.png]

The small GPT-2 of lm_convergence.py (same model, text, batches, schedule, clipping and seed), with
its params in bfloat16, trained by each recipe:

    AdamW + fp32 master     torch's fused AdamW on float32 master copies (the usual mixed precision)
    Lamb + master           Lamb(master_weights=True)
    Lamb16 + master         Lamb16(master_weights=True)
    Lamb, nearest           Lamb on the bf16 params, rounded to nearest (stochastic_rounding=False)
    Lamb, stochastic        Lamb on the bf16 params, rounded stochastically (the default)
    Lamb16, nearest         Lamb16, params and float8 moments rounded to nearest
    Lamb16, stochastic      Lamb16, params and moments rounded stochastically (the default)
    torchao AdamW8bit (SR)  torchao's 8-bit AdamW with bf16_stochastic_round=True (its peer)

Each at its optimizer's best learning rate of lm_convergence.py's sweep (AdamW 3e-3, LAMB 3e-2,
LAMB16 1e-2; torchao's AdamW that of AdamW), times --lr-scale (smaller rates: smaller updates,
which rounding to nearest loses more of). Reported: validation loss every --eval-every steps
(the plot) and at the end, bytes per param (params + grads + optimizer state + master copies,
measured from the tensors), and the optimizer step's time in the same run (median over the
steps, master-copy traffic included).
"""

from __future__ import annotations

import inspect
import json
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

HERE = Path(__file__).resolve().parent
import inductor_lamb
from benchmarks.common import machine_line, torchao_low_bit
from benchmarks.studies.lm_convergence import (
    BATCH,
    CLIP,
    MODEL,
    batch_at,
    evaluate,
    load_text,
    lr_factor,
    make_model,
    param_groups,
    study_args,
)
from inductor_lamb.testing.memory import state_bytes_per_param, torchao_block_size

LR = {"AdamW": 3e-3, "Lamb": 3e-2, "Lamb16": 1e-2}


class MasterAdamW:
    """torch's fused AdamW on float32 master copies of bf16 params: grads cast up, the step on
    the masters, the masters rounded back into the params (to nearest)."""

    def __init__(self, groups: list[dict], lr: float) -> None:
        self.params = [p for g in groups for p in g["params"]]
        self.masters = [p.detach().float().requires_grad_() for p in self.params]
        index = {id(p): m for p, m in zip(self.params, self.masters)}
        master_groups = [{**g, "params": [index[id(p)] for p in g["params"]]} for g in groups]
        self.inner = torch.optim.AdamW(master_groups, lr=lr, betas=(0.9, 0.999), eps=1e-6, fused=True)
        self.param_groups = self.inner.param_groups
        self.state = self.inner.state

    @torch.no_grad()
    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad = p.grad.float()
        self.inner.step()
        torch._foreach_copy_(self.params, self.masters)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def extra_bytes(self) -> int:
        return sum(m.numel() * 4 for m in self.masters)


def recipes() -> dict[str, tuple[str, Callable[[list[dict], float], object]]]:
    """name -> (lr key, factory(groups, lr))."""
    out: dict[str, tuple[str, Callable]] = {
        "AdamW + fp32 master": ("AdamW", MasterAdamW),
        "Lamb + master": ("Lamb", lambda g, lr: inductor_lamb.Lamb(g, lr=lr, eps=1e-6, master_weights=True)),
        "Lamb16 + master": ("Lamb16", lambda g, lr: inductor_lamb.Lamb16(g, lr=lr, eps=1e-6, master_weights=True)),
        "Lamb, nearest": ("Lamb", lambda g, lr: inductor_lamb.Lamb(g, lr=lr, eps=1e-6, stochastic_rounding=False)),
        "Lamb, stochastic": ("Lamb", lambda g, lr: inductor_lamb.Lamb(g, lr=lr, eps=1e-6)),
        "Lamb16, nearest": ("Lamb16", lambda g, lr: inductor_lamb.Lamb16(g, lr=lr, eps=1e-6,
                                                                        stochastic_rounding=False)),
        "Lamb16, stochastic": ("Lamb16", lambda g, lr: inductor_lamb.Lamb16(g, lr=lr, eps=1e-6)),
    }
    cls = torchao_low_bit().get("torchao AdamW8bit")
    if cls is not None:
        largest = inspect.signature(cls).parameters["block_size"].default

        def torchao_8bit(groups, lr):
            model_params = [p for g in groups for p in g["params"]]
            block = torchao_block_size(_Params(model_params), largest)
            return cls(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6, block_size=block, bf16_stochastic_round=True)

        out["torchao AdamW8bit (SR)"] = ("AdamW", torchao_8bit)
    return out


class _Params(nn.Module):
    """A module holding given params (torchao_block_size reads a model's parameters())."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        super().__init__()
        self.ps = nn.ParameterList(params)


def bytes_per_param(model: nn.Module, opt) -> float:
    n = sum(p.numel() for p in model.parameters())
    params_and_grads = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    inner = getattr(opt, "inner", opt)
    extra = opt.extra_bytes() if hasattr(opt, "extra_bytes") else 0
    return (params_and_grads + extra) / n + state_bytes_per_param(inner)


def run(name: str, steps: int, seed: int, data, eval_every: int, lr_scale: float = 1.0) -> dict:
    lr_key, factory = recipes()[name]
    train, val = data
    model = make_model(seed).bfloat16()
    opt = factory(param_groups(model), LR[lr_key] * lr_scale)
    base_lrs = [g["lr"] if not torch.is_tensor(g["lr"]) else float(g["lr"]) for g in opt.param_groups]
    gen = torch.Generator().manual_seed(seed + 1)
    hist: dict = {"eval_step": [], "val_loss": [], "step_ms": []}
    for step in tqdm(range(steps), desc=name, leave=False):
        for g, base in zip(opt.param_groups, base_lrs):  # (torchao's lr is a tensor it wants filled)
            if torch.is_tensor(g["lr"]):
                g["lr"].fill_(base * lr_factor(step, steps))
            else:
                g["lr"] = base * lr_factor(step, steps)
        x = batch_at(train, torch.randint(0, len(train) - MODEL["n_positions"], (BATCH,), generator=gen))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        t0 = time.perf_counter()
        opt.step()
        hist["step_ms"].append((time.perf_counter() - t0) * 1e3)
        if not math.isfinite(loss.item()):
            hist["val_loss"].append(float("nan"))
            break
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            hist["eval_step"].append(step + 1)
            hist["val_loss"].append(evaluate(model, val))
    hist["final_val_loss"] = hist["val_loss"][-1]
    hist["bytes_per_param"] = bytes_per_param(model, opt)
    hist["median_step_ms"] = statistics.median(hist["step_ms"][5:] or hist["step_ms"])
    return hist


def plot(results: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name, runs in results.items():
        h = runs[0]
        style = "--" if "master" in name else (":" if "nearest" in name else "-")
        ax.plot(h["eval_step"], h["val_loss"], style, label=f"{name} ({h['bytes_per_param']:.0f} B/param): "
                f"{_mean(runs):.3f}")
    ax.set(xlabel="step", ylabel="validation loss (nats/byte), first seed", yscale="log", title=title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def _mean(runs: list[dict]) -> float:
    return statistics.fmean(h["final_val_loss"] for h in runs)


def main() -> None:
    names = list(recipes())
    ap = study_args(__doc__, "bf16_params")
    ap.add_argument("--recipes", nargs="+", default=names, choices=names)
    ap.add_argument("--lr-scale", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = load_text()
    results: dict[str, list[dict]] = {}
    for name in tqdm(args.recipes, desc="recipes"):
        results[name] = [run(name, args.steps, seed, data, args.eval_every, args.lr_scale) for seed in args.seeds]
    ref = results.get("Lamb + master")
    print(f"\n# {machine_line(args.threads)}")
    print(f"# GPT-2 {MODEL} in bfloat16, batch {BATCH}, {args.steps} steps, lr x {args.lr_scale:g}, "
          f"seeds {args.seeds}")
    print("| recipe | bytes/param | final val loss (mean +- std) | per seed | vs Lamb + master | step ms |")
    print("|---|---|---|---|---|---|")
    for name, runs in results.items():
        finals = [h["final_val_loss"] for h in runs]
        std = statistics.stdev(finals) if len(finals) > 1 else 0.0
        vs = f"{100 * (_mean(runs) / _mean(ref) - 1):+.2f}%" if ref else ""
        step_ms = statistics.median(h["median_step_ms"] for h in runs)
        print(f"| {name} | {runs[0]['bytes_per_param']:.2f} | {_mean(runs):.4f} +- {std:.4f} | "
              f"{' '.join(f'{x:.4f}' for x in finals)} | {vs} | {step_ms:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": MODEL, "batch": BATCH, "steps": args.steps, "seeds": args.seeds, "lr": LR,
                       "lr_scale": args.lr_scale, "threads": args.threads, "results": results}, f)
    if args.plot:
        plot(results, args.plot, f"GPT-2 {MODEL['n_layer']}L x {MODEL['n_embd']} in bfloat16, {args.steps} steps, "
             f"lr x {args.lr_scale:g}")


if __name__ == "__main__":
    main()
