"""Lamb16 under DeepSpeed ZeRO-Offload: the optimizer state lives in CPU memory and the step runs on
the CPU, so the state's bytes bound the model that fits and the CPU step often bounds the
iteration. Lamb16 keeps 2 bytes of state a param where DeepSpeedCPUAdam keeps 8.

    pip install transformers tqdm && \\
        DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8 torch==<your torch>
    python examples/train_offload_lamb16.py [--steps 30] [--world 1] [--no-compare]   # CPU ranks (gloo)
    torchrun --nproc-per-node 2 examples/train_offload_lamb16.py --device cuda      # GPUs (NCCL)

A small GPT-2 on CPython's bundled documentation, ZeRO stage 2 with ``offload_optimizer: {device:
cpu}``. The script trains it with ``Lamb16``, then (unless ``--no-compare``) the same model with
DeepSpeed's own offload optimizer, ``DeepSpeedCPUAdam`` (AdamW; DeepSpeed builds it on first use,
a minute or two), and prints for both the bytes of optimizer state held in CPU memory, measured
from the optimizer's state tensors, and the median time of ``engine.step()``, where the CPU step
runs. ``Lamb`` and ``Lamb16`` step the partition's whole tensors with one op call each step
(docs/distributed.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import Tensor
from tqdm import tqdm
from train_deepspeed import BATCH, CONTEXT, join, launch, text

import inductor_lamb


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """The bytes of every tensor in an optimizer's state (on this rank)."""
    return sum(t.nbytes for s in optimizer.state.values() for t in s.values() if isinstance(t, Tensor))


def run(name: str, world: int, args: argparse.Namespace) -> tuple[int, int, float, float]:
    """Trains args.steps steps with optimizer `name`: (params, state bytes, median engine.step() s,
    final loss) on this rank."""
    import deepspeed
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=4, n_positions=CONTEXT,
                                       vocab_size=256, bos_token_id=0, eos_token_id=0))
    config = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": BATCH // world,
              "gradient_clipping": 1.0, "steps_per_print": 10**9,
              "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    client = None
    if name == "Lamb16":
        decay = [p for p in model.parameters() if p.ndim >= 2]
        rest = [p for p in model.parameters() if p.ndim < 2]
        client = inductor_lamb.Lamb16([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                      lr=args.lr)
        config.update(zero_allow_untested_optimizer=True, zero_force_ds_cpu_optimizer=False)
    else:  # DeepSpeed's own: DeepSpeedCPUAdam under offload
        config["optimizer"] = {"type": "AdamW", "params": {"lr": args.lr / 10, "weight_decay": 0.01}}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=client, config=config, dist_init_required=False)
    data = text()
    gen = torch.Generator().manual_seed(1000 + dist.get_rank())
    times = []
    bar = tqdm(range(args.steps), disable=dist.get_rank() != 0, desc=name, file=sys.stderr)
    for _ in bar:
        starts = torch.randint(0, len(data) - CONTEXT, (BATCH // world,), generator=gen).tolist()
        x = torch.stack([data[s:s + CONTEXT] for s in starts]).long().to(engine.device)
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        t0 = time.perf_counter()
        engine.step()  # ZeRO-Offload: the optimizer's step on the CPU partition, then the copy back
        times.append(time.perf_counter() - t0)
        bar.set_postfix(loss=f"{loss.item():.3f}")
    params = sum(p.numel() for p in model.parameters())
    # (the client optimizer inside ZeRO holds the state of this rank's flat partitions)
    return params, state_bytes(engine.optimizer.optimizer), statistics.median(times[len(times) // 3:]), loss.item()


def train(rank: int, world: int, args: argparse.Namespace) -> None:
    join(rank, world, args, threads=args.threads)
    rows = {name: run(name, world, args) for name in (["Lamb16"] + ([] if args.no_compare else ["DeepSpeedCPUAdam"]))}
    if rank == 0:
        params = rows["Lamb16"][0]
        print(f"ZeRO-Offload (stage 2, optimizer on the CPU), {world} rank(s), {params / 1e6:.2f}M params, "
              f"{args.steps} steps; per rank:")
        print("| optimizer | state in CPU memory | bytes/param | engine.step() | final loss |")
        print("|---|---|---|---|---|")
        for name, (_, nbytes, t, loss) in rows.items():
            print(f"| {name} | {nbytes / 2**20:.2f} MiB | {nbytes * world / params:.2f} | {t * 1e3:.1f} ms | "
                  f"{loss:.3f} |")
        if "DeepSpeedCPUAdam" in rows:
            ours, theirs = rows["Lamb16"], rows["DeepSpeedCPUAdam"]
            print(f"Lamb16 holds {ours[1] / theirs[1]:.2f}x DeepSpeedCPUAdam's optimizer state, "
                  f"its step takes {ours[2] / theirs[2]:.2f}x the time")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=1, help="ranks to spawn when no launcher started them")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of each rank")
    ap.add_argument("--no-compare", action="store_true", help="Lamb16 only (no DeepSpeedCPUAdam run)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    launch(train, ap.parse_args())


if __name__ == "__main__":
    main()
