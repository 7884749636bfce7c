"""The tests' shared helpers (test modules import them from here, never from each
other): random op arguments, layouts, comparisons, the compiled op cases, and the
small models of the optimizer and compiled-step tests."""

from __future__ import annotations

import copy
import io
import math
import os
import re

import pytest
import torch
from hypothesis import HealthCheck, settings
from torch import nn
from torch._inductor.utils import run_and_get_code

import inductor_lamb  # (registers torch.ops.lamb.*)
from inductor_lamb import Adagrad, Lamb, Lamb16, Lars, NovoGrad
from inductor_lamb.spec import SPECS, Role

# Property-based tests (test_properties.py, test_group_values.py, test_chunk_layout.py): "ci", a
# fixed seed and a budget of about a minute, unless --hypothesis-profile names another ("long": a
# search of some minutes; "search": tests/property_search.py's time-boxed rounds).
_SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=1000, derandomize=True, deadline=None, database=None,
                          suppress_health_check=_SLOW_DATA, print_blob=True)
settings.register_profile("long", max_examples=20000, deadline=None, suppress_health_check=_SLOW_DATA,
                          print_blob=True)
# tests/property_search.py's rounds: a seed of their own each (--hypothesis-seed), nothing stored
settings.register_profile("search", max_examples=int(os.environ.get("INDUCTOR_LAMB_SEARCH_EXAMPLES", "1000")),
                          deadline=None, database=None, suppress_health_check=_SLOW_DATA, print_blob=True)
settings.load_profile("ci")

# Mixed shapes: empty, 0-d, tiny, odd sizes (vector tails), and > 1 chunk (16384 elements).
MIXED_SHAPES = [(33, 17), (), (0,), (4, 0, 3), (7,), (64, 48), (40000,), (3, 5, 7), (1,)]


@pytest.fixture(autouse=True)
def _restore_threads_and_capability():
    threads = torch.get_num_threads()
    cap = inductor_lamb.cpu_capability()
    yield
    torch.set_num_threads(threads)
    inductor_lamb.set_cpu_capability(cap)


def randn(shape, dtype=torch.float32, gen=None, scale=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def make_lists(shapes, dtype=torch.float32, seed=0, step=0.0):
    """params, grads (param dtype), exp_avgs, exp_avg_sqs (float32, nonzero), steps."""
    gen = torch.Generator().manual_seed(seed)
    params = [randn(s, dtype, gen) for s in shapes]
    grads = [randn(s, dtype, gen) for s in shapes]
    exp_avgs = [randn(s, torch.float32, gen, 0.1) for s in shapes]
    exp_avg_sqs = [(torch.rand(s, generator=gen, dtype=torch.float64) * 0.1 + 1e-3).float() for s in shapes]
    steps = [torch.tensor(step) for _ in shapes]
    return params, grads, exp_avgs, exp_avg_sqs, steps


def clone_lists(lists, dtype=None):
    return [[t.detach().clone() if dtype is None else t.detach().to(dtype) for t in lst] for lst in lists]


def noncontiguous_like(t: torch.Tensor, kind: str) -> torch.Tensor:
    """A tensor equal to ``t`` with another memory layout.

    kind: "transposed" (dense, permuted strides) or "strided" (gaps between elements).
    """
    if t.dim() == 0 or t.numel() == 0 or (kind == "transposed" and t.dim() < 2):
        return t.clone()  # (permuting one dim would give a view of t itself)
    if kind == "transposed":
        dims = list(range(t.dim()))[::-1]
        return t.permute(dims).contiguous().permute(dims)
    big = torch.empty(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype, device=t.device)
    view = big[..., ::2]
    view.copy_(t)
    return view


def lamb_calls(code: str) -> list[str]:
    """The lines of Inductor-generated ``code`` that call a ``torch.ops.lamb`` op.
    Comments don't count: Inductor names in them the FX nodes a kernel came from
    (``# Graph fragment: ... target=torch.ops.lamb.lamb_step_.default``, seen in
    Triton kernels with torch 2.11)."""
    return [line.strip() for line in code.splitlines()
            if "torch.ops.lamb." in line and not line.lstrip().startswith("#")]


def snapshot(lists):
    return copy.deepcopy([[t.detach().clone() for t in lst] for lst in lists if lst is not None])


def equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    """torch.equal that also compares float8 tensors (bit patterns; torch.equal
    has no float8 kernel on CPU)."""
    if x.dtype != y.dtype:
        return False
    if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        x, y = x.view(torch.uint8), y.view(torch.uint8)
    return torch.equal(x, y)


def assert_tensor_close(x: torch.Tensor, y: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-6, msg=None) -> None:
    """assert_close, and for float8 tensors (LAMB16's moments): codes equal except
    rare neighbours (a float32 ulp upstream can move a value across a rounding tie)."""
    if x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        assert x.dtype == y.dtype and x.shape == y.shape
        if x.numel():
            diff = (x.view(torch.uint8).int() - y.view(torch.uint8).int()).abs()
            assert diff.max() <= 1 and (diff != 0).double().mean() <= 1e-3, msg(f"{(diff != 0).sum()} codes differ") if msg else None
        return
    torch.testing.assert_close(x, y, rtol=rtol, atol=atol, msg=msg)


def assert_lists_equal(a, b):
    for la, lb in zip(a, b):
        for x, y in zip(la, lb):
            assert equal(x, y)


def raw_op_kwargs(name: str, kwargs: dict, device="cpu") -> dict:
    """``kwargs`` for a direct ``torch.ops.lamb.<name>`` call: the scheduled
    hyper-parameters other than lr (betas, momentum) as 0-d float32 tensors on
    ``device``, their spec defaults when absent (the schema has no defaults for them)."""
    from inductor_lamb.spec import SPECS, Role

    out = dict(kwargs)
    for a in SPECS[name].of(Role.TENSOR):
        if a.name != "lr":
            v = out.get(a.name, a.default)
            out[a.name] = v if isinstance(v, torch.Tensor) else torch.tensor(float(v), device=device)
    return out


def assert_params_close(a, b, rtol=1e-5, atol=2e-6, flip_atol=0.02):
    """Close to float32 rounding, except that a float8 code that rounded the other
    way at an earlier step (see assert_state_close) moves its element by up to
    about lr * 2 * 13% * |u|: at most 0.1% of the elements may be off by <= flip_atol."""
    for i, (x, y) in enumerate(zip(a, b)):
        x, y = x.double(), y.double()
        off = (x - y).abs() > atol + rtol * y.abs()
        if off.any():
            assert off.double().mean() <= 1e-3, f"params[{i}]: {off.sum()} of {x.numel()} elements differ"
            torch.testing.assert_close(x, y, rtol=0, atol=flip_atol, msg=lambda m: f"params[{i}] {m}")


# ---- optimizer training runs (test_lamb_optim, test_lamb16_optim) ---------------------------

def make_model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(12, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 5))
    return model.to(dtype)


