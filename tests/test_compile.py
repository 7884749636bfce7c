"""torch.compile of the ops and optimizers: the Inductor lowerings, their fallbacks, the cache key."""

from __future__ import annotations

import copy
import inspect
import json
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import (
    MIXED_SHAPES,
    OP_CASES,
    STEP_OPTIMIZERS,
    CountingBackend,
    assert_tensor_close,
    clone_lists,
    code_summary,
    eager_call,
    equal,
    lamb_calls,
    make_step_model,
    op_args,
    step_batches,
    train_step,
    use_path,
)
from torch import nn
from torch._inductor.utils import run_and_get_code

import inductor_lamb
from inductor_lamb import Lamb16, Lars, reference
from inductor_lamb import _inductor as lowering_mod
from inductor_lamb._inductor import paths as paths_mod

PATHS = inductor_lamb._inductor.PATHS
# These tests compile op calls on graph inputs, which the default "auto" path sends
# to the C++ kernel: they run the lowering unless they pick a path.
pytestmark = pytest.mark.usefixtures("lowering_path")


# ---- op calls ------------------------------------------------------------------------

def run_op(fn, name, args, kwargs, lrs):
    for lr in lrs:
        fn(name, args, torch.tensor(lr), kwargs)


def all_lists(args, kwargs):
    return [*args, *([kwargs["master_params"]] if "master_params" in kwargs else [])]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(OP_CASES))
def test_compiled_op_matches_eager(path, case):
    use_path(path)
    name, args, kwargs = op_args(case)
    compiled = torch.compile(eager_call, fullgraph=True)
    c_args, c_kwargs = clone_lists(args), dict(kwargs)
    run_op(compiled, name, c_args, c_kwargs, [0.01, 0.02, 0.005])
    run_op(eager_call, name, args, kwargs, [0.01, 0.02, 0.005])
    for i, (a, b) in enumerate(zip(c_args, args)):
        for j, (x, y) in enumerate(zip(a, b)):
            assert_tensor_close(x, y, rtol=1e-5, atol=1e-6, msg=lambda m: f"list {i}[{j}]: {m}")
    assert c_args[1] is not args[1] and all(torch.equal(x, y) for x, y in zip(c_args[1], args[1]))  # grads


@pytest.mark.parametrize("layout", ["transposed", "strided"])
@pytest.mark.parametrize("case", ["lamb", "lamb16", "lars", "adagrad"])
def test_lowering_noncontiguous_matches_contiguous(case, layout):
    compiled = torch.compile(eager_call, fullgraph=True)
    name, nc_args, kwargs = op_args(case, layout=layout)
    _, args, _ = op_args(case)
    run_op(compiled, name, nc_args, kwargs, [0.01, 0.03])
    run_op(eager_call, name, args, kwargs, [0.01, 0.03])
    for a, b in zip(nc_args, args):
        for x, y in zip(a, b):
            assert_tensor_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["lamb", "lamb16", "lars", "adagrad"])
def test_lowering_low_precision_with_master(case, dtype):
    compiled = torch.compile(eager_call, fullgraph=True)
    name, c_args, c_kwargs = op_args(case, dtype=dtype)
    _, args, kwargs = op_args(case, dtype=dtype)
    run_op(compiled, name, c_args, c_kwargs, [0.01, 0.02])
    run_op(eager_call, name, args, kwargs, [0.01, 0.02])
    torch.testing.assert_close(c_kwargs["master_params"], kwargs["master_params"], rtol=1e-5, atol=1e-6)
    for x, m in zip(c_args[0], c_kwargs["master_params"]):
        assert torch.equal(x, m.to(dtype))  # the param is the rounded master


