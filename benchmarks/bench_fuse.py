"""fuse_optimizer(): step time of per-parameter optimizers, unfused vs fused.

    python -m benchmarks.bench_fuse [--threads 2]

Workloads: ~200 BERT-like tensors (12-layer encoders) at hidden 64 (0.7M params,
per-call overhead dominates) and at hidden 256 (10M params, memory traffic
dominates). Both columns of a row are measured back to back in the same run.
"""

from __future__ import annotations

import argparse
import sys

import torch
from tqdm import tqdm

from benchmarks.common import DEFAULT_THREADS, bench, bert_like_shapes, machine_line, numel
from inductor_lamb import fuse_optimizer
from tests.test_fuse import BertAdam  # (the BertAdam-style optimizer of the tests)

OPTIMIZERS = {
    "BertAdam-style (per-parameter Python)": lambda ps: BertAdam(ps, lr=1e-4),
    "torch.optim.Adam(foreach=False)": lambda ps: torch.optim.Adam(ps, lr=1e-4, foreach=False),
}


def make_params(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    return params


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--min-time", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    workloads = {
        "hidden 64": bert_like_shapes(hidden=64, ffn=256, layers=12, vocab=512),
        "hidden 256": bert_like_shapes(hidden=256, ffn=1024, layers=12, vocab=2048),
    }
    print(f"# {machine_line(args.threads)}\n")
    print(f"| {'workload':32s} | {'optimizer':40s} | {'unfused ms':>10s} | {'fused ms':>9s} | {'speed-up':>8s} |")
    print(f"|{'-' * 34}|{'-' * 42}|{'-' * 12}|{'-' * 11}|{'-' * 10}|")
    jobs = [(w, name) for w in workloads for name in OPTIMIZERS]
    for w, name in tqdm(jobs, desc="optimizers", file=sys.stderr):
        shapes = workloads[w]
        unfused = OPTIMIZERS[name](make_params(shapes))
        fused = fuse_optimizer(OPTIMIZERS[name](make_params(shapes)))
        with torch.no_grad():
            t_unfused = bench(unfused.step, min_time=args.min_time)
            t_fused = bench(fused.fuse_step, min_time=args.min_time)
        label = f"{w}: {len(shapes)} tensors, {numel(shapes) / 1e6:.1f}M"
        print(f"| {label:32s} | {name:40s} | {t_unfused * 1e3:10.3f} | {t_fused * 1e3:9.3f} | "
              f"{t_unfused / t_fused:7.2f}x |", flush=True)


if __name__ == "__main__":
    main()
