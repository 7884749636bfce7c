"""Optimizer step time: our ops against plain torch and torch's fused twins (CPU or CUDA).

    python -m benchmarks.bench_step [--threads 2] [--ops lamb lamb16 lars adagrad novograd] [--plot benchmarks/bench_step_cpu.png]
                                    [--capability default|avx2|avx512] [--device cuda] [--no-compiled-reference]
    python -m benchmarks.bench_step --amp [--ops ...] | --sparse | --checks | --rounding | --vs-adamw | --passes
                                    | --in-training

Workloads: (a) one 1024x1024 tensor; (b) a BERT-like list of ~100 tensors, >= 25M
params. A workload's rows alternate in rounds (each row's figure the best round's median), next
to a STREAM-like copy/triad bandwidth (its best round), so ratios are comparable on a noisy machine.
GB/s counts each method's minimum traffic (docs/design.md: LAMB 40, LAMB16 26, LARS 28, Adagrad
20, NovoGrad 24 bytes/param; the twins: AdamW 28, SGD with momentum 20). The LAMB16 table also
measures our fp32-state LAMB op on the same params (target: LAMB16 <= 0.75x its
time; the bytes ratio is 0.65) and both optimizers' state bytes per param.

``--rounding``: bfloat16 params without master copies, rounded to nearest against rounded
stochastically (``stochastic_rounding``) on both workloads: 5 alternating rounds, median.

``--checks``: what the argument checks cost (shapes, dtypes, and the memory-overlap
check, which sorts every tensor's address range) against the whole step, on 1, 68 and
1000 tensors: each op's checks run alone (``inductor_lamb.ops.run_checks``) next to the
op itself, in one run. (A before/after comparison of two builds: compare_builds.py.)

``--passes``: where a layer-wise op's time goes: its one-call step (pass 1 leaves the update in
the stash, pass 2 reads it), its reduce phase alone (pass 1), its apply phase alone (pass 2 with
no stash: it recomputes the update), and LAMB16's step rounding to nearest, beside fused AdamW at
1 thread on the BERT-like list, alternating in rounds.

``--in-training``: each optimizer's ``opt.step()`` inside an eager training loop, where forward
and backward between steps evict its data from the caches, against ``AdamW(fused=True)``.

``--amp``: a GradScaler step with the grads unscaled first (the default) against
``unscale_in_step=True``. ``--sparse``: Adagrad on a 1M x 128 embedding's sparse
grad against torch.optim.Adagrad.

``--device cuda``: a BERT-large-like list (~335M params) and 1000 small tensors;
GB/s against a device-to-device copy measured in the same run. "ms" times calls back
to back (a loop's steady state: the host prepares a call while the GPU runs the
last); "alone ms" one call with the GPU idle until its first launch (it adds the
host's work before that launch); "kernels ms" and launches come from the profiler.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

import inductor_lamb
from benchmarks.common import (
    DEFAULT_THREADS,
    bench,
    bert_like_shapes,
    machine_line,
    numel,
    stream_bandwidth,
    timm_lamb_class,
    torchao_low_bit,
)
from inductor_lamb import reference

# Minimum traffic per param (docs/design.md), fp32: what each method must move at least.
# torchao's low-bit AdamWs: p and g (12) plus two 1-byte (8-bit, FP8) or half-byte (4-bit)
# moments read and written (4 or 2).
BYTES_PER_PARAM = {"lamb": 40, "lamb16": 26, "adamw": 28, "lars": 28, "sgd": 20, "adagrad": 20, "novograd": 24,
                   "adamw8": 16, "adamw4": 14}
KINDS = ["lamb", "lamb16", "lars", "adagrad", "novograd"]  # the ops, by their family names


def make_state(shapes, seed=0, kind="lamb", device="cpu"):
    """The op's list arguments for `kind`, random (never zeros), drawn on `device` (drawing a
    BERT-large list on the CPU and copying it over took longer than timing it)."""
    g = torch.Generator(device=device).manual_seed(seed)
    randn = lambda s: torch.randn(s, generator=g, device=device)  # noqa: E731
    rand = lambda s: torch.rand(s, generator=g, device=device)  # noqa: E731
    params = [randn(s) for s in shapes]
    grads = [randn(s) for s in shapes]
    steps = [torch.tensor(1.0, device=device) for _ in shapes]
    if kind == "lamb":
        return params, grads, [randn(s) * 0.1 for s in shapes], [rand(s) * 0.1 + 1e-3 for s in shapes], steps
    if kind == "lamb16":
        return params, grads, [(randn(s) * 60).clamp(-448, 448).to(torch.float8_e4m3fn) for s in shapes], \
            [(rand(s) * 5e4 + 1).to(torch.float8_e5m2) for s in shapes], \
            [torch.tensor(1e-3, device=device) for _ in shapes], [torch.tensor(1e-6, device=device) for _ in shapes], steps
    if kind == "lars":
        return params, grads, [randn(s) * 0.01 for s in shapes]
    if kind == "novograd":  # m, and per tensor v and its running max
        return params, grads, [randn(s) * 0.01 for s in shapes], [torch.tensor(float(s[0]), device=device) for s in shapes], \
            [torch.tensor(float(s[0]), device=device) for s in shapes], steps
    return params, grads, [rand(s) + 0.1 for s in shapes], steps


def torch_optimizer(cls, shapes, device="cpu", **kw):
    params = [torch.nn.Parameter(t) for t in make_state(shapes, device=device)[0]]
    for p, g in zip(params, make_state(shapes, seed=1, device=device)[1]):
        p.grad = g
    return cls(params, **kw).step


OURS = {k: getattr(inductor_lamb.ops, f"{k}_step_") for k in KINDS}
REFERENCE = {k: getattr(reference, f"{k}_step") for k in KINDS}
KWARGS = {"lamb": {}, "lamb16": {"weight_decay": 0.01}, "lars": {"weight_decay": [5e-4]}, "adagrad": {},
          "novograd": {"weight_decay": 1e-3}}


def lamb_op(shapes, device="cpu"):
    s, lr = make_state(shapes, kind="lamb", device=device), torch.tensor(1e-4, device=device)
    return lambda: inductor_lamb.ops.lamb_step_(*s, lr=lr)


TWINS = {
    "lamb16": [("inductor_lamb LAMB op (fp32 state)", "lamb", lamb_op)],
    "lamb": [("torch AdamW(fused=True) (twin)", "adamw", lambda s: torch_optimizer(torch.optim.AdamW, s, lr=1e-4, fused=True))],
    "lars": [("torch SGD(momentum, fused=True)", "sgd",
              lambda s: torch_optimizer(torch.optim.SGD, s, lr=1e-4, momentum=0.9, fused=True))],
    "adagrad": [("torch Adagrad(fused=True)", "adagrad", lambda s: torch_optimizer(torch.optim.Adagrad, s, lr=1e-4, fused=True)),
                ("torch Adagrad(foreach=True)", "adagrad",
                 lambda s: torch_optimizer(torch.optim.Adagrad, s, lr=1e-4, foreach=True))],
    # (no torch NovoGrad: fused AdamW, the step it replaces, at its own 28-byte floor)
    "novograd": [("torch AdamW(fused=True)", "adamw", lambda s: torch_optimizer(torch.optim.AdamW, s, lr=1e-4, fused=True))],
}


def peer_rows(kind, shapes, device="cpu") -> list[tuple[str, int, Callable[[], Callable[[], object]]]]:
    """Optional peers, when installed: timm's Lamb (eager and torch.compile'd step) for
    LAMB, torchao's low-bit AdamWs for LAMB16. (name, bytes/param floor, maker)."""
    rows = []
    timm_lamb = timm_lamb_class()
    if kind == "lamb" and timm_lamb is not None:
        # max_grad_norm=None: no global clip pass, as in our op's row
        rows.append(("timm Lamb (eager)", BYTES_PER_PARAM["lamb"],
                     lambda: torch_optimizer(timm_lamb, shapes, device, lr=1e-4, max_grad_norm=None)))
        rows.append(("torch.compile(timm Lamb.step)", BYTES_PER_PARAM["lamb"],
                     lambda: torch.compile(torch_optimizer(timm_lamb, shapes, device, lr=1e-4, max_grad_norm=None))))
    if kind == "lamb16":
        for name, cls in torchao_low_bit().items():
            floor = BYTES_PER_PARAM["adamw4" if name.endswith("4bit") else "adamw8"]
            rows.append((name, floor, lambda cls=cls: torch_optimizer(cls, shapes, device, lr=1e-4)))
    return rows


