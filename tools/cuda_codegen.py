"""What ``torch.compile`` generates for the optimizer step on a CUDA GPU, seen on a machine
without one: Inductor's Triton kernels for a described GPU (H100 by default), each compiled
to a cubin, counted per step (kernels, launches, external calls, the bytes each launch moves
by Inductor's count) with the compile time, beside torch's compiled AdamW on the same tensors.

    python -m tools.cuda_codegen                       # every optimizer and path, N = 10 100 1000
    python -m tools.cuda_codegen --n 10 100 --opt Lamb Lamb16 --paths lowering --json out.json
    python -m tools.cuda_codegen --workload train      # forward, backward and step in one graph

Needs a CUDA build of torch with Triton (torch 2.14 or 2.15: ``pip install torch==2.14.1``), no GPU.
This is generated code for a described GPU, not a GPU measurement: nothing here runs on a GPU.

Workloads: ``step``, ``torch.compile(opt.step)`` over N float32 params of BERT-like shapes
(``common.bert_like_shapes``, as many layers as N needs); ``train``, a whole training step of a
small GPT-2 (``bench_train_step.GPT2Like``, 2 layers, width 128, attention written out) compiled as one graph with
``fullgraph=True`` (recipe (a) of README). Each row runs in a process of its own (the shims of
``described_gpu`` are process-wide), two at a time by default (``--jobs``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from inspect import Parameter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
OPTIMIZERS = ("AdamW", "Lamb", "Lamb16", "Lars", "Adagrad")
PATHS = ("auto", "lowering", "decomposition", "external")


def _model_launches(opt: object, params: list) -> dict | None:
    """What the ``"auto"`` rule's model (``inductor_lamb/_inductor/cost.py``) predicts for this
    step's op calls: the lowering's fewest launches and the CUDA engine's launches."""
    from torch._inductor.choices import InductorChoices

    from inductor_lamb._inductor import cost

    layout = getattr(opt, "_layout", None)  # (an inductor_lamb optimizer's: its op's description)
    if layout is None:
        return None
    op = layout.spec.name
    device = params[0].device
    splits = lambda n: InductorChoices().reduction_split_factor(device, n, 1, True) > 1  # noqa: E731
    size = opt.max_tensors_per_call
    calls = [[p.numel() for p in params[lo:lo + size]] for lo in range(0, len(params), size)]
    return {"op": op, "calls": len(calls), "lowering": sum(cost.lowering_launches(op, c, splits) for c in calls),
            "engine": sum(cost.engine_launches(op) for _ in calls)}


def _make_optimizer(name: str, params: list) -> object:
    import inductor_lamb

    if name == "AdamW":  # torch's compiled AdamW: its foreach step, state on the device (capturable)
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, foreach=True,
                                 capturable=params[0].device.type == "cuda")
    return getattr(inductor_lamb, name)(params, lr=1e-3, weight_decay=0.01)


