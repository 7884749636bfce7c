"""Optimizer step under FSDP2 (2 ranks, gloo) vs unsharded (1 process) on the same
total model, side by side in one run, plus the collectives a sharded step issues.

    python -m benchmarks.bench_fsdp [--optimizers lamb lamb_clip lamb16 lars] [--dim 384 --layers 6]

Both sides use the same cores: the unsharded process runs with all ``--threads``,
each of the 2 ranks with half. Per sharded step it counts the collectives the
optimizer issues (wrapping the functional collectives it calls) with their
bytes, and times the same collectives alone. Prints a markdown table for
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import inductor_lamb
from examples.train_fsdp import TinyGPT
from inductor_lamb.optim import _sharding

OPTIMIZERS = {
    "lamb": lambda ps: inductor_lamb.Lamb(ps, lr=1e-3, weight_decay=0.01),
    "lamb_clip": lambda ps: inductor_lamb.Lamb(ps, lr=1e-3, weight_decay=0.01, max_grad_norm=1.0),
    "lamb16": lambda ps: inductor_lamb.Lamb16(ps, lr=1e-3, weight_decay=0.01),
    "lars": lambda ps: inductor_lamb.Lars(ps, lr=1e-1),
}


def build(args: argparse.Namespace, mesh) -> torch.nn.Module:
    torch.manual_seed(0)
    model = TinyGPT(args.dim, args.layers, 4, 64)
    if mesh is not None:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    for p in model.parameters():  # (random grads of the right layout, without a backward pass)
        p.grad = torch.randn_like(p) * 1e-2
    return model


class CollectiveLog:
    """Counts and sizes the functional collectives the optimizer calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, ...], torch.dtype, int]] = []
        self.enabled = False
        import torch.distributed._functional_collectives as funcol  # (what _sharding calls, imported there lazily)

        for name in ("all_reduce", "all_gather_single", "all_gather_tensor"):
            if not hasattr(funcol, name):
                continue
            original = getattr(funcol, name)

            def wrapper(t, *a, _name=name, _orig=original, **k):
                if self.enabled:
                    self.calls.append((_name, tuple(t.shape), t.dtype, t.numel() * t.element_size()))
                return _orig(t, *a, **k)

            setattr(funcol, name, wrapper)


def median_ms(fn, iters: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def time_collectives(calls, mesh, iters: int) -> float:
    """ms for issuing the step's collectives alone (same shapes, waited)."""
    import torch.distributed._functional_collectives as funcol

    tensors = [(name, torch.rand(shape, dtype=dtype)) for name, shape, dtype, _ in calls]

    def run():
        for name, t in tensors:
            if name == "all_reduce":
                out = funcol.all_reduce(t, "sum", (mesh, 0))
            else:
                out = _sharding._all_gather(t, 0, (mesh, 0))
            funcol.wait_tensor(out)

    return median_ms(run, iters)


def rank_main(rank: int, world: int, init_file: str, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(max(1, args.threads // world))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    log = CollectiveLog()
    rows = []
    for name in args.optimizers:
        model = build(args, mesh)
        opt = OPTIMIZERS[name](model.named_parameters())
        ms = median_ms(opt.step, args.iters)
        log.calls.clear()
        log.enabled = True
        opt.step()
        log.enabled = False
        calls = list(log.calls)
        coll_ms = time_collectives(calls, mesh, args.iters)
        t = torch.tensor([ms, coll_ms])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        rows.append((name, t[0].item(), t[1].item(), calls))
    if rank == 0:
        torch.save(rows, out)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--optimizers", nargs="*", default=list(OPTIMIZERS))
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=15)
    args = ap.parse_args()
    world = 2

    torch.set_num_threads(args.threads)
    single = {}
    for name in args.optimizers:
        model = build(args, None)
        opt = OPTIMIZERS[name](model.named_parameters())
        single[name] = median_ms(opt.step, args.iters)
    n_params = sum(p.numel() for p in build(args, None).parameters())
    n_tensors = len(list(build(args, None).parameters()))

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.pt")
        mp.spawn(rank_main, args=(world, os.path.join(tmp, "store"), args, out), nprocs=world)
        rows = torch.load(out)

    from benchmarks.common import machine_line

    print(machine_line(args.threads))
    print(f"TinyGPT dim {args.dim}, {args.layers} layers: {n_tensors} tensors, {n_params / 1e6:.2f}M params; "
          f"unsharded: 1 process x {args.threads} threads; FSDP2: {world} ranks x {max(1, args.threads // world)} "
          f"threads, gloo")
    print("| optimizer | unsharded step ms | FSDP2 step ms (slowest rank) | ratio | collectives / step | "
          "bytes / step | collectives alone ms |")
    print("|---|---|---|---|---|---|---|")
    for name, ms, coll_ms, calls in rows:
        kinds = ", ".join(f"{n} {list(s)}" for n, s, _, _ in calls)
        print(f"| {name} | {single[name]:.2f} | {ms:.2f} | {ms / single[name]:.2f}x | {len(calls)} ({kinds}) | "
              f"{sum(b for *_, b in calls)} | {coll_ms:.3f} |")


if __name__ == "__main__":
    main()
