"""One op's step on the BERT-large-like list, run a few times for a kernel profiler:

    ncu --section SpeedOfLight -k regex:"pass|finish|update|norms" --launch-skip 6 --launch-count 3 \
        python -m tools.profile_step lamb16

Each call launches the op's kernels once (LAMB and LAMB16: pass1, finish_and_coeffs, pass2;
LARS: norms, finish_and_coeffs, update; Adagrad: update, increment_steps), after the random
state's own kernels, which the kernel-name filter leaves out; skipping the first two calls
keeps the warm-up (module load, the tensor table's upload) out of the profile.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.bench_step import KWARGS, OURS, make_state
from benchmarks.common import bert_like_shapes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op", choices=sorted(OURS))
    ap.add_argument("--calls", type=int, default=4)
    args = ap.parse_args()
    shapes = bert_like_shapes(hidden=1024, ffn=4096, layers=24, vocab=30522)
    state = make_state(shapes, kind=args.op, device="cuda")
    lr = torch.tensor(1e-4, device="cuda")
    for _ in range(args.calls):
        OURS[args.op](*state, lr=lr, **KWARGS[args.op])
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