def rows_for(kind, shapes, compiled_reference=True) -> list[tuple[str, int, Callable[[], object]]]:
    """(name, bytes/param floor, zero-argument step) rows, each on its own copy of the state."""
    lr = torch.tensor(1e-4)
    kw = KWARGS[kind]
    rows = []
    s = make_state(shapes, kind=kind)
    rows.append(("inductor_lamb op", BYTES_PER_PARAM[kind], lambda s=s: OURS[kind](*s, lr=lr, **kw)))
    s = make_state(shapes, kind=kind)
    rows.append(("plain torch reference (eager)", BYTES_PER_PARAM[kind], lambda s=s: REFERENCE[kind](*s, lr=lr, **kw)))
    if compiled_reference:
        s = make_state(shapes, kind=kind)
        compiled = torch.compile(REFERENCE[kind])
        rows.append(("torch.compile(reference)", BYTES_PER_PARAM[kind], lambda s=s: compiled(*s, lr=lr, **kw)))
    for name, floor, make_twin in TWINS[kind]:
        rows.append((name, BYTES_PER_PARAM[floor], make_twin(shapes)))
    rows += [(name, floor, make()) for name, floor, make in peer_rows(kind, shapes)]
    return rows


ROUNDS = 3  # the main tables' rounds


def run(args) -> list[dict]:
    torch.set_num_threads(args.threads)
    workloads = {"(a) 1x 1024x1024": [(1024, 1024)], "(b) BERT-like": bert_like_shapes()}
    print(f"# {machine_line(args.threads)}; our CPU kernels: {inductor_lamb.cpu_capability()}\n")
    tables = [(kind, w) for kind in args.ops for w in workloads]
    results = []
    for kind, w in tqdm(tables, desc="optimizer steps", file=sys.stderr):
        # A table's rows (and its bandwidth reference) alternate in rounds, each row's figure
        # the best round's median: the machine's bandwidth moves within minutes, so rows timed
        # one after another would each see another machine. Its state is freed afterwards.
        rows = rows_for(kind, workloads[w], args.compiled_reference)
        n = numel(workloads[w])
        best: dict[str, float] = {}
        bw: dict[str, float] = {}
        for _ in range(ROUNDS):
            for name, _, fn in list(rows):
                try:
                    with torch.no_grad():
                        t = bench(fn, min_time=args.min_time / ROUNDS, warmup=1)
                except Exception as e:  # noqa: BLE001  (a peer that fails, e.g. to compile: say so, go on)
                    print(f"{name} on {kind} {w}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", file=sys.stderr)
                    print(f"({name}: {type(e).__name__}, not timed)")
                    rows = [r for r in rows if r[0] != name]
                    continue
                best[name] = min(best.get(name, float("inf")), t)
            bw = {k: max(bw.get(k, 0.0), v) for k, v in stream_bandwidth().items()}
        table = [{"op": kind, "workload": w, "method": name, "ms": best[name] * 1e3, "gbs": floor * n / best[name] / 1e9,
                  "floor": floor, "bw": bw} for name, floor, _ in rows]
        del rows
        results += table
        ours = table[0]["ms"]
        if kind == "lamb16":
            lamb = next(r for r in table if r["method"].startswith("inductor_lamb LAMB op"))
            table[0]["vs_lamb"] = ours / lamb["ms"]
        print(f"{kind.upper()}, {w}: {len(workloads[w])} tensors, {n / 1e6:.2f}M params; GB/s at each method's "
              f"bytes/param floor; bandwidth now: triad {bw['triad']:.1f} GB/s (STREAM bytes), "
              f"in-place a += s*b {bw['rmw']:.1f} GB/s")
        print(f"| {'method':34s} | {'B/param':>7s} | {'ms':>8s} | {'vs ours':>8s} | {'GB/s':>7s} | "
              f"{'% triad':>7s} | {'% rmw':>7s} |")
        print(f"|{'-' * 36}|{'-' * 9}|{'-' * 10}|{'-' * 10}|{'-' * 9}|{'-' * 9}|{'-' * 9}|")
        for r in table:
            print(f"| {r['method']:34s} | {r['floor']:7d} | {r['ms']:8.3f} | {r['ms'] / ours:7.2f}x | "
                  f"{r['gbs']:7.1f} | {100 * r['gbs'] / bw['triad']:6.0f}% | {100 * r['gbs'] / bw['rmw']:6.0f}% |")
        if kind == "lamb16":
            print(f"\nLAMB16 / LAMB step time: {table[0]['vs_lamb']:.2f} (target <= 0.75; bytes ratio 26/40 = 0.65); "
                  f"optimizer state per param: {state_bytes(workloads[w])}")
        print(flush=True)
    if args.plot:
        plot(results, args.plot)
    return results