@pytest.mark.parametrize("case", ["lamb_all_options", "lamb16_all_options"])
def test_lowering_matches_float64_reference(case):
    """The lowering against the spec itself (not only against the C++ kernel)."""
    compiled = torch.compile(eager_call, fullgraph=True)
    name, args, kwargs = op_args(case)
    # float64 params, grads (and LAMB's moments); LAMB16's float8 state as it is
    ref = [[t.double() if t.dtype == torch.float32 and t.dim() else t.clone() for t in lst] for lst in args]
    ref_step = reference.lamb_step if name == "lamb_step_" else reference.lamb16_step
    for lr in (0.01, 0.02, 0.005):
        compiled(name, args, torch.tensor(lr), kwargs)
        ref_step(*ref, lr=lr, **kwargs)
    for a, b in zip(args, ref):
        for x, y in zip(a, b):
            assert_tensor_close(x.double() if x.is_floating_point() and x.element_size() > 1 else x,
                                y.double() if y.is_floating_point() and y.element_size() > 1 else y,
                                rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # (bfloat16 params with float32 masters)
@pytest.mark.parametrize("path", ["lowering", "decomposition"])
def test_found_inf_skips_everything_or_nothing(path, dtype):
    use_path(path)
    compiled = torch.compile(eager_call, fullgraph=True)
    for case in ("lamb", "lamb16", "lars", "adagrad", "novograd"):
        name, args, kwargs = op_args(case, dtype=dtype)
        masters = kwargs.pop("master_params", None)
        assert (masters is not None) == (dtype != torch.float32)
        before = clone_lists(args + ([masters] if masters else []))
        compiled(name, args, torch.tensor(0.1), {**kwargs, "master_params": masters, "found_inf": torch.tensor(1.0)})
        for a, b in zip(args + ([masters] if masters else []), before):
            assert all(equal(x, y) for x, y in zip(a, b)), case
        # found_inf = 0: the step itself, exactly as the kernel takes it (steps, bias corrections,
        # and the moments the norms are taken of: read as written, not recomputed after the write)
        compiled(name, args, torch.tensor(0.1), {**kwargs, "master_params": masters, "found_inf": torch.tensor(0.0)})
        eager_call(name, before[:len(args)], torch.tensor(0.1),
                   {**kwargs, "master_params": before[len(args)] if masters else None, "found_inf": torch.tensor(0.0)})
        for i, (a, b) in enumerate(zip(args + ([masters] if masters else []), before)):
            for j, (x, y) in enumerate(zip(a, b)):
                # (a bfloat16 param is its master rounded: one of its ulps where the masters differ in the last bit)
                tol = dict(rtol=1e-5, atol=1e-6) if x.dtype != torch.bfloat16 else dict(rtol=8e-3, atol=1e-5)
                assert_tensor_close(x, y, **tol, msg=lambda m: f"{case} list {i}[{j}]: {m}")
        assert not torch.equal(args[0][0], op_args(case, dtype=dtype)[1][0][0])
        for x, m in zip(args[0], masters or []):
            # (the params are the masters as written: read again after a write under found_inf,
            # the new masters had been stepped a second time)
            assert torch.equal(x, m.to(dtype)), case


def test_bad_input_fails_at_trace_time_with_the_op_message():
    compiled = torch.compile(eager_call, fullgraph=True)
    name, args, kwargs = op_args("lamb")
    args[3] = args[3][:-1]
    with pytest.raises(Exception, match=r"exp_avg_sqs has 8 tensors but params has 9"):
        compiled(name, args, torch.tensor(0.1), kwargs)


# ---- generated code ------------------------------------------------------------------


@pytest.mark.parametrize("case", ["lamb", "lamb_all_options", "lamb16", "lars", "adagrad"])
def test_auto_path_calls_the_kernel_on_cpu(case):
    """The default path on CPU: the step is one call to the C++ kernel, with its exact bits,
    when every tensor of the call is a graph input and when the graph computes one of them
    (here the grads of the first param only, as in a whole training step); the lowering is
    what ``"lowering"`` asks for."""
    use_path("auto")
    name, args, kwargs = op_args(case)
    c_args, e_args = clone_lists(args), clone_lists(args)
    _, codes = run_and_get_code(torch.compile(eager_call, fullgraph=True), name, c_args, torch.tensor(0.01), kwargs)
    eager_call(name, e_args, torch.tensor(0.01), kwargs)
    code = "\n".join(codes)
    calls = lamb_calls(code)
    assert len(calls) == 1 and f"torch.ops.lamb.{name}.default(" in calls[0], calls
    assert "cpp_fused" not in code
    assert all(equal(x, y) for a, b in zip(c_args, e_args) for x, y in zip(a, b))

    def first_grad_halved(name, args, lr, kwargs):
        eager_call(name, [args[0], [args[1][0] * 0.5, *args[1][1:]], *args[2:]], lr, kwargs)

    torch._dynamo.reset()
    _, codes = run_and_get_code(torch.compile(first_grad_halved, fullgraph=True), name, c_args, torch.tensor(0.02),
                                kwargs)
    first_grad_halved(name, e_args, torch.tensor(0.02), kwargs)
    code = "\n".join(codes)
    calls = lamb_calls(code)
    assert len(calls) == 1 and f"torch.ops.lamb.{name}.default(" in calls[0], calls
    for i, (a, b) in enumerate(zip(c_args, e_args)):
        for j, (x, y) in enumerate(zip(a, b)):
            assert_tensor_close(x, y, rtol=1e-5, atol=1e-6, msg=lambda m: f"list {i}[{j}]: {m}")


@pytest.mark.parametrize("path", ["lowering", "auto"])
def test_cpp_wrapper_matches_eager(path):
    """With Inductor's C++ wrapper (kernels called from C++, not through Python) a
    48-param step matches the eager kernel: generated, or (the "auto" path on graph
    inputs) the kernel called through the C++ wrapper's fallback."""
    from torch._inductor import config

    use_path(path)
    shapes = [MIXED_SHAPES[i % len(MIXED_SHAPES)] for i in range(48)]
    name, args, kwargs = op_args("lamb", shapes=shapes)
    c_args = clone_lists(args)
    with config.patch(cpp_wrapper=True):
        _, codes = run_and_get_code(torch.compile(eager_call, fullgraph=True), name, c_args, torch.tensor(0.01), kwargs)
    eager_call(name, args, torch.tensor(0.01), kwargs)
    code = "\n".join(codes)
    # the C++ wrapper finds the op in the dispatcher (torch 2.11's calls it back through Python, by name)
    kernel_call = '"lamb::lamb_step_"' in code or '"torch.ops.lamb.lamb_step_.default"' in code
    if path == "lowering":
        assert not kernel_call and re.search(r"cpp_fused_\w+", code)
    else:
        assert kernel_call and not re.search(r"cpp_fused_\w+", code)
        assert all(equal(x, y) for a, b in zip(c_args, args) for x, y in zip(a, b))
    for i, (a, b) in enumerate(zip(c_args, args)):
        for j, (x, y) in enumerate(zip(a, b)):
            assert_tensor_close(x, y, rtol=1e-5, atol=1e-6, msg=lambda m: f"list {i}[{j}]: {m}")


# ---- training steps --------------------------------------------------------------------

def twin_setups(opt_name):
    """Two identical (model, optimizer, scheduler) triples: one runs eagerly, one compiled."""
    cls, kw = STEP_OPTIMIZERS[opt_name]
    model = make_step_model()
    out = []
    for m in (model, copy.deepcopy(model)):
        opt = cls(m.parameters(), **kw)
        out.append((m, opt, torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.8)))
    return out


