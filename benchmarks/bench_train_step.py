"""A whole training step (forward, backward, optimizer step, zero_grad) compiled as
one graph, with the optimizer step on each compile path (the default "auto": our kernel's
call where the kernel is built; always lowered into Inductor IR; an external call to our
kernel), against the same step run eagerly and against torch's ``AdamW(fused=True)`` in the
same recipe (eager, and the same function compiled: its step graph-breaks, so without
``fullgraph``).

    python -m benchmarks.bench_train_step [--opt lamb lamb16] [--blocks 8] [--hidden 512] [--threads 2]
    python -m benchmarks.bench_train_step --model gpt2 --device cuda [--layers 12] [--width 768]

The default model is a stack of pre-LayerNorm MLP blocks with BERT-like widths (4x
FFN), so the step has many tensors of mixed sizes. ``--model gpt2``: GPT-2's
architecture in plain torch (GPT-2 small by default: 12 layers, width 768, 148
tensors, 124M params), random tokens, bf16 autocast on CUDA; its table adds the recipes a GPU user
compares: ``torch.compile(opt.step)`` with a compiled model (recipe (b)) and torch's
``AdamW(fused=True)`` eager and compiled, the optimizer's share of the eager step,
the kernel launches of a step (profiler, CUDA) and the cold compile time.

All rows come from one process; each compiled row compiles its own model's step with the op's
compile path set per op (``set_compile_path(path, ops=...)``). The rows are then timed
alternating in rounds (the best round's median each).
"""

from __future__ import annotations

import argparse
import sys
import time
import types

import torch
from torch import nn
from tqdm import tqdm

import inductor_lamb
from benchmarks.common import DEFAULT_THREADS, bench, machine_line, median_seconds
from inductor_lamb import _private

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


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention written out (no SDPA, whose choice of kernel is per device)."""
    t = q.shape[-2]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    att = ((q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5).masked_fill(causal, float("-inf")).softmax(-1)
    return att @ v


class CausalBlock(nn.Module):
    """A GPT-2 block: pre-LayerNorm causal self-attention and a 4x MLP."""

    def __init__(self, width: int, heads: int, attention=None) -> None:
        super().__init__()
        self.heads = heads
        self.attention = attention or (lambda q, k, v: nn.functional.scaled_dot_product_attention(q, k, v,
                                                                                                  is_causal=True))
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = self.attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x)), approximate="tanh"))


class GPT2Like(nn.Module):
    """GPT-2's architecture in plain torch (GPT-2 small by default: 12 layers, width
    768, 12 heads, learned positions, tied embeddings), built with no download."""

    def __init__(self, layers: int, width: int, context: int, vocab: int, attention=None) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(CausalBlock(width, max(1, width // 64), attention) for _ in range(layers))
        self.ln = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.ln(h) @ self.tok.weight.t()


def gpt2(layers: int, width: int, context: int, vocab: int) -> nn.Module:
    torch.manual_seed(0)
    return GPT2Like(layers, width, context, vocab)


def lm_loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, under bf16 autocast on CUDA."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=x.device.type == "cuda"):
        logits = model(x)
    return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), x[:, 1:].flatten())


def lm_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
    loss = lm_loss(model, x)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def launches(fn) -> int:
    """CUDA kernels one call of ``fn`` launches (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == "CUDA" and not e.name.startswith("Memcpy"))