# The tensor counts of the --checks table: one large tensor, a BERT-base-like layer count,
# and many small tensors (4096 elements each), where a per-tensor cost shows most.
CHECK_WORKLOADS = {"1 x 1024x1024": [(1024, 1024)], "68 x 4096": [(4096,)] * 68, "1000 x 4096": [(4096,)] * 1000}


def run_checks(args) -> None:
    torch.set_num_threads(args.threads)
    print(f"# {machine_line(args.threads)}; our CPU kernels: {inductor_lamb.cpu_capability()}\n")
    print("| op | tensors | step ms | checks ms | checks / step |")
    print("|---|---|---|---|---|")
    lr = torch.tensor(1e-4)
    for kind in args.ops:
        spec = inductor_lamb.spec.SPECS[f"{kind}_step_"]
        for w, shapes in tqdm(CHECK_WORKLOADS.items(), desc=kind, file=sys.stderr):
            s = make_state(shapes, kind=kind)
            kwargs = {**KWARGS[kind], **{a.name: torch.tensor(float(a.default)) for a in
                                         spec.of(inductor_lamb.spec.Role.TENSOR) if a.name != "lr"}}
            step = bench(lambda: getattr(torch.ops.lamb, spec.name)(*s, lr, **kwargs), min_time=args.min_time)
            checks = bench(lambda: inductor_lamb.ops.run_checks(spec.op, *s, lr, **kwargs), min_time=args.min_time)
            print(f"| {kind} | {w} | {step * 1e3:.3f} | {checks * 1e3:.4f} | {checks / step:.2%} |", flush=True)


