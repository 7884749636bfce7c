"""Lamb under DeepSpeed ZeRO: a small GPT-2 trained data-parallel with its params, grads and
optimizer state partitioned across ranks, every LAMB trust ratio still the one of the whole
tensor.

    pip install transformers tqdm && \\
        DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8 torch==<your torch>
    python examples/train_deepspeed.py [--world 2] [--stage 3] [--steps 100]   # CPU ranks (gloo)
    torchrun --nproc-per-node 2 examples/train_deepspeed.py --device cuda       # GPUs (NCCL)

The optimizer is built on the model's params as usual and handed to DeepSpeed; the only
setting it needs is ``zero_allow_untested_optimizer`` (DeepSpeed's list of known optimizers
is fixed). ZeRO hands the optimizer flat partitions; ``Lamb`` maps them back to the model's
tensors and combines each tensor's norms across ranks with one collective per step
(docs/distributed.md). How closely the sharded run follows the unsharded one is measured by
``python -m benchmarks.studies.deepspeed_zero``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable

import torch
import torch.distributed as dist
from tqdm import tqdm

import inductor_lamb

BATCH, CONTEXT = 32, 128  # global batch: sequences of CONTEXT bytes


def text() -> torch.Tensor:
    """The bytes of CPython's bundled documentation (every machine with Python has them)."""
    from pydoc_data.topics import topics

    return torch.frombuffer(bytearray("\n\n".join(topics[k] for k in sorted(topics)).encode()), dtype=torch.uint8)


def launch(fn: Callable[[int, int, argparse.Namespace], None], args: argparse.Namespace) -> None:
    """fn(rank, world, args) on every rank: the ranks torchrun or the deepspeed launcher started
    (RANK set), else ``args.world`` ranks spawned here on localhost."""
    if "RANK" in os.environ:
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        fn(dist.get_rank(), dist.get_world_size(), args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        args.store = os.path.join(tmp, "store")
        torch.multiprocessing.spawn(fn, args=(args.world, args), nprocs=args.world)


def join(rank: int, world: int, args: argparse.Namespace, threads: int = 1) -> None:
    """A spawned rank joins the others (gloo, through a file store); CPU ranks take ``threads``
    threads each, GPU ranks a GPU each."""
    if not dist.is_initialized():
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
        dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=rank, world_size=world)
    if args.device == "cpu":
        torch.set_num_threads(threads)
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # (an inference-only op: not built)
    else:
        torch.cuda.set_device(rank % torch.cuda.device_count())


def train(rank: int, world: int, args: argparse.Namespace) -> None:
    import deepspeed
    from transformers import GPT2Config, GPT2LMHeadModel

    join(rank, world, args)

    torch.manual_seed(0)  # the same initial weights on every rank
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=CONTEXT, vocab_size=256,
                                       bos_token_id=0, eos_token_id=0))
    # Weight decay on matrices only: LAMB's trust ratio follows it, as in BERT.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = inductor_lamb.Lamb([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                             lr=args.lr, eps=1e-6)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.05)
    config = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": BATCH // world,
              "gradient_clipping": 1.0, "steps_per_print": 10**9,
              "zero_optimization": {"stage": args.stage}, "zero_allow_untested_optimizer": True}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=config,
                                           dist_init_required=False)

    data = text()
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own share of the batches
    bar = tqdm(range(args.steps), disable=rank != 0, desc=f"ZeRO-{args.stage}, {world} ranks", file=sys.stderr)
    for _ in bar:
        starts = torch.randint(0, len(data) - CONTEXT, (BATCH // world,), generator=gen).tolist()
        x = torch.stack([data[s:s + CONTEXT] for s in starts]).long().to(engine.device)
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()  # clips, steps Lamb on this rank's partitions, gathers what ZeRO needs
        bar.set_postfix(loss=f"{loss.item():.3f}")
    if rank == 0:
        print(f"final training loss {loss.item():.3f} nats/byte (ZeRO-{args.stage}, {world} ranks, {args.device})")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2, help="ranks to spawn when no launcher started them")
    ap.add_argument("--stage", type=int, default=3, choices=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    launch(train, ap.parse_args())


if __name__ == "__main__":
    main()
