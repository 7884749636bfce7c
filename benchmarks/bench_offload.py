"""ZeRO-Offload's optimizer step on the CPU: our optimizers against DeepSpeed's own CPU
optimizers (``DeepSpeedCPUAdam``, ``DeepSpeedCPUAdagrad``, which its JIT builds) on the same
flat float32 partition, in GB/s against each method's bytes per param, with the in-place
bandwidth of the same run (``a += s*b``, the access pattern of an optimizer step).

    DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed==0.19.8 torch==<your torch>
    python -m benchmarks.bench_offload [--threads 2] [--hidden 576] [--layers 6]

Each row is a real DeepSpeed engine (ZeRO stage 2, ``offload_optimizer: {device: cpu}``) on
one rank, its model the BERT-like tensor list of ``common.bert_like_shapes``; what is timed
is the client optimizer's step on the flat partition, as DeepSpeed calls it
(``_optimizer_step``), grads already in place. On one rank every piece of the partition is a
whole tensor: our layer-wise optimizers step them with one op call (cache-blocked, LAMB's and
LAMB16's updates stashed between the passes), as they step a model's own tensors.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

import inductor_lamb
from benchmarks.common import DEFAULT_THREADS, bert_like_shapes, machine_line, median_seconds, numel, stream_bandwidth

# Bytes one step moves per param (float32): reads and writes of params, grads and state.
ROWS = [
    ("DeepSpeedCPUAdam (AdamW)", 28, {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}),
    ("inductor_lamb.Lamb", 40, lambda ps: inductor_lamb.Lamb(ps, lr=1e-3)),
    ("inductor_lamb.Lamb16", 26, lambda ps: inductor_lamb.Lamb16(ps, lr=1e-3)),
    ("inductor_lamb.Lars", 28, lambda ps: inductor_lamb.Lars(ps, lr=1e-3)),
    ("inductor_lamb.NovoGrad", 24, lambda ps: inductor_lamb.NovoGrad(ps, lr=1e-3)),
    ("DeepSpeedCPUAdagrad", 20, {"type": "Adagrad", "params": {"lr": 1e-3}}),
    ("inductor_lamb.Adagrad", 20, lambda ps: inductor_lamb.Adagrad(ps, lr=1e-3)),
]


class Tensors(nn.Module):
    def __init__(self, shapes: list[tuple[int, ...]]) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.params = nn.ParameterList(nn.Parameter(torch.randn(s, generator=g) * 0.02) for s in shapes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def engine_for(model: nn.Module, optimizer, threads: int):
    import deepspeed

    cfg = {"train_micro_batch_size_per_gpu": 1, "steps_per_print": 10 ** 9, "gradient_clipping": 0.0,
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    if isinstance(optimizer, dict):
        cfg["optimizer"] = optimizer
        client = None
    else:
        cfg["zero_allow_untested_optimizer"] = True
        cfg["zero_force_ds_cpu_optimizer"] = False
        client = optimizer(model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=client, config=cfg, dist_init_required=False)
    torch.set_num_threads(threads)  # (DeepSpeed's CPU optimizers use OpenMP's threads: same count)
    zero = engine.optimizer
    g = torch.Generator().manual_seed(1)
    for flat in zero.single_partition_of_fp32_groups:
        flat.grad = torch.randn(flat.shape, generator=g) * 1e-3
    return engine, zero


def step_all(zero) -> None:
    """The client optimizer's step on every flat partition, as DeepSpeed calls it."""
    for i in range(len(zero.single_partition_of_fp32_groups)):
        zero._optimizer_step(i)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every row's steps, alternating")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # (inference only; not built)
        shapes = bert_like_shapes(hidden=args.hidden, ffn=4 * args.hidden, layers=args.layers)
        n = numel(shapes)
        bw = stream_bandwidth()
        print(f"# {machine_line(args.threads)}; DeepSpeed {deepspeed.__version__}")
        print(f"ZeRO-2 offload, one rank: the client optimizer's step on a {n / 1e6:.1f}M-element float32 "
              f"partition ({len(shapes)} BERT-like tensors); copy {bw['copy']:.1f} GB/s, rmw {bw['rmw']:.1f} GB/s "
              "in the same run")
        print("| optimizer | bytes/param | ms | GB/s | % rmw | vs DeepSpeedCPUAdam |")
        print("|---|---|---|---|---|---|")
        # Every engine is built first, then all steps alternate in rounds (the best round's median
        # each): this host's bandwidth moves by 2x within minutes, rows timed in turn disagreed.
        engines = [engine_for(Tensors(shapes), make, args.threads) for _, _, make in
                   tqdm(ROWS, desc="engines", file=sys.stderr)]
        best = [float("inf")] * len(ROWS)
        for _ in tqdm(range(args.rounds), desc="rounds", file=sys.stderr):
            for i, (_, zero) in enumerate(engines):
                best[i] = min(best[i], median_seconds(lambda z=zero: step_all(z), lambda: None, 7))
        results = [(name, nbytes, t) for (name, nbytes, _), t in zip(ROWS, best)]
        base = results[0][2]
        for name, nbytes, t in results:
            gbs = nbytes * n / t / 1e9
            print(f"| {name} | {nbytes} | {t * 1e3:.1f} | {gbs:.1f} | {gbs / bw['rmw']:.0%} | {t / base:.2f}x |")
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