def run_rounding(args) -> None:
    torch.set_num_threads(args.threads)
    print(f"# {machine_line(args.threads)}; our CPU kernels: {inductor_lamb.cpu_capability()}\n")
    print("| op | workload | bf16, nearest ms | bf16, stochastic ms | stochastic / nearest |")
    print("|---|---|---|---|---|")
    lr = torch.tensor(1e-4)
    workloads = {"1x 1024x1024": [(1024, 1024)], "BERT-like": bert_like_shapes()}
    for kind in args.ops:
        for w, shapes in tqdm(workloads.items(), desc=kind, file=sys.stderr):
            states = {sr: [[t.bfloat16() if k < 2 else t for t in lst]  # one state each
                           for k, lst in enumerate(make_state(shapes, kind=kind))] for sr in (False, True)}
            rounds: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(5):  # alternating rounds: both see the same machine conditions
                for sr, s in states.items():
                    rounds[sr].append(bench(lambda s=s, sr=sr: OURS[kind](*s, lr=lr, stochastic_rounding=sr,
                                                                           **KWARGS[kind]),
                                            min_time=args.min_time / 5))
            times = {sr: statistics.median(v) for sr, v in rounds.items()}
            del states
            print(f"| {kind} | {w} | {times[False] * 1e3:.3f} | {times[True] * 1e3:.3f} | "
                  f"{times[True] / times[False]:.3f} |", flush=True)


def cuda_graphed(fn):
    """``fn`` captured in a CUDA graph (warmed up on a side stream first): its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        fn()
    return graph.replay


def run_cuda(args) -> list[dict]:
    """The CUDA tables: every row built, timed and freed in turn (BERT-large state is GBs)."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.common import bench_cuda, cuda_copy_bandwidth

    large = bert_like_shapes(hidden=1024, ffn=4096, layers=24, vocab=30522)
    small = [(64 * (1 + i % 8), 64) if i % 3 else (256,) for i in range(1000)]
    workloads = {"BERT-large-like": large, "1000 small tensors": small}
    print(f"# {torch.cuda.get_device_name()}; torch {torch.__version__}\n")
    twins = {"lamb": ("torch AdamW(fused=True) (twin)", "adamw", torch.optim.AdamW, dict(fused=True)),
             "lamb16": ("inductor_lamb LAMB op (fp32 state)", "lamb", None, {}),
             "lars": ("torch SGD(momentum, fused=True)", "sgd", torch.optim.SGD, dict(momentum=0.9, fused=True)),
             # torch's fused Adagrad is CPU-only
             "adagrad": ("torch Adagrad(foreach=True)", "adagrad", torch.optim.Adagrad, dict(foreach=True)),
             "novograd": ("torch AdamW(fused=True)", "adamw", torch.optim.AdamW, dict(fused=True))}
    results = []
    for kind in args.ops:
        for w, shapes in workloads.items():
            bw = cuda_copy_bandwidth()
            n = numel(shapes)
            lr = torch.tensor(1e-4, device="cuda")
            kw = KWARGS[kind]
            name, floor, cls, tkw = twins[kind]
            makers = [
                ("inductor_lamb op", BYTES_PER_PARAM[kind], lambda: (lambda s=make_state(shapes, kind=kind, device="cuda"): OURS[kind](*s, lr=lr, **kw))),
            ]
            if args.peers:
                makers.append(("plain torch reference (eager)", BYTES_PER_PARAM[kind],
                               lambda: (lambda s=make_state(shapes, kind=kind, device="cuda"): REFERENCE[kind](*s, lr=lr, **kw))))
            if args.compiled_reference and args.peers:
                compiled_ref = torch.compile(REFERENCE[kind])
                makers.append(("torch.compile(reference)", BYTES_PER_PARAM[kind],
                               lambda: (lambda s=make_state(shapes, kind=kind, device="cuda"): compiled_ref(*s, lr=lr, **kw))))
            makers.append((name, BYTES_PER_PARAM[floor],
                           (lambda: lamb_op(shapes, "cuda")) if cls is None else (lambda: torch_optimizer(cls, shapes, "cuda", lr=1e-4, **tkw))))
            if args.peers:
                makers += peer_rows(kind, shapes, "cuda")
            if w == "1000 small tensors":  # what removes the per-tensor host cost
                makers += [
                    (f"inductor_lamb {OPTIMIZERS[kind].__name__} opt.step()", BYTES_PER_PARAM[kind],
                     lambda: torch_optimizer(OPTIMIZERS[kind], shapes, "cuda", lr=1e-4)),
                    ("inductor_lamb op in a CUDA graph", BYTES_PER_PARAM[kind],
                     lambda: cuda_graphed(lambda s=make_state(shapes, kind=kind, device="cuda"): OURS[kind](*s, lr=lr, **kw)))]
                if kind == "lamb":
                    makers.append(("torch AdamW(fused, capturable) in a CUDA graph", BYTES_PER_PARAM["adamw"],
                                   lambda: cuda_graphed(torch_optimizer(torch.optim.AdamW, shapes, "cuda", lr=1e-4,
                                                                        fused=True, capturable=True))))
            table = []
            for method, fl, make in tqdm(makers, desc=f"{kind} {w}", file=sys.stderr, leave=False):
                try:
                    fn = make()
                except Exception as e:  # a peer that cannot run here leaves a note, not a dead table
                    print(f"{method}: {type(e).__name__}: {e}", file=sys.stderr)
                    continue
                with torch.no_grad():
                    # back to back (a loop's steady state), and alone (the GPU idle until its first launch)
                    t = bench_cuda(fn, min_time=args.min_time, calls=5)
                    t_one = bench_cuda(fn, min_time=args.min_time / 2)
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        fn()
                        torch.cuda.synchronize()
                kernels = [e for e in prof.events() if e.device_type.name == "CUDA" and not e.name.startswith("Memcpy")]
                table.append({"op": kind, "workload": w, "method": method, "ms": t * 1e3, "gbs": fl * n / t / 1e9,
                              "one_call_ms": t_one * 1e3, "kernel_ms": sum(e.time_range.elapsed_us() for e in kernels) / 1e3,
                              "floor": fl, "bw": {"copy": bw}, "launches": len(kernels)})
                del fn
                torch.cuda.empty_cache()
            results += table
            ours = table[0]["ms"]
            print(f"{kind.upper()}, {w}: {len(shapes)} tensors, {n / 1e6:.1f}M params; device copy {bw:.0f} GB/s")
            print(f"| {'method':34s} | {'B/param':>7s} | {'ms':>8s} | {'vs ours':>8s} | {'GB/s':>7s} | {'% copy':>7s} "
                  f"| {'alone ms':>8s} | {'kernels ms':>10s} | {'launches':>8s} |")
            print(f"|{'-' * 36}|{'-' * 9}|{'-' * 10}|{'-' * 10}|{'-' * 9}|{'-' * 9}|{'-' * 10}|{'-' * 12}|{'-' * 10}|")
            for r in table:
                print(f"| {r['method']:34s} | {r['floor']:7d} | {r['ms']:8.3f} | {r['ms'] / ours:7.2f}x | "
                      f"{r['gbs']:7.0f} | {100 * r['gbs'] / bw:6.0f}% | {r['one_call_ms']:8.3f} | {r['kernel_ms']:10.3f} "
                      f"| {r['launches']:8d} |")
            print(flush=True)
    return results