def one_row(opt_name: str, path: str, n: int, workload: str, gpu: str, configs: int = 0) -> dict:
    """Generates and compiles one row's code; returns its counts (this process only)."""
    import tools.described_gpu as dg
    from benchmarks.common import bert_like_shapes, compile_stages
    from inductor_lamb._inductor import cost

    if workload == "step":
        with dg.described_gpu(dg.GPUS[gpu], configs), dg.fake_mode():
            layers = max(1, -(-n // 16))
            shapes = bert_like_shapes(layers=layers)[:n]
            params = [torch.randn(s, device="cuda", requires_grad=True) for s in shapes]
            for p in params:
                p.grad = torch.randn_like(p)
            opt = _make_optimizer(opt_name, params)
            opt.step()  # the state, as fake tensors
            with dg.cudagraph_blockers() as blockers:
                out = dg.generate(opt.step)
            model = _model_launches(opt, params)
    if workload == "train":
        out, n = _train_step(opt_name, gpu, configs)
        model, blockers = None, None  # (graphs traced on CPU: no static inputs recorded)
    return {"optimizer": opt_name, "path": path if opt_name != "AdamW" else "-", "n": n, "workload": workload,
            "gpu": dg.GPUS[gpu].name, "kernels": out.kernels, "launches": out.launches,
            "extern_calls": out.extern_calls, "lamb_calls": sum(out.lamb_calls.values()),
            # (an external call's kernels, which the generated code does not show: counted by the
            # module's own launchers, without launching)
            "engine_launches": sum(cost.engine_launches(op) * k for op, k in out.lamb_calls.items()),
            "gb_per_step": out.gb_per_call,
            "compile_s": round(out.compile_s, 1), "stages": {k: round(v, 2) for k, v in compile_stages().items()},
            "cubins_missing": out.cubins_missing, "model": model,
            "configs": configs or "all", "cudagraph_blockers": blockers,
            "torch": torch.__version__}


def _train_step(opt_name: str, gpu: str, configs: int = 0):
    """The training step's graphs, traced on CPU and compiled for the described GPU.

    The autograd engine needs a real device for CUDA tensors, fake ones included, so
    ``loss.backward()`` cannot be traced on fake CUDA tensors without a GPU. The step is
    traced on CPU instead, through AOTAutograd with Inductor's decompositions, to the graphs
    Inductor would compile (forward, backward and step as plain aten ops and our ops); their
    devices become CUDA, and Inductor compiles each for the described GPU from there, our
    lowering included. (Ops whose choice of kernel is per device, such as SDPA, would not
    carry over: the model writes its attention out.)"""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    import tools.described_gpu as dg
    from benchmarks.bench_train_step import GPT2Like, causal_attention, lm_step

    graphs: list[tuple[torch.fx.GraphModule, list]] = []

    def capture(gm: torch.fx.GraphModule, inputs: list) -> object:
        graphs.append((gm, inputs))
        return gm.forward

    torch.manual_seed(0)  # a small GPT-2: 2 layers, width 128, 28 tensors; attention written out
    model = GPT2Like(layers=2, width=128, context=64, vocab=512, attention=causal_attention)
    opt = _make_optimizer(opt_name, list(model.parameters()))
    x = torch.randint(0, 512, (4, 64))
    lm_step(model, opt, x)  # the state
    torch._dynamo.config.trace_autograd_ops = True
    backend = aot_autograd(fw_compiler=capture, decompositions=select_decomp_table(),
                           keep_inference_input_mutations=True)
    # (torch's optimizers graph-break in step(): AdamW's step is several graphs)
    torch.compile(lm_step, backend=backend, fullgraph=opt_name != "AdamW")(model, opt, x)
    outs = []
    with dg.described_gpu(dg.GPUS[gpu], configs), dg.fake_mode():
        for gm, inputs in graphs:
            outs.append(dg.compile_graph(dg.on_cuda(gm), [dg.like_on_cuda(t) for t in inputs]))
    return dg.combine(outs), len(list(model.parameters()))


INTERPRET_SHAPES = [(33, 17), (7,), (64, 48), (3000,), (), (0,)]


def interpret_op(op: str, gpu: str) -> dict:
    """The lowered step of op ``op`` generated for ``gpu``, run by Triton's interpreter on CPU
    tensors (mixed shapes, a transposed param, 0-d and empty ones; three steps with a changing
    lr), against the float64 reference: the largest relative error of the params and the float32
    state. This process only (``TRITON_INTERPRET=1`` must be set before Triton is imported)."""
    import inductor_lamb
    import tools.described_gpu as dg
    from inductor_lamb import reference
    from inductor_lamb.spec import SPECS, Role

    spec = SPECS[op]
    gen = torch.Generator().manual_seed(0)
    rand = lambda s, scale=1.0: torch.randn(s, generator=gen) * scale  # noqa: E731
    lists: dict[str, list[torch.Tensor]] = {}
    for a in spec.args:
        if a.role in (Role.PARAMS, Role.GRADS):
            lists[a.name] = [rand(s) for s in INTERPRET_SHAPES]
        elif a.role is Role.STATE:  # (in (0, 0.1]: second moments and Adagrad's sums are nonnegative)
            fp8 = {torch.float8_e4m3fn: 4000.0, torch.float8_e5m2: 5e5}.get(a.dtype, 1.0)  # (codes in range)
            lists[a.name] = [((torch.rand(s, generator=gen) * 0.1 + 1e-3) * fp8).to(a.dtype or torch.float32)
                             for s in INTERPRET_SHAPES]
        elif a.role is Role.SCALARS:
            # (a state in flight: step 2, LAMB16's float8 scales, a per-tensor moment 0.3)
            value = {"steps": 2.0, "exp_avg_scales": 2.5e-4, "exp_avg_sq_scales": 2e-6}.get(a.name, 0.3)
            lists[a.name] = [torch.tensor(value) for _ in INTERPRET_SHAPES]
    lists["params"][0] = lists["params"][0].t().contiguous().t()  # (a transposed param)
    hypers = {a.name: torch.tensor(float(a.default)) for a in spec.args
              if a.role is Role.TENSOR and a.default is not Parameter.empty}
    floats = {"weight_decay": 0.01} if "weight_decay" in spec.names else {}
    ref = {k: [t.double() if t.dtype == torch.float32 else t.clone() for t in v] for k, v in lists.items()}
    wrapper = getattr(inductor_lamb.ops, op)
    inductor_lamb.set_compile_path("lowering")
    errors: dict[str, float] = {}
    with dg.described_gpu(dg.GPUS[gpu]):
        for step, lr in enumerate([1e-2, 3e-3, 2e-2]):
            scheduled = {"lr": torch.tensor(lr), **hypers}  # (graph inputs: on the device, like the params)
            dg.run_interpreted(lambda **kw: wrapper(*[kw[k] for k in lists], **{k: kw[k] for k in scheduled}, **floats),
                               **lists, **scheduled)
            getattr(reference, op.rstrip("_"))(*ref.values(), lr=torch.tensor(lr, dtype=torch.float64),
                                               **hypers, **floats)
    for k, v in lists.items():
        if v[0].dtype != torch.float32 or k == "steps":
            continue
        errors[k] = max(float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30))
                        for a, b in zip(v, ref[k]) if b.numel())
    return {"op": op, "gpu": dg.GPUS[gpu].name, "max_rel_error": errors}


