"""Training with the step inside the backward: each param steps as soon as its grad is made, and
the grad is freed, so a training step never holds every grad at once.

    python examples/train_in_backward.py [--steps 30] [--width 1024] [--layers 8] [--threads 2] [--bucket-bytes N]

A bfloat16 MLP (no master copies, stochastic rounding) learns a fixed random teacher network with
``Lamb16`` (2 bytes of state a param). The script trains it twice, each run in a fresh process:
with the ordinary loop, then with the one added line, ``inductor_lamb.step_in_backward(opt)``.
It prints both runs' losses (the same bits: the same numbers), each run's peak memory in bytes a
param (the process's peak resident memory over the training, less what it held before the
model was made, with glibc returning freed blocks: ``MALLOC_MMAP_THRESHOLD_``) and the memory
saved.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

import torch
from torch import nn

import inductor_lamb


def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def train(args: argparse.Namespace, in_backward: bool) -> dict:
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    teacher = [torch.randn(args.width, args.width, generator=gen) / args.width ** 0.5 for _ in range(2)]
    inputs = [torch.randn(args.batch, args.width, generator=gen) for _ in range(args.steps)]

    def layers(n: int) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(*(m for _ in range(n) for m in (nn.Linear(args.width, args.width, dtype=torch.bfloat16),
                                                               nn.Tanh())))

    # (a batch steps once it holds bucket_bytes of grads: a model whose grads are all smaller saves
    # nothing at the default; --bucket-bytes 0 steps each param alone)
    bucket = {} if args.bucket_bytes is None else {"bucket_bytes": args.bucket_bytes}

    def run(model: nn.Module, steps: int) -> list[float]:
        opt = inductor_lamb.Lamb16(model.parameters(), lr=2e-3, weight_decay=0.01)
        handle = inductor_lamb.step_in_backward(opt, **bucket) if in_backward else None  # the one added line
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
        losses = []
        for x in inputs[:steps]:
            target = torch.tanh(torch.tanh(x @ teacher[0]) @ teacher[1])
            loss = nn.functional.mse_loss(model(x.bfloat16()).float(), target)
            loss.backward()   # with the handle: steps the params and frees their grads
            opt.step()        # steps what did not step in the backward (nothing here)
            opt.zero_grad()
            sched.step()
            losses.append(loss.item())
        if handle is not None:
            handle.remove()
        return losses

    run(layers(1), 2)  # (what the first steps import is code, not memory a param)
    base = resident()
    model = layers(args.layers)
    losses = run(model, args.steps)
    params = sum(p.numel() for p in model.parameters())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"losses": losses, "bytes_per_param": (peak - base) / params, "params": params}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bucket-bytes", type=int, default=None, help="step_in_backward's (default: its own, 8 MiB)")
    ap.add_argument("--run", choices=["ordinary", "in_backward"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        print(json.dumps(train(args, args.run == "in_backward")))
        return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    runs = {}
    for mode in ("ordinary", "in_backward"):
        out = subprocess.run([sys.executable, *sys.argv, "--run", mode], env=env, check=True, capture_output=True,
                             text=True)
        runs[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    ordinary, stepped = runs["ordinary"], runs["in_backward"]
    n = ordinary["params"]
    print(f"a bfloat16 MLP of {args.layers} layers of {args.width}x{args.width} ({n / 1e6:.1f}M params), Lamb16, "
          f"{args.steps} steps")
    for mode, r in runs.items():
        print(f"{mode:>12}: loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}, "
              f"peak {r['bytes_per_param']:.2f} bytes a param ({r['bytes_per_param'] * n / 2**20:.0f} MiB)")
    same = ordinary["losses"] == stepped["losses"]
    saved = (ordinary["bytes_per_param"] - stepped["bytes_per_param"]) * n / 2**20
    print(f"the same losses, step for step: {same}; the step in the backward saved {saved:.0f} MiB "
          f"({1 - stepped['bytes_per_param'] / ordinary['bytes_per_param']:.0%} of the peak)")


if __name__ == "__main__":
    main()