OPTIMIZERS = {cls._ops.spec.family: cls for cls in inductor_lamb.optim.OPTIMIZERS}


def run_amp(args) -> list[dict]:
    """What a GradScaler step costs when GradScaler unscales the grads first (the
    default, which gradient clipping needs) against ``unscale_in_step=True`` (the
    kernels unscale, no host sync), on the BERT-like list, side by side."""
    torch.set_num_threads(args.threads)
    shapes = bert_like_shapes()
    n = numel(shapes)
    print(f"# {machine_line(args.threads)}\n")
    print(f"GradScaler step (scaler.step + update), BERT-like list: {len(shapes)} tensors, {n / 1e6:.2f}M params")
    print(f"| {'optimizer':9s} | {'unscale first (default) ms':>27s} | {'unscale in step ms':>18s} | {'ratio':>6s} |")
    print(f"|{'-' * 11}|{'-' * 29}|{'-' * 20}|{'-' * 8}|")
    results = []
    for kind in tqdm(args.ops, desc="GradScaler steps", file=sys.stderr):
        steps = {}
        for in_step in (False, True):
            params = [torch.nn.Parameter(t) for t in make_state(shapes)[0]]
            for p, g in zip(params, make_state(shapes, seed=1)[1]):
                p.grad = g
            opt = OPTIMIZERS[kind](params, lr=1e-4, unscale_in_step=in_step)
            # scale 1: the unscale pass runs in full, and repeated steps keep the grads' values
            scaler = torch.amp.GradScaler("cpu", init_scale=1.0, growth_interval=10**9)
            scaler.scale(torch.ones(()))  # (creates the scale, as scaling the loss does)

            def step(opt=opt, scaler=scaler):
                scaler.step(opt)
                scaler.update()

            steps[in_step] = step
        rounds = {False: [], True: []}
        for _ in range(3):  # alternating rounds: both see the same machine conditions
            for in_step, step in steps.items():
                rounds[in_step].append(bench(step, min_time=args.min_time / 3))
        times = {k: sorted(v)[1] for k, v in rounds.items()}
        del steps
        results.append({"op": kind, "unscale_first_ms": times[False] * 1e3, "in_step_ms": times[True] * 1e3})
        print(f"| {kind:9s} | {times[False] * 1e3:27.2f} | {times[True] * 1e3:18.2f} | "
              f"{times[False] / times[True]:5.2f}x |", flush=True)
    return results