@pytest.mark.parametrize("path", ["auto", "lowering", "decomposition"])
@pytest.mark.parametrize("opt_name", list(STEP_OPTIMIZERS))
def test_whole_training_step_one_graph_one_compilation(opt_name, path):
    """Recipe (a): forward, backward, step, zero_grad in one fullgraph graph, compiled once
    while a scheduler changes lr every step; matches eager within 1e-6 relative."""
    use_path(path)
    cls, kw = STEP_OPTIMIZERS[opt_name]
    (model_e, opt_e, sched_e), (model_c, opt_c, sched_c) = twin_setups(opt_name)
    backend = CountingBackend()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(train_step, backend=backend, fullgraph=True)
        for k, (x, y) in enumerate(step_batches(5)):
            if k == 0:  # the lowering paths fuse the step into the graph; "auto" calls the kernel on CPU
                loss, codes = run_and_get_code(compiled, model_c, opt_c, x, y)
                assert bool(lamb_calls("\n".join(codes))) == (path == "auto")
            else:
                loss = compiled(model_c, opt_c, x, y)
            torch.testing.assert_close(loss, train_step(model_e, opt_e, x, y), rtol=1e-6, atol=1e-6)
            sched_e.step()
            sched_c.step()
    assert backend.graphs == 1
    assert float(opt_c.param_groups[0]["lr"]) == pytest.approx(kw["lr"] * 0.8**5)
    for p, q in zip(model_c.parameters(), model_e.parameters()):
        # relative in norm: compiled forward/backward round differently from eager
        # (element-wise relative error is meaningless for entries near 0). Lamb16:
        # a last-bit difference of a grad can move a float8 code by one step (a
        # value at a rounding threshold, or a grad whose bfloat16 truncation the
        # stochastic rounding hashes), which moves one element by ~lr * 12% * |u|.
        assert ((p - q).norm() / q.norm()).item() <= (1e-4 if cls is Lamb16 else 1e-6)
    for p in model_c.parameters():
        assert ("step" not in opt_c.state[p]) if cls is Lars else float(opt_c.state[p]["step"]) == 5.0


