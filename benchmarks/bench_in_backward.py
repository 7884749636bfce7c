"""The step inside the backward (``inductor_lamb.step_in_backward``) against the ordinary step:
peak memory of a training step in bytes a param, and the step's time, beside torch's fused AdamW
and PyTorch's tutorial pattern (one optimizer per param, stepped from each param's hook).

    python -m benchmarks.bench_in_backward [--threads 2] [--rounds 3] [--plot benchmarks/bench_in_backward.png]
    python -m benchmarks.bench_in_backward --device cuda [--rounds 3]

Every row runs in a fresh process (``--row``). On the CPU, glibc is told to return freed large
blocks to the system (``MALLOC_MMAP_THRESHOLD_=65536``: without it a process keeps them and the
rows hardly differ); a row's peak is the process's peak resident memory (``ru_maxrss``) over 8
training steps, less its resident memory before the model was made (after the same steps of a
tiny model, which load what the first step imports: about 100 MB of code, not memory a param).
On a GPU it is ``torch.cuda.max_memory_allocated()`` over the 8 steps less what was allocated
before the model. Divided by the params, it is what the params, the optimizer state, the grads
alive at the peak, the activations and the step's temporaries take per param. Time: the median training step (forward, backward, step) of the
last 6. Rows alternate in each round (these hosts are noisy); the table gives each row's median
over the rounds, and the ratio to the ordinary step of the same optimizer and params.

Two models: ``wide`` (8 Linear layers of 2048x2048, 33.6M params: memory and time) and ``many``
(96 Linear layers of 64x64, 192 tensors of 4K elements: the host cost of the hooks and op calls;
its 0.4M params are too few for a peak a param, left out).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROWS = [  # (name, optimizer, param dtype, how it steps)
    ("AdamW (fused), fp32", "adamw", "float32", "ordinary"),
    ("Lamb, fp32", "lamb", "float32", "ordinary"),
    ("Lamb, fp32", "lamb", "float32", "tutorial"),
    ("Lamb, fp32", "lamb", "float32", "in_backward"),
    ("Lamb16, fp32", "lamb16", "float32", "ordinary"),
    ("Lamb16, fp32", "lamb16", "float32", "tutorial"),
    ("Lamb16, fp32", "lamb16", "float32", "in_backward"),
    ("Lamb16, bf16 (no master)", "lamb16", "bfloat16", "ordinary"),
    ("Lamb16, bf16 (no master)", "lamb16", "bfloat16", "tutorial"),
    ("Lamb16, bf16 (no master)", "lamb16", "bfloat16", "in_backward"),
]
HOW = {"ordinary": "ordinary step", "tutorial": "tutorial (an optimizer a param)",
       "in_backward": "step_in_backward"}
MODELS = {"wide": (8, 2048), "many": (96, 64)}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_row(opt_name: str, dtype_name: str, how: str, model_name: str, threads: int, device: str = "cpu") -> dict:
    """One row, in this (fresh) process."""
    import torch

    import inductor_lamb

    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    cuda = device == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def make(params):
        if opt_name == "adamw":
            return torch.optim.AdamW(params, lr=1e-3, fused=True)
        cls = {"lamb": inductor_lamb.Lamb, "lamb16": inductor_lamb.Lamb16}[opt_name]
        return cls(params, lr=1e-3)

    def train(layers: int, width: int) -> tuple[list[float], int, int]:
        """8 training steps of a fresh model; the step times, the op calls a backward, the params."""
        x = torch.randn(16, width, generator=torch.Generator().manual_seed(0)).to(device, dtype)
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(width, width, dtype=dtype) for _ in range(layers))).to(device)
        calls = 0
        if how == "tutorial":  # PyTorch's tutorial: an optimizer per param, stepped in its hook
            per_param = {p: make([p]) for p in model.parameters()}

            def hook(p):
                per_param[p].step()
                per_param[p].zero_grad()

            for p in model.parameters():
                p.register_post_accumulate_grad_hook(hook)
            opt = None
        else:
            opt = make(model.parameters())
            if how == "in_backward":
                inductor_lamb.step_in_backward(opt)
                step_batch = opt._step_batch

                def counted(batch, **kw):
                    nonlocal calls
                    calls += 1
                    step_batch(batch, **kw)

                opt._step_batch = counted
        times = []
        for _ in range(8):
            sync()
            t0 = time.perf_counter()
            model(x).float().square().mean().backward()
            if opt is not None:
                opt.step()
                opt.zero_grad()
            sync()
            times.append(time.perf_counter() - t0)
        return times, calls, sum(p.numel() for p in model.parameters())

    # (a small run first: what the first step loads, torch's and ours, is code, not memory a param)
    train(2, 32)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else rss_bytes()
    times, calls, n = train(*MODELS[model_name])
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"bytes_per_param": (peak - base) / n, "step_ms": 1e3 * statistics.median(times[2:]),
            "calls_per_backward": calls / 8 if how == "in_backward" else None, "params": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", choices=list(MODELS), nargs="+", default=list(MODELS))
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--plot", default=None, help="a bar chart of the wide model's bytes a param")
    ap.add_argument("--row", nargs=4, metavar=("OPT", "DTYPE", "HOW", "MODEL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        print(json.dumps(run_row(*args.row, args.threads, args.device)))
        return
    from tqdm import tqdm

    from benchmarks.common import machine_line

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(args.threads)}
    jobs = [(m, r) for _ in range(args.rounds) for m in args.model for r in ROWS]  # (rows alternate per round)
    results: dict[tuple, list[dict]] = {}
    for model, (name, opt, dtype, how) in tqdm(jobs, desc="rows (a fresh process each)"):
        out = subprocess.run([sys.executable, "-m", "benchmarks.bench_in_backward", "--threads", str(args.threads),
                              "--device", args.device, "--row", opt, dtype, how, model], env=env, check=True,
                             capture_output=True, text=True)
        results.setdefault((model, name, how), []).append(json.loads(out.stdout.strip().splitlines()[-1]))
    how_read = ("torch.cuda.max_memory_allocated" if args.device == "cuda"
                else "ru_maxrss, MALLOC_MMAP_THRESHOLD_=65536")
    if args.device == "cuda":
        import torch

        how_read += f"; {torch.cuda.get_device_name()}, torch {torch.__version__}"
    print(f"# {machine_line(args.threads)}; {args.device}; {args.rounds} rounds; peak memory: {how_read}")
    for model in args.model:
        layers, width = MODELS[model]
        n = results[(model, ROWS[0][0], ROWS[0][3])][0]["params"]
        print(f"\n{model}: {layers} Linear layers of {width}x{width} ({n / 1e6:.1f}M params), batch 16")
        print("| optimizer, params | how it steps | bytes a param (peak) | step ms | x ordinary | op calls a backward |")
        print("|---|---|---|---|---|---|")
        for name, _, _, how in ROWS:
            rows = results[(model, name, how)]
            mem = statistics.median(r["bytes_per_param"] for r in rows)
            ms = statistics.median(r["step_ms"] for r in rows)
            base = statistics.median(r["step_ms"] for r in results[(model, name, "ordinary")])
            calls = rows[0]["calls_per_backward"]
            shown = f"{mem:.2f}" if model == "wide" else "-"
            print(f"| {name} | {HOW[how]} | {shown} | {ms:.1f} | {ms / base:.2f} | "
                  f"{'' if calls is None else f'{calls:g}'} |")
    if args.plot and "wide" in args.model:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = [f"{name}\n{HOW[how]}" for name, _, _, how in ROWS]
        values = [statistics.median(r["bytes_per_param"] for r in results[("wide", name, how)])
                  for name, _, _, how in ROWS]
        colors = [{"ordinary": "tab:gray", "tutorial": "tab:orange", "in_backward": "tab:blue"}[how]
                  for *_, how in ROWS]
        fig, ax = plt.subplots(figsize=(11, 4.5))
        ax.bar(range(len(values)), values, color=colors)
        ax.set_xticks(range(len(values)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("peak bytes a param")
        ax.set_title("A training step's peak memory: ordinary, the tutorial's pattern, step_in_backward")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