def run_sparse(args) -> list[dict]:
    """Adagrad with the sparse grad of a 1M x 128 embedding, 1% of its rows touched:
    ours against torch.optim.Adagrad, alternating, on the same grads."""
    torch.set_num_threads(args.threads)
    rows, dim = 1_000_000, 128
    gen = torch.Generator().manual_seed(0)
    print(f"# {machine_line(args.threads)}\n")
    grads = []
    for _ in range(4):
        idx = torch.randint(0, rows, (rows // 100,), generator=gen)  # ~1% of the rows, some repeated
        grads.append(torch.sparse_coo_tensor(idx[None], torch.randn(len(idx), dim, generator=gen), (rows, dim)))
    weight = torch.randn(rows, dim, generator=gen)
    methods = {"inductor_lamb Adagrad": inductor_lamb.Adagrad, "torch.optim.Adagrad": torch.optim.Adagrad}
    steps = {}
    for name, cls in methods.items():
        p = torch.nn.Parameter(weight.clone())
        opt = cls([p], lr=0.01)
        it = iter(range(10**9))

        def step(p=p, opt=opt, it=it):
            p.grad = grads[next(it) % len(grads)]
            opt.step()

        steps[name] = step
    times = {name: [] for name in methods}
    for r in tqdm(range(8), desc="sparse Adagrad", file=sys.stderr):  # alternating rounds, the first discarded
        for name, step in steps.items():  # (the first steps of a process are slower: warm-up)
            t = bench(step, min_time=args.min_time / 4, warmup=10)
            if r:
                times[name].append(t)
    ms = {name: 1e3 * sorted(t)[len(t) // 2] for name, t in times.items()}
    ours = ms["inductor_lamb Adagrad"]
    print(f"Sparse Adagrad: {rows} x {dim} embedding (float32), 1% of rows touched per step "
          f"({grads[0].coalesce()._nnz()} rows after coalescing)")
    print(f"| {'method':22s} | {'ms':>8s} | {'vs ours':>8s} |")
    print(f"|{'-' * 24}|{'-' * 10}|{'-' * 10}|")
    for name, t in ms.items():
        print(f"| {name:22s} | {t:8.2f} | {t / ours:7.2f}x |")
    return [{"method": name, "ms": t} for name, t in ms.items()]


def run_vs_adamw(args) -> list[dict]:
    """Each optimizer's eager ``opt.step()`` against ``torch.optim.AdamW(fused=True)`` on the same
    shapes, at 1 and 2 threads: all rows of a (list, threads) cell alternate in rounds (the best
    round's median each), beside a STREAM triad measured in the same rounds; GB/s at each
    method's bytes/param floor."""
    from benchmarks.common import median_seconds

    lists = {"BERT-like": bert_like_shapes(),
             "BERT-large sizes": bert_like_shapes(hidden=1024, ffn=4096, layers=3, vocab=8192)}
    makers = {"Lamb": lambda ps: inductor_lamb.Lamb(ps, lr=1e-3), "Lamb16": lambda ps: inductor_lamb.Lamb16(ps, lr=1e-3),
              "Lars": lambda ps: inductor_lamb.Lars(ps, lr=1e-3), "NovoGrad": lambda ps: inductor_lamb.NovoGrad(ps, lr=1e-3),
              "AdamW(fused=True)": lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True)}
    floor = {"Lamb": 40, "Lamb16": 26, "Lars": 28, "NovoGrad": 24, "AdamW(fused=True)": 28}
    a, b, c = (torch.rand(1 << 25) for _ in range(3))
    out = []
    print(machine_line(2))
    print("| list | threads | optimizer | ms | x AdamW | GB/s | % triad |")
    print("|---|---|---|---|---|---|---|")
    for list_name, shapes in lists.items():
        gen = torch.Generator().manual_seed(0)
        opts = {}
        for name, make in makers.items():
            ps = [torch.nn.Parameter(torch.randn(s, generator=gen) * 0.02) for s in shapes]
            for p in ps:
                p.grad = torch.randn(p.shape, generator=gen) * 1e-3
            opts[name] = make(ps)
            opts[name].step()
        n = numel(shapes)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            best: dict[str, float] = {}
            for _ in tqdm(range(5), desc=f"{list_name}, {threads} threads", file=sys.stderr):
                for name, opt in opts.items():
                    best[name] = min(best.get(name, float("inf")), median_seconds(opt.step, lambda: None, 7))
                triad = median_seconds(lambda: torch.add(b, c, alpha=1.5, out=a), lambda: None, 7)
                best["triad"] = min(best.get("triad", float("inf")), triad)
            triad_gbs = 12 * a.numel() / best["triad"] / 1e9
            for name in opts:
                gbs = floor[name] * n / best[name] / 1e9
                row = {"list": list_name, "threads": threads, "optimizer": name, "ms": best[name] * 1e3,
                       "x_adamw": best[name] / best["AdamW(fused=True)"], "gbs": gbs, "triad": triad_gbs}
                out.append(row)
                print(f"| {list_name} ({len(shapes)} tensors, {n / 1e6:.1f}M) | {threads} | {name} | "
                      f"{row['ms']:.2f} | {row['x_adamw']:.2f} | {gbs:.1f} | {gbs / triad_gbs * 100:.0f}% |")
    return out


def run_passes(args) -> list[dict]:
    """Each layer-wise op (``--ops``, those with phases) on the BERT-like list: the one-call step,
    pass 1 alone (the reduce op), pass 2 alone (the apply op, given pass 1's reductions), and for
    LAMB16 the one-call step rounding to nearest; beside torch's fused AdamW on the same shapes,
    all alternating in 5 rounds (the best round's median each), at ``--threads``."""
    from benchmarks.common import median_seconds
    from inductor_lamb.spec import SPECS

    torch.set_num_threads(args.threads)
    shapes = bert_like_shapes()
    n = numel(shapes)
    lr = torch.tensor(1e-4)
    rows: dict[str, tuple[int, Callable[[], object]]] = {
        "AdamW(fused=True)": (BYTES_PER_PARAM["adamw"], torch_optimizer(torch.optim.AdamW, shapes, lr=1e-4, fused=True))}
    # Bytes each phase must move (docs/design.md): pass 1 reads what the update needs; pass 2
    # reads it again and writes p and the state.
    pass1_bytes = {"lamb": 24, "lamb16": 10, "lars": 8, "novograd": 4}
    for kind in args.ops:
        spec = SPECS[f"{kind}_step_"]
        if not spec.reduce_op:
            continue
        kw = KWARGS[kind]
        s = make_state(shapes, kind=kind)
        rows[f"{kind} one call"] = (BYTES_PER_PARAM[kind], lambda s=s, kw=kw, k=kind: OURS[k](*s, lr=lr, **kw))
        reduce, apply = getattr(inductor_lamb.ops, spec.reduce_op), getattr(inductor_lamb.ops, spec.apply_op)
        s = make_state(shapes, kind=kind)
        sums = reduce(*s, lr=lr, **kw)
        rows[f"{kind} pass 1 (reduce)"] = (pass1_bytes[kind], lambda s=s, kw=kw, r=reduce: r(*s, lr=lr, **kw))
        rows[f"{kind} pass 2 (apply, no stash)"] = (
            BYTES_PER_PARAM[kind] - pass1_bytes[kind], lambda s=s, kw=kw, a=apply, sums=sums: a(*s, sums, lr=lr, **kw))
        if kind == "lamb16":
            s = make_state(shapes, kind=kind)
            rows["lamb16 one call, round to nearest"] = (
                BYTES_PER_PARAM[kind], lambda s=s, kw=kw: OURS["lamb16"](*s, lr=lr, stochastic_rounding=False, **kw))
    a, b, c = (torch.rand(1 << 25) for _ in range(3))
    best: dict[str, float] = {}
    for _ in tqdm(range(5), desc="rounds", file=sys.stderr):
        for name, (_, fn) in rows.items():
            best[name] = min(best.get(name, float("inf")), median_seconds(fn, lambda: None, 7))
        best["triad"] = min(best.get("triad", float("inf")),
                            median_seconds(lambda: torch.add(b, c, alpha=1.5, out=a), lambda: None, 7))
    triad_gbs = 12 * a.numel() / best["triad"] / 1e9
    print(machine_line(args.threads))
    print(f"BERT-like list ({len(shapes)} tensors, {n / 1e6:.1f}M params); triad {triad_gbs:.1f} GB/s")
    print("| step | B/param | ms | x AdamW | GB/s | % triad |")
    print("|---|---|---|---|---|---|")
    out = []
    for name, (floor, _) in rows.items():
        gbs = floor * n / best[name] / 1e9
        out.append({"step": name, "ms": best[name] * 1e3, "x_adamw": best[name] / best["AdamW(fused=True)"], "gbs": gbs})
        print(f"| {name} | {floor} | {best[name] * 1e3:.2f} | {out[-1]['x_adamw']:.2f} | {gbs:.1f} | "
              f"{gbs / triad_gbs * 100:.0f}% |")
    return out


def run_in_training(args) -> list[dict]:
    """Each optimizer's eager ``opt.step()`` inside an eager training loop (an 8-layer MLP of width
    1536, 18.9M params, batch 256), where forward and backward between steps evict the optimizer's
    data from the caches as in training: the step's time alone, median of the loop's steps, each
    optimizer on its own copy of the model, in alternating rounds."""
    torch.set_num_threads(args.threads)
    makers = {"Lamb": lambda ps: inductor_lamb.Lamb(ps, lr=1e-3), "Lamb16": lambda ps: inductor_lamb.Lamb16(ps, lr=1e-3),
              "Lars": lambda ps: inductor_lamb.Lars(ps, lr=1e-3), "NovoGrad": lambda ps: inductor_lamb.NovoGrad(ps, lr=1e-3),
              "AdamW(fused=True)": lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True)}
    torch.manual_seed(0)
    base = torch.nn.Sequential(*[m for _ in range(8) for m in (torch.nn.Linear(1536, 1536), torch.nn.GELU())])
    x = torch.randn(256, 1536)
    runs = {}
    for name, make in makers.items():
        model = copy.deepcopy(base)
        runs[name] = (model, make(list(model.parameters())), [])
    n = sum(p.numel() for p in base.parameters())
    for _ in tqdm(range(5), desc="rounds", file=sys.stderr):
        for name, (model, opt, times) in runs.items():
            for it in range(6):
                model(x).square().mean().backward()
                t0 = time.perf_counter()
                opt.step()
                if it:  # (the first step of a round follows another model's loop)
                    times.append(time.perf_counter() - t0)
                opt.zero_grad(set_to_none=False)
    print(machine_line(args.threads))
    print(f"opt.step() in an eager training loop: 8 x Linear(1536, 1536), {n / 1e6:.1f}M params, batch 256")
    print("| optimizer | step ms | x AdamW |")
    print("|---|---|---|")
    med = {name: statistics.median(times) for name, (_, _, times) in runs.items()}
    out = []
    for name, t in med.items():
        out.append({"optimizer": name, "ms": t * 1e3, "x_adamw": t / med["AdamW(fused=True)"]})
        print(f"| {name} | {t * 1e3:.2f} | {t / med['AdamW(fused=True)']:.2f} |")
    return out


def state_bytes(shapes) -> str:
    """Measured state bytes per param of Lamb16 and Lamb on these shapes."""
    params = [torch.nn.Parameter(torch.empty(s)) for s in shapes]
    b16 = inductor_lamb.Lamb16(params).state_bytes_per_param()
    b32 = inductor_lamb.Lamb(params).state_bytes_per_param()
    return f"Lamb16 {b16:.4f} B, Lamb {b32:.4f} B"


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r["op"] for r in results))
    workloads = list(dict.fromkeys(r["workload"] for r in results))
    fig, axes = plt.subplots(len(ops), len(workloads), figsize=(6.5 * len(workloads), 3.2 * len(ops)), squeeze=False)
    for i, kind in enumerate(ops):
        for ax, w in zip(axes[i], workloads):
            rows = [r for r in results if r["op"] == kind and r["workload"] == w]
            bw = rows[0]["bw"]
            ax.barh([r["method"] for r in rows], [r["gbs"] for r in rows], color="tab:blue")
            ax.axvline(bw["triad"], color="tab:red", linestyle="--", label=f"triad {bw['triad']:.0f} GB/s")
            ax.axvline(bw["rmw"], color="tab:green", linestyle=":", label=f"a += s*b {bw['rmw']:.0f} GB/s")
            ax.set_title(f"{kind.upper()} step, {w}")
            ax.set_xlabel("GB/s at the method's bytes/param floor (higher is better)")
            ax.invert_yaxis()
            ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds of repeats per row")
    ap.add_argument("--plot", default="", help="save a PNG bar chart here")
    ap.add_argument("--ops", nargs="+", default=KINDS, choices=KINDS)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--capability", default="", choices=["", "default", "avx2", "avx512"],
                    help="run our CPU kernels of this instruction set (default: the best this CPU has)")
    ap.add_argument("--no-compiled-reference", dest="compiled_reference", action="store_false",
                    help="leave out the torch.compile(reference) row (its compile takes minutes on large lists)")
    ap.add_argument("--no-peers", dest="peers", action="store_false",
                    help="--device cuda: our op and its torch twin only (no reference, timm or torchao rows)")
    ap.add_argument("--amp", action="store_true",
                    help="only the GradScaler table: unscale first (default) vs unscale_in_step=True")
    ap.add_argument("--rounding", action="store_true",
                    help="only the table of bf16 params rounded to nearest vs stochastically")
    ap.add_argument("--checks", action="store_true",
                    help="only the table of what the argument checks cost against the step (1, 68, 1000 tensors)")
    ap.add_argument("--sparse", action="store_true",
                    help="only the sparse Adagrad table (1M x 128 embedding, 1%% of rows touched)")
    ap.add_argument("--vs-adamw", action="store_true",
                    help="only the optimizers' steps against torch's fused AdamW at 1 and 2 threads, on the "
                         "BERT-like list and on BERT-large's tensor sizes, with a triad from the same run")
    ap.add_argument("--passes", action="store_true",
                    help="only where each layer-wise op's time goes: its one-call step and its two phases alone, "
                         "beside torch's fused AdamW (BERT-like list)")
    ap.add_argument("--in-training", action="store_true",
                    help="only the optimizers' steps inside an eager training loop (forward and backward between "
                         "steps), against torch's fused AdamW")
    args = ap.parse_args()
    if args.capability:  # (every table's CPU kernels)
        inductor_lamb.set_cpu_capability(args.capability)
    if args.in_training:
        run_in_training(args)
    elif args.passes:
        run_passes(args)
    elif args.vs_adamw:
        run_vs_adamw(args)
    elif args.checks:
        run_checks(args)
    elif args.rounding:
        run_rounding(args)
    elif args.amp or args.sparse:
        if args.amp:
            run_amp(args)
        if args.sparse:
            run_sparse(args)
    else:
        run_cuda(args) if args.device == "cuda" else run(args)


if __name__ == "__main__":
    main()