def run_gpt2(args) -> None:
    """The GPT-2 table: each recipe on a model and optimizer of its own, one process. Every row is
    built and compiled first (a compiled row from its own copy of the step function), then all are
    timed alternating in rounds, the best round's median each."""
    from benchmarks.common import bench_cuda

    device = torch.device(args.device)
    timer = bench_cuda if device.type == "cuda" else bench
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, args.vocab, (args.batch, args.context), generator=gen).to(device)
    makers = {
        "Lamb": lambda m: inductor_lamb.Lamb(m.parameters(), lr=1e-3, weight_decay=0.01),
        "AdamW(fused=True)": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, fused=True),
    }
    # Cheapest and most compared first, the lowering (the longest compile) last: a run cut
    # short by a time limit still has the rows that matter compiled.
    recipes = [("Lamb", "eager", None), ("AdamW(fused=True)", "eager", None),
               ("Lamb", "whole step compiled, auto (default)", "auto"),
               # torch's optimizers graph-break in step() (_use_grad), so no whole-step graph:
               # torch's own recipe, a compiled model and a compiled step
               ("AdamW(fused=True)", "compiled model + torch.compile(opt.step)", "recipe b"),
               ("Lamb", "compiled model + torch.compile(opt.step)", "recipe b"),
               ("Lamb", "whole step compiled, external", "external"),
               ("Lamb", "whole step compiled, CUDA graphs (reduce-overhead)", "reduce-overhead"),
               ("Lamb", "whole step compiled, lowering", "lowering")]
    print(f"# {torch.cuda.get_device_name() if device.type == 'cuda' else machine_line(args.threads)}; "
          f"torch {torch.__version__}")
    probe = gpt2(args.layers, args.width, args.context, args.vocab)
    print(f"\nGPT-2: {args.layers} layers, width {args.width}, {len(list(probe.parameters()))} tensors, "
          f"{sum(p.numel() for p in probe.parameters()) / 1e6:.1f}M params; batch {args.batch} x {args.context} "
          f"tokens{', bf16 autocast' if device.type == 'cuda' else ''}; rows alternating in {args.rounds} rounds")
    print("| optimizer | recipe | step ms | optimizer ms | launches | compile s (first call) |")
    print("|---|---|---|---|---|---|")
    if device.type != "cuda":
        recipes = [r for r in recipes if r[2] != "reduce-overhead"]
    elif _private.lacks("lowering_cuda"):  # (the row is refused on this torch: say so, by name)
        print(f"# left out: Lamb, whole step compiled, lowering: {_private.lacks('lowering_cuda')}")
        recipes = [r for r in recipes if r[2] != "lowering"]
    rows: dict[tuple[str, str], tuple] = {}  # (optimizer, recipe) -> (step, compile s, optimizer ms)
    torch._dynamo.reset()
    for opt_name, recipe, path in tqdm(recipes, desc="GPT-2: building", file=sys.stderr, leave=False):
        model = gpt2(args.layers, args.width, args.context, args.vocab).to(device)
        opt = makers[opt_name](model)
        inductor_lamb.set_compile_path(path if path in ("auto", "external", "lowering") else "auto")
        compile_s, opt_ms = 0.0, float("nan")
        if path is None:
            fn = lambda model=model, opt=opt: lm_step(model, opt, x)  # noqa: E731
            fn()
            lm_loss(model, x).backward()
            opt_ms = timer(opt.step, min_time=args.min_time / 2) * 1e3  # the optimizer alone, same grads
            opt.zero_grad(set_to_none=True)
        elif path == "recipe b":
            cmodel, cstep = torch.compile(model), torch.compile(opt.step)

            def fn(cmodel=cmodel, cstep=cstep, opt=opt):
                lm_loss(cmodel, x).backward()
                cstep()
                opt.zero_grad(set_to_none=True)
        else:
            # (a copy of lm_step's code object per row: Dynamo caches compiled frames per code
            # object, and a row must not run a graph another row compiled under another path)
            own = types.FunctionType(lm_step.__code__.replace(), lm_step.__globals__, f"lm_step_{len(rows)}")
            step = torch.compile(own, fullgraph=True, mode="reduce-overhead" if path == "reduce-overhead" else None)
            if path == "reduce-overhead":  # (each call a new step of the CUDA graph trees)
                def fn(step=step, model=model, opt=opt):
                    torch.compiler.cudagraph_mark_step_begin()
                    return step(model, opt, x)
            else:
                fn = lambda step=step, model=model, opt=opt: step(model, opt, x)  # noqa: E731
        if path is not None:
            start = time.perf_counter()
            try:
                fn()
            except Exception as e:  # a recipe this torch cannot compile leaves its error, not a dead table
                inner = getattr(e, "inner_exception", None) or e
                lines = (str(inner).strip() or repr(inner)).splitlines() or [""]
                print(f"| {opt_name} | {recipe} | failed: {type(inner).__name__}: {lines[0][:160]} |", flush=True)
                continue
            sync()
            compile_s = time.perf_counter() - start
        rows[opt_name, recipe] = (fn, compile_s, opt_ms)
    inductor_lamb.set_compile_path()  # back to the default ("auto"); the compiled graphs keep theirs
    best: dict[tuple[str, str], float] = {}
    for _ in tqdm(range(args.rounds), desc="GPT-2: rounds", file=sys.stderr, leave=False):
        for key, (fn, _, _) in rows.items():
            best[key] = min(best.get(key, float("inf")), timer(fn, min_time=args.min_time / args.rounds))
    for (opt_name, recipe), (fn, compile_s, opt_ms) in rows.items():
        n = launches(fn) if device.type == "cuda" else 0
        print(f"| {opt_name} | {recipe} | {best[opt_name, recipe] * 1e3:.2f} | {opt_ms:.2f} | {n if n else '-'} | "
              f"{compile_s:.1f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--opt", nargs="+", default=["lamb", "lamb16"], choices=list(OPTIMIZERS))
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--min-time", type=float, default=2.0, help="--model gpt2: seconds of repeats per row")
    ap.add_argument("--rounds", type=int, default=5, help="the rows alternate in this many rounds")
    ap.add_argument("--model", default="mlp", choices=["mlp", "gpt2"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--layers", type=int, default=12, help="--model gpt2")
    ap.add_argument("--width", type=int, default=768, help="--model gpt2")
    ap.add_argument("--context", type=int, default=512, help="--model gpt2")
    ap.add_argument("--vocab", type=int, default=50257, help="--model gpt2")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch._dynamo.config.trace_autograd_ops = True  # loss.backward() inside the compiled graph (torch 2.13)
    if args.model == "gpt2":
        run_gpt2(args)
        return

    print(machine_line(args.threads))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.hidden, generator=gen)
    y = torch.randint(0, 10, (args.batch,), generator=gen)
    n_params = [p.numel() for p in make_model(args.blocks, args.hidden).parameters()]
    print(f"{args.blocks} MLP blocks of width {args.hidden}: {len(n_params)} tensors, {sum(n_params) / 1e6:.1f}M "
          f"params, batch {args.batch}")
    # (optimizer, row, compile path): our ops' whole step in one fullgraph graph on each path;
    # torch's AdamW graph-breaks in step() (_use_grad), so its compiled row is the same function
    # compiled without fullgraph (forward and backward one graph, the step its own).
    rows = [("AdamW(fused=True)", "eager", None), ("AdamW(fused=True)", "compiled (step graph-breaks)", "adamw")]
    for kind in args.opt:
        rows += [(kind, "eager", None), (kind, "compiled, auto (default)", "auto"),
                 (kind, "compiled, lowering", "lowering"), (kind, "compiled, external", "external")]
    # Every row is built (and compiled, each from its own copy of the step function, on its path)
    # first, then all are timed alternating in rounds, the best round's median each: timed one
    # after another, the first compiled row ran 15-40% slower whichever path it was.
    fns, compile_s = {}, {}
    torch._dynamo.reset()
    for kind, name, path in tqdm(rows, desc="compiling", file=sys.stderr, leave=False):
        model = make_model(args.blocks, args.hidden)
        if kind in OPTIMIZERS:
            cls, op = OPTIMIZERS[kind]
            opt = cls(model.parameters(), lr=1e-3, weight_decay=0.01)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
        fn = lambda model=model, opt=opt: train_step(model, opt, x, y)  # noqa: E731
        compile_s[kind, name] = 0.0
        if path is not None:
            if path != "adamw":
                inductor_lamb.set_compile_path(path, ops=op)
            # (a copy of train_step's code object per row: Dynamo caches compiled frames per code
            # object, and a row must not run a graph another row compiled under another path)
            own = types.FunctionType(train_step.__code__.replace(), train_step.__globals__, f"train_step_{len(fns)}")
            step = torch.compile(own, fullgraph=path != "adamw")
            fn = lambda model=model, opt=opt, step=step: step(model, opt, x, y)  # noqa: E731
            start = time.perf_counter()
            fn()
            compile_s[kind, name] = time.perf_counter() - start
        fn()
        fns[kind, name] = fn
    inductor_lamb.set_compile_path()  # back to the default ("auto"); the compiled graphs keep theirs
    best: dict[tuple[str, str], float] = {}
    for _ in tqdm(range(args.rounds), desc="rounds", file=sys.stderr, leave=False):
        for key, fn in fns.items():
            best[key] = min(best.get(key, float("inf")), median_seconds(fn, lambda: None, 5))
    adamw_eager = best["AdamW(fused=True)", "eager"]
    adamw_compiled = best["AdamW(fused=True)", "compiled (step graph-breaks)"]
    print("| optimizer | step | ms | vs its eager | vs AdamW, same recipe | compile s |")
    print("|---|---|---|---|---|---|")
    for (kind, name), t in best.items():
        adamw = adamw_eager if name == "eager" else adamw_compiled
        print(f"| {kind} | {name} | {t * 1e3:.2f} | {t / best[kind, 'eager']:.2f}x | {t / adamw:.2f}x | "
              f"{compile_s[kind, name]:.1f} |")


if __name__ == "__main__":
    main()
