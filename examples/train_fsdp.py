"""FSDP2 + Lamb: a small GPT-style byte-level language model trained on real text
with its parameters, grads and optimizer state sharded across ranks.

    torchrun --nproc_per_node 2 examples/train_fsdp.py [--steps 60] [--compile]

CPU ranks use gloo; with CUDA each rank takes one GPU and NCCL. Text: the files
named by ``--text`` (default: the license texts every Debian/Ubuntu machine has
in /usr/share/common-licenses, else the Python standard library's sources).
Every per-tensor LAMB norm is the one of the full (unsharded) tensor: the
optimizer combines the shards' partial sums with one all_reduce per step.
Rank 0 shows progress and prints loss, step time and optimizer-step time.
Without torchrun it runs as a single process (world size 1, no sharding).
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import sysconfig
import time

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

import inductor_lamb


def load_text(patterns: list[str]) -> bytes:
    files = sorted({f for p in patterns for f in glob.glob(p) if os.path.isfile(f)})
    if not files:
        files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    data = b"\n".join(open(f, "rb").read() for f in files)
    if len(data) < 10_000:
        sys.exit(f"not enough text in {patterns}: {len(data)} bytes")
    return data


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, dim: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, dim)
        self.pos = nn.Parameter(torch.randn(context, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 256)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=16, help="sequences per rank")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--compile", action="store_true", help="torch.compile the optimizer step")
    ap.add_argument("--text", nargs="*", default=["/usr/share/common-licenses/*"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: cores / ranks)")
    args = ap.parse_args()

    distributed = "RANK" in os.environ
    cuda = torch.cuda.is_available()
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))

    data = torch.frombuffer(bytearray(load_text(args.text)), dtype=torch.uint8).long()
    torch.manual_seed(0)
    model = TinyGPT(args.dim, args.layers, 4, args.context).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    if distributed:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = inductor_lamb.Lamb(model.named_parameters(), lr=args.lr, weight_decay=0.01, max_grad_norm=1.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)
    step = torch.compile(opt.step) if args.compile else opt.step

    gen = torch.Generator().manual_seed(1234 + rank)  # each rank its own batches
    n = args.context + 1
    if rank == 0:
        print(f"{n_params / 1e6:.2f}M params, {len(data) / 1e3:.0f} kB of text, world size {world}, "
              f"{'nccl' if cuda and distributed else 'gloo' if distributed else 'single process'}, "
              f"device {device}, {torch.get_num_threads()} threads per rank")
    times, opt_times, losses = [], [], []
    bar = tqdm(range(args.steps), disable=rank != 0, desc="train")
    for k in bar:
        starts = torch.randint(0, len(data) - n, (args.batch,), generator=gen)
        seq = torch.stack([data[s : s + n] for s in starts.tolist()]).to(device)
        t0 = time.perf_counter()
        logits = model(seq[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 256), seq[:, 1:].reshape(-1))
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        step()
        opt.zero_grad()
        sched.step()
        if cuda:
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        if k >= 3:  # (warm-up and compilation excluded)
            times.append(t2 - t0)
            opt_times.append(t2 - t1)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    if rank == 0:
        mean = sum(times) / max(1, len(times))
        print(f"loss {losses[0]:.3f} -> {sum(losses[-5:]) / 5:.3f} (bits/byte {sum(losses[-5:]) / 5 / math.log(2):.2f}); "
              f"step {mean * 1e3:.1f} ms, optimizer step {sum(opt_times) / max(1, len(opt_times)) * 1e3:.1f} ms "
              f"(mean over steps 4-{args.steps})")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
