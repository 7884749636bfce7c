"""Language-model evidence for LAMB16: AdamW vs LAMB vs LAMB16 on a small GPT-2.

    pip install transformers  # needs no torch of its own
    python -m benchmarks.studies.lm_convergence [--steps 500] [--seeds 0] [--threads 2] \
        [--plot benchmarks/studies/lm_convergence.png] [--json benchmarks/studies/lm_convergence.json]

Model: ``transformers.GPT2LMHeadModel`` built from a config (4 layers, width 128, 4 heads,
context 128, byte-level vocabulary of 256; about 0.84M parameters, no download). Text:
the Python language reference and library topics that ship with CPython
(``pydoc_data.topics``, about 465 KB of English prose and code), so every machine with
Python has the same corpus. The first 90% of its bytes is the training set, the last
10% the validation set.

Each optimizer is swept over a small learning-rate grid (linear warm-up for 5% of the
steps, then cosine decay to 10%); weight decay 0.01 on matrices and embeddings, none on
biases and LayerNorm (LAMB's trust ratio follows weight decay, as in BERT); global
gradient clipping at 1.0 for all. Every run starts from the same weights and sees the
same batches. The table gives the final validation loss (nats per byte) at each
learning rate and the best per optimizer; the goal is LAMB16 within 1% of LAMB with a
quarter of its optimizer state.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

import inductor_lamb

HERE = Path(__file__).resolve().parent

MODEL = dict(n_layer=4, n_embd=128, n_head=4, n_positions=128, vocab_size=256)
BATCH = 32
WEIGHT_DECAY = 0.01
CLIP = 1.0
# LAMB16 is the write-up's variant (no bias correction, a damped trust ratio, see Lamb16's
# docstring): at the same lr its steps are several times LAMB's, so its grid sits lower.
LR_GRID = {
    "AdamW": [3e-4, 1e-3, 3e-3, 1e-2],
    "LAMB": [3e-3, 1e-2, 3e-2, 1e-1],
    "LAMB16": [1e-3, 3e-3, 1e-2, 3e-2],
    "NovoGrad": [1e-2, 3e-2, 1e-1, 3e-1, 1.0],
}
OPTIMIZERS = {
    "AdamW": lambda groups, lr: torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6),
    "LAMB": lambda groups, lr: inductor_lamb.Lamb(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6),
    "LAMB16": lambda groups, lr: inductor_lamb.Lamb16(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6),
    # timm's betas, with grad averaging (each tensor moves about lr a step)
    "NovoGrad": lambda groups, lr: inductor_lamb.NovoGrad(groups, lr=lr, grad_averaging=True),
    # (not in the default run) LAMB16 with its moments rounded to nearest
    "LAMB16-nearest": lambda groups, lr: inductor_lamb.Lamb16(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6,
                                                              stochastic_rounding=False),
}
DEFAULT_OPTIMIZERS = ["AdamW", "LAMB", "LAMB16", "NovoGrad"]


def load_text() -> tuple[torch.Tensor, torch.Tensor]:
    """The bytes of CPython's bundled documentation topics, split 90/10 into train/validation."""
    from pydoc_data.topics import topics

    data = torch.frombuffer(bytearray("\n\n".join(topics[k] for k in sorted(topics)).encode()), dtype=torch.uint8)
    split = int(0.9 * len(data))
    return data[:split].long(), data[split:].long()


