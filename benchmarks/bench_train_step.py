"""A whole training step (forward, backward, optimizer step, zero_grad) compiled as
one graph, with the optimizer step on each compile path (the default "auto", which
lowers it here since the graph computes the grads; always lowered into Inductor IR;
an external call to our kernel), against the same step run eagerly.

    python benchmarks/bench_train_step.py [--opt lamb lamb16] [--blocks 8] [--hidden 512] [--threads 2]

The model is a stack of pre-LayerNorm MLP blocks with BERT-like widths (4x FFN),
so the step has many tensors of mixed sizes. All rows come from one process;
each compiled row recompiles (``torch._dynamo.reset()``) with the op's compile
path set per op (``set_compile_path(path, ops=...)``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_THREADS, bench, machine_line  # noqa: E402

import inductor_lamb  # noqa: E402

OPTIMIZERS = {"lamb": (inductor_lamb.Lamb, "lamb_step_"), "lamb16": (inductor_lamb.Lamb16, "lamb16_step_")}


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def make_model(blocks: int, hidden: int, classes: int = 10) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(Block(hidden) for _ in range(blocks)), nn.LayerNorm(hidden), nn.Linear(hidden, classes))


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--opt", nargs="+", default=["lamb", "lamb16"], choices=list(OPTIMIZERS))
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--min-time", type=float, default=2.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch._dynamo.config.trace_autograd_ops = True  # loss.backward() inside the compiled graph (torch 2.13)

    print(machine_line(args.threads))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.hidden, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    for kind in args.opt:
        cls, op = OPTIMIZERS[kind]
        model = make_model(args.blocks, args.hidden)
        params = list(model.parameters())
        print(f"\n{kind.upper()}: {len(params)} tensors, {sum(p.numel() for p in params) / 1e6:.1f}M params, "
              f"batch {args.batch}")
        print("| step                               |       ms | vs eager | compile s |")
        print("|------------------------------------|----------|----------|-----------|")
        rows = []
        paths = [("eager", None), ("compiled, auto (default)", "auto"), ("compiled, lowering", "lowering"),
                 ("compiled, external", "external")]
        for name, path in tqdm(paths, desc=kind, file=sys.stderr, leave=False):
            model = make_model(args.blocks, args.hidden)
            opt = cls(model.parameters(), lr=1e-3, weight_decay=0.01)
            fn = lambda: train_step(model, opt, x, y)  # noqa: E731
            compile_s = 0.0
            if path is not None:
                inductor_lamb.set_compile_path(path, ops=op)
                torch._dynamo.reset()
                step = torch.compile(train_step, fullgraph=True)
                fn = lambda: step(model, opt, x, y)  # noqa: E731
                start = time.perf_counter()
                fn()
                compile_s = time.perf_counter() - start
            rows.append((name, bench(fn, min_time=args.min_time), compile_s))
        inductor_lamb.set_compile_path()  # back to the default ("auto")
        for name, t, c in rows:
            print(f"| {name:34s} | {t * 1e3:8.2f} | {t / rows[0][1]:7.2f}x | {c:9.1f} |")


if __name__ == "__main__":
    main()