def batches(n, seed=100, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 12, generator=gen).to(dtype), torch.randint(0, 5, (16,), generator=gen)) for _ in range(n)]


def train(model, opt, data, scheduler=None, scaler=None):
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x).float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(loss.item())
    return losses


def checkpoint(obj):
    """``obj`` after torch.save and torch.load(weights_only=True)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# ---- compiled op calls (test_compile, test_spec, test_two_phase, test_generated_code, test_cuda) --

@pytest.fixture
def lowering_path():
    """These tests compile op calls on graph inputs, which the default "auto" path
    sends to the C++ kernel: they run the lowering unless they pick a path."""
    inductor_lamb.set_compile_path("lowering")
    torch._dynamo.reset()
    yield
    inductor_lamb.set_compile_path("auto")
    torch._dynamo.reset()


def use_path(path: str) -> None:
    assert inductor_lamb.set_compile_path(path) == path
    torch._dynamo.reset()


# (op, keyword arguments); each is compiled and run against the eager C++ kernel on
# the same data. The list arguments come from the op's spec (op_args).
OP_CASES = {
    "lamb": ("lamb_step_", dict(weight_decay=0.01)),
    "lamb_all_options": ("lamb_step_", dict(beta1=0.8, beta2=0.99, eps=1e-5, weight_decay=0.1, trust_clip=True,
                                            max_grad_norm=1.0, grad_scale=torch.tensor(4.0))),
    "lamb_decoupled": ("lamb_step_", dict(weight_decay=0.1, decoupled_decay=True)),
    "lamb_corrected_decay": ("lamb_step_", dict(weight_decay=0.2, decoupled_decay=True, max_lr=0.05, trust_clip=True)),
    "lamb_no_bias_correction_always_adapt": (
        "lamb_step_", dict(weight_decay=0.0, bias_correction=False, grad_averaging=False, always_adapt=True)),
    "lamb16": ("lamb16_step_", dict(weight_decay=0.01)),
    "lamb16_all_options": ("lamb16_step_", dict(beta1=0.8, beta2=0.99, eps=1e-5, weight_decay=0.1,
                                                trust_scale=1.0, grad_scale=torch.tensor(4.0))),
    "lars": ("lars_step_", dict(momentum=0.8, weight_decay=[1e-3, 0.0, 5e-4] * 3,
                                layer_adaptation=[True, True, False] * 3, rescale_grad=0.5)),
    "lars_grad_scale": ("lars_step_", dict(eps=1e-8, grad_scale=torch.tensor(2.0))),
    "lars_lr_outside": ("lars_step_", dict(momentum=0.8, weight_decay=[1e-3, 0.0, 5e-4] * 3, lr_in_momentum=False,
                                          layer_adaptation=[True, False, True] * 3)),
    "adagrad": ("adagrad_step_", dict(lr_decay=0.01, weight_decay=0.1)),
    "adagrad_maximize": ("adagrad_step_", dict(maximize=True, grad_scale=torch.tensor(8.0))),
    "novograd": ("novograd_step_", dict(weight_decay=0.01)),
    "novograd_all_options": ("novograd_step_", dict(beta1=0.9, beta2=0.99, eps=1e-6, weight_decay=0.05,
                                                    grad_averaging=True, amsgrad=True, grad_scale=torch.tensor(4.0))),
    "novograd_decoupled": ("novograd_step_", dict(weight_decay=0.1, decoupled_decay=True, grad_averaging=True)),
    "novograd_corrected_decay": ("novograd_step_", dict(weight_decay=0.1, decoupled_decay=True, max_lr=0.03)),
}
# State lists whose values are >= 0 (second moments, Adagrad's sums)
NONNEGATIVE = ("exp_avg_sqs", "state_sums")


def spec_lists(name: str, shapes, dtype=torch.float32, seed=0, layout: str | None = None) -> list:
    """Random list arguments of op ``name`` in schema order, one per list argument of
    its spec: params/grads, state lists (float32 or float8 with matching scales),
    0-d scalars (steps 2.0), and an apply op's reductions."""
    p, g, m, v, s = make_lists(shapes, dtype=dtype, seed=seed, step=2.0)
    out = []
    for a in SPECS[name].args:
        if a.role is Role.PARAMS:
            t = p
        elif a.role is Role.GRADS:
            t = g
        elif a.role is Role.STATE and a.dtype == torch.float8_e4m3fn:
            t = [(x * 4000).clamp(-448, 448).to(a.dtype) for x in m]
        elif a.role is Role.STATE and a.dtype == torch.float8_e5m2:
            t = [(x * 5e5).to(a.dtype) for x in v]
        elif a.role is Role.STATE:
            t = [x.clone() for x in (v if a.name in NONNEGATIVE else m)]
        elif a.role is Role.SCALARS:
            # (a per-tensor moment, such as NovoGrad's v and its max: 0.3)
            value = {"steps": 2.0, "exp_avg_scales": 2.5e-4, "exp_avg_sq_scales": 2e-6}.get(a.name, 0.3)
            t = [torch.tensor(value) for _ in shapes]
        elif a.role is Role.REDUCTIONS:  # plausible (positive) partial reductions
            out.append(torch.rand(len(shapes), len(SPECS[name].reductions), generator=torch.Generator().manual_seed(seed)) + 0.1)
            continue
        else:
            continue
        if layout is not None and a.role in (Role.PARAMS, Role.GRADS, Role.STATE):
            t = [noncontiguous_like(x, layout) for x in t]
        out.append(t)
    return out