def _run_child(args: list[str], timeout: float = 3600) -> dict:
    with tempfile.TemporaryDirectory() as cache:  # cold caches: the compile time is a first compile's
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor", "TRITON_CACHE_DIR": f"{cache}/triton",
               "TORCHINDUCTOR_COMPILE_THREADS": "1"}
        try:
            proc = subprocess.run([sys.executable, "-m", "tools.cuda_codegen", "--child", *args], capture_output=True,
                                  text=True, env=env, timeout=timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"error": [f"not done in {timeout} s"], "args": args}
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:], "args": args}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _stages(row: dict) -> str:
    stages = [row["stages"][k] for k in ("aot", "lowering", "scheduling", "codegen", "compile")]
    # (torch's timers record nothing for some graphs, AdamW's step among them)
    return ", ".join(f"{s:.1f}" for s in stages) if any(stages) else "not recorded by torch"


def table(rows: list[dict]) -> str:
    lines = ["| workload | N | optimizer | path | Triton kernels | Triton launches | extern calls (lamb ops) | "
             "launches / step | MB / step (Triton kernels, Inductor's count) | compile s | "
             "of which aot, lowering, scheduling, codegen, Triton compile |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {' '.join(r['args'])} | error: {' '.join(r['error'])} |")
            continue
        lines.append(f"| {r['workload']} | {r['n']} | {r['optimizer']} | {r['path']} | {r['kernels']} | "
                     f"{r['launches']} | {r['extern_calls']} ({r['lamb_calls']}) | {r['launches'] + r['engine_launches']} | "
                     f"{r['gb_per_step'] * 1e3:.1f} | "
                     f"{r['compile_s']} | " + _stages(r) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", default="h100", choices=["h100", "a100", "b200"])
    ap.add_argument("--n", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--opt", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS)
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--workload", nargs="+", default=["step"], choices=["step", "train"])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per row")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--interpret", nargs="+", metavar="OP",
                    help="run these ops' lowered steps under Triton's interpreter against the float64 reference")
    ap.add_argument("--configs", type=int, default=0,
                    help="compile only the first CONFIGS autotuning configs of each kernel (default: all)")
    ap.add_argument("--child", nargs=6, metavar=("OPT", "PATH", "N", "WORKLOAD", "GPU", "CONFIGS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.interpret and os.environ.get("TRITON_INTERPRET") != "1":
        # (the interpreter must be chosen before Triton is imported: a process of its own)
        env = {**os.environ, "TRITON_INTERPRET": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
        sys.exit(subprocess.run([sys.executable, "-m", "tools.cuda_codegen", *sys.argv[1:]], env=env,
                                cwd=ROOT).returncode)
    if args.interpret:
        rows = [interpret_op(op, args.gpu) for op in args.interpret]
        for r in rows:
            print(f"{r['op']} (generated for {r['gpu']}, run by Triton's interpreter): largest relative error "
                  "against float64: " + ", ".join(f"{k} {e:.1e}" for k, e in r["max_rel_error"].items()))
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return
    if args.child:
        opt, path, n, workload, gpu, configs = args.child
        import inductor_lamb

        inductor_lamb.set_compile_path(path)
        print(json.dumps(one_row(opt, path, int(n), workload, gpu, int(configs))))
        return

    from tqdm import tqdm

    jobs = []
    for workload in args.workload:
        for n in (args.n if workload == "step" else [0]):
            for opt in args.opt:
                for path in (["-"] if opt == "AdamW" else args.paths):
                    jobs.append([opt, "auto" if path == "-" else path, str(n), workload, args.gpu, str(args.configs)])
    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(tqdm(pool.map(lambda job: _run_child(job, args.timeout), jobs), total=len(jobs),
                         desc="generating", file=sys.stderr))
    from tools.described_gpu import GPUS

    gpu = GPUS[args.gpu]
    print(f"Generated and compiled for {gpu.name} (sm_{gpu.cc}); not run on a GPU.")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