@pytest.mark.parametrize("path", ["auto", "lowering"])
@pytest.mark.parametrize("opt_name", list(STEP_OPTIMIZERS))
def test_compiled_model_and_compiled_opt_step(opt_name, path):
    """Recipe (b): a compiled model plus ``torch.compile(opt.step)`` (on the "auto"
    path: the step's tensors are graph inputs, so the kernel runs it)."""
    use_path(path)
    (model_e, opt_e, sched_e), (model_c, opt_c, sched_c) = twin_setups(opt_name)
    cmodel = torch.compile(model_c)
    backend = CountingBackend()
    cstep = torch.compile(opt_c.step, fullgraph=True, backend=backend)
    for x, y in step_batches(4):
        for m, o, st in ((model_e, opt_e, opt_e.step), (cmodel, opt_c, cstep)):
            o.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            st()
        sched_e.step()
        sched_c.step()
    assert backend.graphs == 1
    for p, q in zip(model_c.parameters(), model_e.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _scheduler(opt):
    """A scheduler that changes every scheduled value of ``opt`` each step (lr, and betas or
    momentum where the optimizer has them)."""
    if isinstance(opt, Lars):
        return torch.optim.lr_scheduler.CyclicLR(opt, base_lr=0.1, max_lr=0.3, step_size_up=4, base_momentum=0.8,
                                                 max_momentum=0.9)
    if "betas" in opt.defaults:
        return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=40)
    return torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)