def op_args(case: str, layout: str | None = None, dtype=torch.float32, shapes=MIXED_SHAPES, seed=0):
    """(op name, list arguments, kwargs for the raw op) for ``case`` on random data."""
    name, kwargs = OP_CASES[case]
    # per-param option lists (LARS's weight_decay, layer_adaptation) cycled to one per param
    kwargs = {k: [v[i % len(v)] for i in range(len(shapes))] if isinstance(v, list) else v
              for k, v in kwargs.items()}
    args = spec_lists(name, shapes, dtype=dtype, seed=seed, layout=layout)
    kwargs = raw_op_kwargs(name, kwargs)
    if dtype != torch.float32:
        kwargs["master_params"] = [t.float() for t in args[0]]
    return name, args, kwargs


def eager_call(name, args, lr, kwargs):
    getattr(torch.ops.lamb, name)(*args, lr, **kwargs)


def code_summary(name: str, n_params: int) -> str:
    shapes = [MIXED_SHAPES[i % len(MIXED_SHAPES)] for i in range(n_params)]
    # the op's first case (LARS: one with the same options for every param)
    case = "lars_grad_scale" if name == "lars_step_" else next(c for c, (op, _) in OP_CASES.items() if op == name)
    _, args, kwargs = op_args(case, shapes=shapes)
    torch._dynamo.reset()
    _, codes = run_and_get_code(torch.compile(eager_call, fullgraph=True), name, args, torch.tensor(0.1), kwargs)
    code = "\n".join(codes)
    kernels = code.count("async_compile.cpp_pybinding(") + code.count("async_compile.triton(")
    # temporaries the size of a tensor: traffic beyond the op's floor (not the 0-d
    # scalars, nor each param's few-element packet of lr / betas: backends.py per_tensor)
    temps = sum(math.prod(int(d) for d in re.findall(r"\d+", shape)) > 8
                for shape in re.findall(r"empty_strided_\w+\(\(([^)]*)\)", code))
    return f"{kernels} kernel(s), {len(lamb_calls(code))} external lamb call(s), {temps} temporary buffer(s)"


