"""LAMB under DeepSpeed ZeRO-3: a small GPT-2 trained data-parallel, its loss curve against
the same training unsharded, and against a LAMB that steps ZeRO's flat partitions as if
they were tensors (one trust ratio per partition, what a LAMB unaware of ZeRO computes).

    pip install transformers tqdm matplotlib && \\
        DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8 torch==<your torch>
    python -m benchmarks.studies.deepspeed_zero [--world 2] [--stage 3] [--steps 300] \\
        [--plot benchmarks/studies/deepspeed_zero.png] [--json benchmarks/studies/deepspeed_zero.json]
    torchrun --nproc-per-node 2 -m benchmarks.studies.deepspeed_zero --device cuda   # on GPUs (NCCL)

The recipe, to read first: ``examples/train_deepspeed.py``.

Model and text: ``lm_convergence.py``'s GPT-2 (4 layers, width 128, byte vocabulary; from a
config, no download) on CPython's bundled documentation. Every rank takes its share of each
global batch (32 sequences); the unsharded run takes the whole batch, so the averaged grads
are the same and the curves should lie on each other. Without ``--world``'s processes
already launched (torchrun or the ``deepspeed`` launcher set ``RANK``), the script spawns
them on localhost (gloo on CPU, one thread each).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

HERE = Path(__file__).resolve().parent
import benchmarks.studies.lm_convergence as lm
import inductor_lamb
from examples.train_deepspeed import join, launch
from inductor_lamb.optim._model_tensors import ModelTensors

LR = 1e-2


class PartitionLamb(inductor_lamb.Lamb):
    """``Lamb`` with its mapping of flat partitions back to tensors turned off: it steps whatever
    tensors it is given, one trust ratio per tensor, so under ZeRO one per flat partition, as
    a LAMB unaware of ZeRO does."""

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        self._model = ModelTensors()  # (it knows no model tensor: ZeRO's flat partitions step as they are)


OPTIMIZERS = {
    "ZeRO LAMB (inductor_lamb.Lamb)": lambda groups: inductor_lamb.Lamb(groups, lr=LR, eps=1e-6),
    "ZeRO LAMB, one trust ratio per partition": lambda groups: PartitionLamb(groups, lr=LR, eps=1e-6),
}


def global_batch(train: torch.Tensor, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 + step)
    return lm.batch_at(train, torch.randint(0, len(train) - lm.MODEL["n_positions"], (lm.BATCH,), generator=gen))


def config(stage: int, world: int) -> dict:
    return {"train_batch_size": lm.BATCH, "train_micro_batch_size_per_gpu": lm.BATCH // world,
            "gradient_accumulation_steps": 1, "gradient_clipping": lm.CLIP, "steps_per_print": 10 ** 9,
            "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}


def train_zero(name: str, stage: int, steps: int, rank: int, world: int, data) -> list[float]:
    import deepspeed

    model = lm.make_model(0)
    opt = OPTIMIZERS[name](lm.param_groups(model))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lm.lr_factor(s, steps))
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched,
                                           config=config(stage, world), dist_init_required=False)
    losses = []
    per_rank = lm.BATCH // world
    for step in tqdm(range(steps), desc=name, disable=rank != 0, leave=False, file=sys.stderr):
        x = global_batch(data[0], step)[rank * per_rank:(rank + 1) * per_rank].to(engine.device)
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    return losses


def train_unsharded(steps: int, data) -> list[float]:
    model = lm.make_model(0)
    opt = inductor_lamb.Lamb(lm.param_groups(model), lr=LR, eps=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lm.lr_factor(s, steps))
    losses = []
    for step in tqdm(range(steps), desc="unsharded LAMB", leave=False, file=sys.stderr):
        x = global_batch(data[0], step)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), lm.CLIP)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def run(rank: int, world: int, args: argparse.Namespace) -> None:
    join(rank, world, args, threads=args.threads)
    data = lm.load_text()
    curves, seconds = {}, {}
    for name in OPTIMIZERS:
        start = time.perf_counter()
        curves[name] = train_zero(name, args.stage, args.steps, rank, world, data)
        seconds[name] = time.perf_counter() - start
    if rank == 0:
        start = time.perf_counter()
        curves["unsharded LAMB (one process, the whole batch)"] = train_unsharded(args.steps, data)
        seconds["unsharded LAMB (one process, the whole batch)"] = time.perf_counter() - start
        report(curves, seconds, args, world)
    dist.barrier()
    dist.destroy_process_group()


def report(curves: dict[str, list[float]], seconds: dict[str, float], args: argparse.Namespace, world: int) -> None:
    ref = curves["unsharded LAMB (one process, the whole batch)"]
    print(f"GPT-2 4 layers x 128, {args.steps} steps, global batch {lm.BATCH} x {lm.MODEL['n_positions']} bytes, "
          f"ZeRO-{args.stage} on {world} ranks ({args.device}); torch {torch.__version__}")
    print("| run | loss at step 1 | final loss (mean of last 20) | max abs gap to unsharded | s |")
    print("|---|---|---|---|---|")
    for name, losses in curves.items():
        gap = max(abs(a - b) for a, b in zip(losses, ref))
        tail = sum(losses[-20:]) / len(losses[-20:])
        print(f"| {name} | {losses[0]:.4f} | {tail:.4f} | {gap:.2e} | {seconds[name]:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"curves": curves, "seconds": seconds, "world": world,
                                               "stage": args.stage, "steps": args.steps}, indent=1))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for (name, losses), style in zip(curves.items(), ["-", ":", "--"]):
            ax.plot(range(1, len(losses) + 1), losses, style, label=name, linewidth=1.4)
        ax.set_xlabel("step")
        ax.set_ylabel("training loss (nats per byte)")
        ax.set_title(f"GPT-2 under DeepSpeed ZeRO-{args.stage}, {world} ranks")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--stage", type=int, default=3, choices=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank (CPU)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--plot")
    ap.add_argument("--json")
    launch(run, ap.parse_args())


if __name__ == "__main__":
    main()