class GraphOps:
    """A backend that records every graph Dynamo hands it (its call targets) and compiles it
    with Inductor."""

    def __init__(self) -> None:
        self.graphs: list[list[str]] = []

    def __call__(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return compile_fx(gm, example_inputs)

    def lamb_ops(self) -> list[str]:
        return [t for g in self.graphs for t in g if t.startswith("lamb.")]


def _compiled_form(form, opt, sched, backend):
    """One step of ``opt`` (and ``sched``) in a compiled form users write, and how its loss is
    made into grads."""
    if form == "compile(opt.step)":
        step = torch.compile(opt.step, backend=backend)
        return torch.Tensor.backward, lambda: (step(), sched.step())
    if form == "opt.step = compile(opt.step)":
        opt.step = torch.compile(opt.step, backend=backend)
        return torch.Tensor.backward, lambda: (opt.step(), sched.step())
    if form == "GradScaler.step":  # (at scale 1: the eager twin's grads, bit for bit)
        opt.step = torch.compile(opt.step, backend=backend)
        scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
        return (lambda loss: scaler.scale(loss).backward()), lambda: (scaler.step(opt), scaler.update(), sched.step())

    @torch.compile(fullgraph=False, backend=backend)  # PyTorch's "Compiling the optimizer" tutorial
    def fn():
        opt.step()
        if form == "tutorial fn, scheduler inside":  # (its LR-scheduler tutorial)
            sched.step()

    return torch.Tensor.backward, (lambda: fn()) if form != "tutorial fn" else (lambda: (fn(), sched.step()))


FORMS = ["compile(opt.step)", "opt.step = compile(opt.step)", "GradScaler.step", "tutorial fn",
         "tutorial fn, scheduler inside"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("opt_name", list(STEP_OPTIMIZERS))
def test_compiled_step_forms_run_the_eager_step(opt_name, form):
    """Every compiled form of the optimizer step that users write (the PyTorch tutorials' among
    them: a compiled function calling ``opt.step()``, with an LR scheduler stepping a tensor lr
    inside it) runs the eager step on CPU params (route ``EAGER_UNDER_COMPILE``): no op call in
    any graph, no recompile over 12 steps while the scheduler changes lr and betas/momentum every
    step and a param loses its grad, the eager twin's bits throughout, and no warning."""
    cls, kw = STEP_OPTIMIZERS[opt_name]
    if cls is inductor_lamb.Lamb:
        kw = {**kw, "max_grad_norm": 0.5}
    tensor_lr = form == "tutorial fn, scheduler inside"
    model_e = make_step_model()
    model_c = copy.deepcopy(model_e)
    opts = [cls(m.parameters(), **{**kw, "lr": torch.tensor(kw["lr"]) if tensor_lr else kw["lr"]})
            for m in (model_e, model_c)]
    scheds = [_scheduler(o) for o in opts]
    backend = GraphOps()
    torch._dynamo.reset()
    twins = [(torch.Tensor.backward, lambda: (opts[0].step(), scheds[0].step())),
             _compiled_form(form, opts[1], scheds[1], backend)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*script_method.*", category=DeprecationWarning)
        for k, (x, y) in enumerate(step_batches(12)):
            for m, o, (backward, st) in zip((model_e, model_c), opts, twins):
                o.zero_grad()
                backward(nn.functional.cross_entropy(m(x), y))
                if 6 <= k < 9:  # the last layer's bias gets no grad for a while
                    list(m.parameters())[-1].grad = None
                st()
            if k == 0:
                first = len(backend.graphs)
    assert not backend.lamb_ops(), backend.graphs
    assert len(backend.graphs) == first, backend.graphs  # (no recompile)
    for p, q in zip(model_c.parameters(), model_e.parameters()):
        assert equal(p, q)
        for key, value in opts[0].state[q].items():
            assert equal(opts[1].state[p][key], value)
    assert float(opts[1].param_groups[0]["lr"]) == float(opts[0].param_groups[0]["lr"])


def test_step_routes():
    """The one decision (optim/_route.py), condition by condition."""
    from inductor_lamb.optim._route import Conditions, Route, route

    assert route(Conditions(False, False, False, True)) is Route.EAGER
    assert route(Conditions(False, True, True, False)) is Route.EAGER
    assert route(Conditions(True, False, False, True)) is Route.EAGER_UNDER_COMPILE
    assert route(Conditions(True, True, False, True)) is Route.TRACED  # fullgraph
    assert route(Conditions(True, False, False, False)) is Route.TRACED  # CUDA or DTensor params
    assert route(Conditions(True, False, True, True)) is Route.TRACED_WITH_BACKWARD
    assert route(Conditions(True, True, True, False)) is Route.TRACED_WITH_BACKWARD


@pytest.mark.parametrize("opt_name", ["Lamb", "Lars"])
def test_fullgraph_and_surrounding_code_trace_the_op_calls(opt_name):
    """``fullgraph=True`` refuses the graph break, so the op calls are traced into the graph (one
    compilation while a scheduler changes the values); a compiled function that also reads or
    writes the params, grads or state around ``opt.step()`` (a clip, a read after) gets the eager
    twin's values either way: code before the step runs first, code after it sees the step."""
    cls, kw = STEP_OPTIMIZERS[opt_name]
    model_e = make_step_model()
    model_c, model_f = copy.deepcopy(model_e), copy.deepcopy(model_e)
    opts = [cls(m.parameters(), **kw) for m in (model_e, model_c, model_f)]
    scheds = [_scheduler(o) for o in opts]
    graph_break, full = GraphOps(), GraphOps()

    def around(m, o):
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1, foreach=True)
        o.step()
        return sum(p.sum() for p in m.parameters())

    torch._dynamo.reset()
    steps = [lambda: around(model_e, opts[0]), torch.compile(lambda: around(model_c, opts[1]), backend=graph_break),
             torch.compile(lambda: around(model_f, opts[2]), backend=full, fullgraph=True)]
    for x, y in step_batches(4):
        outs = []
        for m, o, st, sched in zip((model_e, model_c, model_f), opts, steps, scheds):
            o.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            outs.append(st())
            sched.step()
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(outs[2], outs[0], rtol=1e-5, atol=1e-6)
    assert not graph_break.lamb_ops()
    assert full.lamb_ops() and len(full.graphs) == 1
    for m in (model_c, model_f):
        for p, q in zip(m.parameters(), model_e.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_compiled_step_with_hooks_or_a_closure():
    """Step hooks and a closure run around the eager step (graph break), as eagerly: once each
    step, in order, and the closure's loss is returned."""
    model = make_step_model()
    opt = inductor_lamb.Lamb(model.parameters(), lr=0.01)
    x, y = step_batches(1)[0]
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))

    def closure():
        calls.append("closure")
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    torch._dynamo.reset()
    compiled = torch.compile(opt.step)
    for _ in range(3):
        loss = compiled(closure)
        assert torch.is_tensor(loss)
    assert calls == ["pre", "closure", "post"] * 3
    assert float(opt.state[next(model.parameters())]["step"]) == 3.0


@pytest.mark.parametrize("opt_name", ["Lamb", "Lars"])
def test_compiled_step_buckets_outside_the_trace(opt_name, monkeypatch):
    """A compiled function that calls ``opt.step()`` (its graph could also compute the grads
    or read the params, so the op calls are traced with their tensors) takes its buckets from
    ``_init_group`` (of its ``OpView``: the groups as the ops take them), which dynamo runs eagerly
    (``make_buckets``, which it calls, is never traced),
    and the guards dynamo installs for it recompile when the layout changes (a param losing
    its grad). Results match the eager step throughout."""
    cls, kw = STEP_OPTIMIZERS[opt_name]
    model_e = make_step_model()
    model_c = copy.deepcopy(model_e)
    opts = [cls(m.parameters(), **kw) for m in (model_e, model_c)]
    calls = {"traced": 0, "in_init_group": False}
    from inductor_lamb.optim import _buckets

    real_buckets, real_init_group = _buckets.make_buckets, opts[1]._op_view._init_group

    def counted(opt, *args, **kwargs):
        if opt is opts[1] and not calls["in_init_group"]:  # (what _init_group calls runs eagerly)
            calls["traced"] += 1
        return real_buckets(opt, *args, **kwargs)

    def init_group(*args):
        calls["in_init_group"] = True
        try:
            return real_init_group(*args)
        finally:
            calls["in_init_group"] = False

    monkeypatch.setattr(_buckets, "make_buckets", counted)
    monkeypatch.setattr(opts[1]._op_view, "_init_group", init_group)
    backend = CountingBackend()
    cstep = torch.compile(lambda: opts[1].step(), fullgraph=True, backend=backend)
    for k, (x, y) in enumerate(step_batches(4)):
        for m, o, st in ((model_e, opts[0], opts[0].step), (model_c, opts[1], cstep)):
            o.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            if k >= 2:  # the last layer's bias stops getting grads: a new layout
                list(m.parameters())[-1].grad = None
            st()
        for p, q in zip(model_c.parameters(), model_e.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert calls["traced"] == 0
    assert backend.graphs == 2


# ---- install guard and cache key -----------------------------------------------------------


def test_fallbacks_when_installing_fails(monkeypatch):
    def broken(name):
        raise AttributeError("lowerings moved")

    monkeypatch.setitem(paths_mod._INSTALLERS, "lowering", broken)
    with pytest.warns(RuntimeWarning, match="'decomposition' path.*lowerings moved"):
        assert inductor_lamb.set_compile_path("lowering") == "decomposition"
    monkeypatch.setitem(paths_mod._INSTALLERS, "decomposition", broken)
    with pytest.warns(RuntimeWarning, match="'external' path"):
        assert inductor_lamb.set_compile_path("lowering") == "external"
    torch._dynamo.reset()
    name, args, kwargs = op_args("lamb")
    _, ref_args, _ = op_args("lamb")
    _, codes = run_and_get_code(torch.compile(eager_call, fullgraph=True), name, args, torch.tensor(0.1), kwargs)
    assert "torch.ops.lamb.lamb_step_" in "\n".join(codes)
    eager_call(name, ref_args, torch.tensor(0.1), kwargs)
    assert all(torch.equal(x, y) for x, y in zip(args[0], ref_args[0]))


def test_set_compile_path_validates():
    with pytest.raises(ValueError, match="unknown compile path"):
        inductor_lamb.set_compile_path("triton")
    with pytest.raises(ValueError, match="unknown op 'lamb16'"):
        inductor_lamb.set_compile_path("external", ops="lamb16")
    with pytest.raises(ValueError, match="ops is empty"):
        inductor_lamb.set_compile_path("external", ops=[])
    assert inductor_lamb.compile_path() == "lowering"


def test_per_op_paths():
    """One op on the external call, the others lowered: each compiles its own way,
    and the cache key follows."""
    key = lowering_mod.CacheKeyPass().uuid()
    assert inductor_lamb.set_compile_path("external", ops=["lamb16_step_"]) == "external"
    assert inductor_lamb.compile_path("lamb16_step_") == "external"
    assert inductor_lamb.compile_path("lamb_step_") == "lowering"
    assert inductor_lamb.compile_path() == "mixed"
    assert lowering_mod.CacheKeyPass().uuid() != key
    assert code_summary("lamb16_step_", 4) == "0 kernel(s), 1 external lamb call(s), 0 temporary buffer(s)"
    assert code_summary("lamb_step_", 4) == "1 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)"
    assert inductor_lamb.set_compile_path("lowering", ops="lamb16_step_") == "lowering"
    assert inductor_lamb.compile_path() == "lowering" and lowering_mod.CacheKeyPass().uuid() == key


def test_compile_path_environment_variable():
    script = "import inductor_lamb as il; print(il.compile_path(), il.compile_path('lamb16_step_'), il.compile_path('lars_step_'))"

    def run(value):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             env={**os.environ, "INDUCTOR_LAMB_COMPILE_PATH": value})
        return out.stdout.split(), out.stderr

    assert run("lamb16_step_=external")[0] == ["mixed", "external", "auto"]
    assert run("decomposition, lamb16_step_=external")[0] == ["mixed", "external", "decomposition"]
    assert run("lowering")[0] == ["lowering", "lowering", "lowering"]
    paths, err = run("triton,lamb16_step_=external")
    assert paths == ["mixed", "external", "auto"] and "ignoring 'triton'" in err


def test_import_never_fails_and_touches_one_config_entry():
    """A subprocess imports the package, then compiles: importing changes no Inductor
    config, installing the paths (at the first query or trace) one entry; an environment
    that breaks the lowering path falls back with no error."""
    script = """
import warnings, torch, torch._inductor.config as c
before = {k: repr(v) for k, v in c.get_config_copy().items()}
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    import inductor_lamb
imported = sorted(k for k in before if before[k] != repr(c.get_config_copy()[k]))
path = inductor_lamb.compile_path()
installed = sorted(k for k in before if before[k] != repr(c.get_config_copy()[k]))
print(path, imported, installed, len(w))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["auto", "[]", "['post_grad_custom_post_pass']", "0"]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "INDUCTOR_LAMB_COMPILE_PATH": "external"})
    assert out.stdout.split()[0] == "external"


def test_import_loads_no_compiler_and_the_first_trace_installs_the_lowering():
    """``import inductor_lamb`` imports neither Inductor, Dynamo nor DTensor; the first
    torch.compile of a training step then installs the paths (its ``"lowering"`` lowers the step:
    no external lamb call in the generated code), in a fresh process."""
    script = """
import sys, torch
import inductor_lamb
from torch import nn
heavy = [m for m in ("torch._inductor", "torch._dynamo", "torch.distributed.tensor") if m in sys.modules]
torch._dynamo.config.trace_autograd_ops = True
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
opt = inductor_lamb.Lamb(net.parameters(), lr=0.01)
def step(x):
    loss = net(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()
from torch._inductor.utils import run_and_get_code
_, codes = run_and_get_code(torch.compile(step, fullgraph=True), torch.randn(4, 8))
calls = sum("torch.ops.lamb." in line and not line.lstrip().startswith("#") for c in codes for line in c.splitlines())
print(heavy, inductor_lamb.compile_path(), calls, "cpp_fused_lamb" in "".join(codes))
"""
    env = {**os.environ, "INDUCTOR_LAMB_COMPILE_PATH": "lowering"}  # (recorded at import, installed by the trace)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["[]", "lowering", "0", "True"], out.stderr


def test_cache_key_pass_chains_user_pass_and_tracks_path():
    from torch._inductor import config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class UserPass(CustomGraphPass):
        def __call__(self, graph):
            return None

        def uuid(self):
            return "user"

    user = UserPass()
    with config.patch(post_grad_custom_post_pass=user):
        inductor_lamb.set_compile_path("lowering")
        passes = config.post_grad_custom_post_pass
        assert passes[0] is user and isinstance(passes[1], lowering_mod.CacheKeyPass)
        uuid_lowering = passes[1].uuid()
        inductor_lamb.set_compile_path("external")
        assert passes[1].uuid() != uuid_lowering
        assert lowering_mod.LOWERING_VERSION in uuid_lowering


def test_warm_fx_graph_cache_never_serves_code_of_another_path():
    from torch._dynamo.utils import counters
    from torch._inductor import config
    from torch._inductor.utils import fresh_cache

    def compiled_code():
        torch._dynamo.reset()
        name, args, kwargs = op_args("lamb")
        _, codes = run_and_get_code(torch.compile(eager_call, fullgraph=True), name, args, torch.tensor(0.1), kwargs)
        return "\n".join(codes)

    with fresh_cache(), config.patch(fx_graph_cache=True):
        use_path("external")
        assert "torch.ops.lamb.lamb_step_" in compiled_code()
        use_path("lowering")
        counters.clear()
        assert "torch.ops.lamb.lamb_step_" not in compiled_code()
        assert counters["inductor"]["fxgraph_cache_hit"] == 0
        # Control: without the key pass the warm cache serves the stale external call.
        with config.patch(post_grad_custom_post_pass=None):
            for op in lowering_mod.OPS:  # the external path, without re-adding the key pass
                paths_mod._uninstall(op)
                paths_mod._state["paths"][op] = "external"
            compiled_code()
            for op in lowering_mod.OPS:
                paths_mod._install_lowering(op)
                paths_mod._state["paths"][op] = "lowering"
            counters.clear()
            stale = compiled_code()
            assert counters["inductor"]["fxgraph_cache_hit"] >= 1 and "torch.ops.lamb.lamb_step_" in stale


def test_no_warning_on_default_import_path():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert inductor_lamb.set_compile_path() == "auto"


def test_compiled_training_step_warns_nothing_and_runs_the_step_hooks(monkeypatch):
    """torch.optim wraps ``step`` in a profiler range, which Dynamo drops from a graph with a
    warning ("Profiler record function ... will be ignored"); our step is traced without it,
    and its step hooks still run."""
    import torch._dynamo.variables.ctx_manager as ctx_manager

    warned = []
    monkeypatch.setattr(ctx_manager, "warning_once", lambda log, *args, **kwargs: warned.append(args))
    model, opt, _ = twin_setups("Lamb")[0]
    calls = []
    opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))
    torch._dynamo.reset()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(train_step, fullgraph=True)
        for x, y in step_batches(2):
            compiled(model, opt, x, y)
    assert not warned
    # (hooks are Python: traced into the graph, they run at trace time)
    assert calls[:2] == ["pre", "post"] and len(calls) % 2 == 0


# ---- CUDA-graph readiness, checked on the CPU ------------------------------------------------

class MutatedInputs:
    """Records, for every graph Inductor compiles, the graph inputs it writes that are not
    static addresses: what makes Inductor's CUDA graphs skip a graph ("skipping cudagraphs due
    to mutated inputs"), decided by the same function on any device."""

    def __init__(self, monkeypatch) -> None:
        from torch._inductor import output_code
        from torch._inductor.cudagraph_utils import check_for_mutation_ignore_cuda_graph_managed_tensor

        self.reasons: list[str | None] = []
        real = output_code.CompiledFxGraph.__init__

        def init(graph_self, *args, **kwargs):
            real(graph_self, *args, **kwargs)
            names = list(inspect.signature(real).parameters)[1:]
            bound = dict(zip(names, args), **kwargs)
            with torch._inductor.config.patch({"triton.cudagraph_trees": True}):
                self.reasons.append(check_for_mutation_ignore_cuda_graph_managed_tensor(
                    bound["gm"], graph_self.mutated_inputs, graph_self.mutated_input_idxs,
                    bound["static_input_idxs"]))

        monkeypatch.setattr(output_code.CompiledFxGraph, "__init__", init)


@pytest.mark.parametrize("recipe", ["whole_step", "called_step"])
@pytest.mark.parametrize("opt_name", list(STEP_OPTIMIZERS))
def test_compiled_steps_write_only_static_inputs(opt_name, recipe, monkeypatch):
    """Every tensor a traced step writes (params, moments, step counts, master copies, the step
    flag) is a static address, and so are the scheduled values it reads, also after
    ``load_state_dict`` and with a user's lr tensor: Inductor's CUDA graphs take both recipes
    (the whole training step; a compiled function calling ``opt.step()``, the op calls traced).
    No CPU tensor is written by a graph of CUDA params (the flag lives on the params' device)."""
    use_path("external" if recipe == "called_step" else "auto")
    cls, kw = STEP_OPTIMIZERS[opt_name]
    model = make_step_model()
    opt = cls(model.parameters(), **{**kw, "lr": torch.tensor(kw["lr"])})
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # (new state tensors)
    for state in opt.state.values():
        for t in state.values():
            assert getattr(t, "_dynamo_static_input_type", None) is not None
    for group in opt._sync_views():  # (the groups as the ops take them: their scheduled tensors)
        for key in opt._layout.scheduled:
            for t in group[key] if isinstance(group[key], tuple) else (group[key],):
                assert getattr(t, "_dynamo_static_input_type", None) is not None, key
    assert getattr(opt._stepped_in_graph, "_dynamo_static_input_type", None) is not None
    recorded = MutatedInputs(monkeypatch)
    torch._dynamo.reset()
    x, y = step_batches(1)[0]
    from torch._inductor.utils import fresh_cache

    with fresh_cache():  # (a cached graph is loaded, not compiled)
        if recipe == "whole_step":
            with torch._dynamo.config.patch(trace_autograd_ops=True):
                torch.compile(train_step, fullgraph=True)(model, opt, x, y)
        else:
            nn.functional.cross_entropy(model(x), y).backward()
            torch.compile(lambda: opt.step(), fullgraph=True)()
    assert recorded.reasons and recorded.reasons == [None] * len(recorded.reasons), recorded.reasons


def test_a_second_process_compiles_the_whole_step_from_inductors_caches(tmp_path):
    """A restart: a second process compiling the same whole training step on the same cache
    directory hits Inductor's FX graph cache and AOT autograd's cache (no miss), for every
    optimizer, and steps to the first process's bits."""
    script = """
import json, sys, torch
import inductor_lamb
from torch import nn
from torch._dynamo.utils import counters
torch._dynamo.config.trace_autograd_ops = True
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
opt = getattr(inductor_lamb, sys.argv[1])(net.parameters(), lr=0.01)
@torch.compile(fullgraph=True)
def step(x):
    loss = net(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()
for k in range(3):
    step(torch.randn(4, 8, generator=torch.Generator().manual_seed(k)))
print(json.dumps({"hits": [counters["inductor"]["fxgraph_cache_hit"], counters["aot_autograd"]["autograd_cache_hit"]],
                  "misses": [counters["inductor"]["fxgraph_cache_miss"], counters["aot_autograd"]["autograd_cache_miss"]],
                  "params": [p.detach().double().sum().item() for p in net.parameters()]}))
"""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")}
    for name in ("Lamb", "Lamb16", "Lars", "Adagrad"):
        runs = [json.loads(subprocess.run([sys.executable, "-c", script, name], capture_output=True, text=True,
                                          check=True, env=env).stdout.strip().splitlines()[-1]) for _ in range(2)]
        cold, warm = runs
        assert cold["misses"][0] >= 1, (name, cold)
        assert warm["misses"] == [0, 0] and warm["hits"][0] >= 1 and warm["hits"][1] >= 1, (name, warm)
        assert warm["params"] == cold["params"], name