def make_model(seed: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(**MODEL, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def param_groups(model: nn.Module) -> list[dict]:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]


def lr_factor(step: int, total: int) -> float:
    warm = max(1, total // 20)
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def batch_at(data: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    ctx = MODEL["n_positions"]
    return torch.stack([data[s : s + ctx] for s in starts.tolist()])


@torch.no_grad()
def evaluate(model: nn.Module, val: torch.Tensor) -> float:
    """Mean loss over non-overlapping windows covering the validation set."""
    ctx = MODEL["n_positions"]
    starts = torch.arange(0, len(val) - ctx, ctx)
    model.eval()
    losses = [model(input_ids=(x := batch_at(val, starts[i : i + 64])), labels=x).loss.item() * len(x)
              for i in range(0, len(starts), 64)]
    model.train()
    return sum(losses) / len(starts)


def run(name: str, lr: float, steps: int, seed: int, data, eval_every: int) -> dict:
    train, val = data
    model = make_model(seed)
    opt = OPTIMIZERS[name](param_groups(model), lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps))
    gen = torch.Generator().manual_seed(seed + 1)
    hist = {"step": [], "train_loss": [], "eval_step": [], "val_loss": []}
    running, t0 = [], time.perf_counter()
    for step in tqdm(range(steps), desc=f"{name} lr={lr:g} seed={seed}", leave=False):
        x = batch_at(train, torch.randint(0, len(train) - MODEL["n_positions"], (BATCH,), generator=gen))
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
        running.append(loss.item())
        if not math.isfinite(running[-1]):  # diverged: no final loss
            hist["val_loss"].append(float("nan"))
            break
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            hist["step"].append(step + 1)
            hist["train_loss"].append(statistics.fmean(running))
            running = []
            hist["eval_step"].append(step + 1)
            hist["val_loss"].append(evaluate(model, val))
    hist["final_val_loss"] = hist["val_loss"][-1]
    hist["seconds"] = time.perf_counter() - t0
    if hasattr(opt, "state_bytes_per_param"):
        hist["state_bytes_per_param"] = opt.state_bytes_per_param()
    return hist


def plot(results: dict, best: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, by_lr in results.items():
        runs = by_lr[best[name]]
        h = runs[0]
        for ax, (xs, ys) in zip(axes, [(h["step"], h["train_loss"]), (h["eval_step"], h["val_loss"])]):
            ax.plot(xs, ys, label=f"{name} (lr {best[name]:g})")
    axes[0].set(xlabel="step", ylabel="train loss (nats/byte)", title="training loss, best lr each", yscale="log")
    axes[1].set(xlabel="step", ylabel="validation loss (nats/byte)", title="validation loss, best lr each",
                yscale="log")
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    fig.suptitle(f"GPT-2 {MODEL['n_layer']}L x {MODEL['n_embd']}, batch {BATCH} x {MODEL['n_positions']} bytes, "
                 "CPython docs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"saved {path}")


def study_args(doc: str, name: str) -> argparse.ArgumentParser:
    """The options of a study on this GPT-2 (this one's, bf16_params'): steps, seeds, evaluation
    interval, threads, and where its JSON and plot go (beside it, named ``name``)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--plot", default=str(HERE / f"{name}.png"))
    ap.add_argument("--json", default=str(HERE / f"{name}.json"))
    return ap


def main() -> None:
    ap = study_args(__doc__, "lm_convergence")
    ap.add_argument("--optimizers", nargs="+", default=DEFAULT_OPTIMIZERS, choices=list(OPTIMIZERS))
    ap.add_argument("--lrs", type=float, nargs="+", default=None, help="one grid for every optimizer")
    ap.add_argument("--keep", action="store_true",
                    help="keep the JSON's runs (same steps and seeds) and run only the missing ones: an optimizer "
                         "or learning rates added to the study")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = load_text()
    results: dict[str, dict[float, list[dict]]] = {}
    if args.keep and Path(args.json).exists():
        old = json.loads(Path(args.json).read_text())
        if (old["steps"], old["seeds"], old["batch"]) != (args.steps, args.seeds, BATCH):
            raise SystemExit(f"--keep: {args.json} has steps {old['steps']}, seeds {old['seeds']}, batch {old['batch']}")
        for name, by_lr in old["results"].items():
            results[name] = {float(lr): runs for lr, runs in by_lr.items()}
    for name in args.optimizers:
        grid = args.lrs or LR_GRID.get(name, LR_GRID["LAMB16"])
        done = results.setdefault(name, {})
        for lr in grid:
            if lr not in done:
                done[lr] = [run(name, lr, args.steps, s, data, args.eval_every) for s in args.seeds]
        results[name] = dict(sorted(done.items()))

    def final(runs: list[dict]) -> float:
        return statistics.fmean(h["final_val_loss"] for h in runs)

    best = {name: min(by_lr, key=lambda lr: (math.isnan(final(by_lr[lr])), final(by_lr[lr])))
            for name, by_lr in results.items()}
    nparams = sum(p.numel() for p in make_model(0).parameters())
    print(f"\nGPT-2 {MODEL}, {nparams / 1e6:.2f}M params; {len(data[0])} train / {len(data[1])} val bytes; "
          f"batch {BATCH}; {args.steps} steps; seeds {args.seeds}; torch {torch.__version__}, {args.threads} threads")
    print(f"{'optimizer':15s} {'lr':>7s} {'final val loss':>15s} {'per seed':>24s} {'state B/param':>13s} {'s/run':>6s}")
    for name, by_lr in results.items():
        for lr, runs in by_lr.items():
            sb = runs[0].get("state_bytes_per_param")
            seeds = " ".join(f"{h['final_val_loss']:.4f}" for h in runs)
            mark = " *" if lr == best[name] else ""
            print(f"{name:15s} {lr:7g} {final(runs):15.4f} {seeds:>24s} {'' if sb is None else f'{sb:.3f}':>13s} "
                  f"{statistics.fmean(h['seconds'] for h in runs):6.0f}{mark}")
    if "LAMB" in best and "LAMB16" in best:
        lamb, lamb16 = final(results["LAMB"][best["LAMB"]]), final(results["LAMB16"][best["LAMB16"]])
        print(f"best LAMB16 / best LAMB final val loss: {lamb16 / lamb:.4f} ({100 * (lamb16 / lamb - 1):+.2f}%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": MODEL, "batch": BATCH, "steps": args.steps, "seeds": args.seeds,
                       "threads": args.threads, "best_lr": best,
                       "results": {n: {str(lr): runs for lr, runs in r.items()} for n, r in results.items()}}, f)
    if args.plot:
        plot(results, best, args.plot)


if __name__ == "__main__":
    main()