# ---- compiled training steps (test_compile, test_cuda) ----------------------------------------

STEP_OPTIMIZERS = {
    "Lamb": (Lamb, dict(lr=0.02, weight_decay=0.01)),
    "Lamb16": (Lamb16, dict(lr=0.02, weight_decay=0.01)),
    "Lars": (Lars, dict(lr=0.3, weight_decay=1e-3)),
    "Adagrad": (Adagrad, dict(lr=0.05, weight_decay=1e-4)),
    "NovoGrad": (NovoGrad, dict(lr=0.01, weight_decay=1e-3)),
}


# ---- param-group keys: ours, torch.optim's, and what other libraries write -------------------

def torch_optim_group_keys() -> set[str]:
    """The param-group keys of torch.optim's own optimizers: a library that writes one of them
    means torch's meaning (lr, betas, weight_decay, ...), which is ours where we have the key."""
    p = [torch.nn.Parameter(torch.zeros(1))]
    classes = [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.RMSprop,
               torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adadelta, torch.optim.ASGD,
               torch.optim.Rprop]
    return set().union(*(cls(p, lr=0.1).param_groups[0] for cls in classes))


def our_group_keys() -> set[str]:
    """The param-group keys our optimizers hold that torch.optim's do not (ours alone to mean)."""
    import inductor_lamb

    p = [torch.nn.Parameter(torch.zeros(1))]
    ours = set().union(*(cls(p, lr=0.1).param_groups[0] for cls in inductor_lamb.optim.OPTIMIZERS))
    return ours - torch_optim_group_keys()


def keys_written(opt: torch.optim.Optimizer, run) -> set[str]:
    """The param-group keys that ``run()`` (a library driving ``opt``) adds to its groups."""
    before = {k for g in opt.param_groups for k in g}
    run()
    return {k for g in opt.param_groups for k in g} - before


def make_step_model(seed=0):
    # No LayerNorm here: its zero-initialised bias gets grads with heavy cancellation,
    # whose compiled-vs-eager rounding LAMB's first steps amplify to ~1e-5 (measured).
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 5))


def step_batches(n, seed=100):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 12, generator=gen), torch.randint(0, 5, (16,), generator=gen)) for _ in range(n)]


def train_step(model, opt, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


class CountingBackend:
    """Inductor, counting compilations."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.graphs += 1
        return compile_fx(gm, example_inputs)


def spawn(cases: object, case: str, world: int, *args, timeout: float = 120.0) -> None:
    """Runs ``cases.<case>(rank, world, *args)`` on ``world`` spawned ranks (``cases``: a module
    of rank functions, optionally with ``setup_rank()``, run first on every rank), each in a
    gloo group on a file store in a temporary directory; fails on any rank's error or after
    ``timeout`` seconds."""
    import os
    import tempfile
    import time

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.spawn(_run_rank, args=(cases.__name__, world, os.path.join(tmp, "store"), case, args),
                       nprocs=world, join=False)
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                for p in ctx.processes:
                    p.kill()
                pytest.fail(f"{case}{args} did not finish in {timeout:.0f} s at world size {world}")


def _run_rank(rank: int, module: str, world: int, init_file: str, case: str, args: tuple) -> None:
    """Entry point of one spawned rank of :func:`spawn`."""
    import importlib
    import os
    import sys
    import traceback

    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        cases = importlib.import_module(module)
        getattr(cases, "setup_rank", lambda: None)()
        getattr(cases, case)(rank, world, *args)
        dist.barrier()  # no rank tears its connections down while another still talks
    except BaseException:
        traceback.print_exc()  # (the traceback of every failing rank, not only the first one)
        raise
    finally:
        dist.destroy_process_group()
    # A passing rank leaves without interpreter finalization: gloo's threads sometimes
    # outlive it there and abort the process ("terminate called without an active
    # exception", SIGABRT) after the case has passed, failing the test at random.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---- C++ built on the host (tests/cpp): the shared headers with no torch or CUDA header ---------

def host_library(tmp_path_factory, source: str, *flags: str):
    """tests/cpp/``source`` built with the host C++ compiler into a shared library, loaded with
    ctypes (skips the test without a compiler)."""
    import ctypes
    import os
    import shutil
    import subprocess

    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path_factory.mktemp(source.split(".")[0]) / f"lib{source.split('.')[0]}.so"
    subprocess.run([cxx, "-std=c++17", "-O2", *flags, "-Wall", "-Werror", "-shared", "-fPIC",
                    "-I", os.path.join(root, "csrc"), os.path.join(root, "tests", "cpp", source), "-o", str(out)],
                   check=True)
    return ctypes.CDLL(str(out))
