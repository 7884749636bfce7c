"""CUDA kernels (skipped without a CUDA device, or when inductor_lamb was built
without CUDA): against the CPU kernel and the float64 reference, layouts, low
precision, many tensors, determinism, launches per step, CUDA graph capture,
and a compiled training step (the lowering emits Triton)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import (
    MIXED_SHAPES,
    OP_CASES,
    CountingBackend,
    assert_params_close,
    assert_tensor_close,
    clone_lists,
    equal,
    lamb_calls,
    make_step_model,
    noncontiguous_like,
    op_args,
    spec_lists,
    step_batches,
    train_step,
)

import inductor_lamb
from inductor_lamb import Lamb, Lamb16, Lars, _private, reference

HAVE_CUDA = torch.cuda.is_available() and torch._C._dispatch_has_kernel_for_dispatch_key("lamb::lamb_step_", "CUDA")
pytestmark = pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA device and inductor_lamb built with CUDA")

LRS = [0.01, 0.02, 0.005]


def to(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, list):
        return [to(x, device) for x in obj]
    if isinstance(obj, dict):
        return {k: to(v, device) for k, v in obj.items()}
    return obj


def run(name, args, kwargs, lrs, device):
    for lr in lrs:
        getattr(torch.ops.lamb, name)(*args, torch.tensor(lr, device=device), **kwargs)


def assert_lists_close(a_lists, b_lists, rtol=1e-5, atol=1e-6, float8_state=False):
    """Lists equal to float32 rounding. With float8 state (LAMB16), a code may round the
    other way after a one-ulp difference upstream (nvcc contracts to FMA), which moves
    its param slightly at the next step: params then get assert_params_close's allowance."""
    for i, (a, b) in enumerate(zip(a_lists, b_lists)):
        if float8_state and i == 0:
            assert_params_close([x.cpu() for x in a], [y.cpu() for y in b], rtol=rtol, atol=atol)
            continue
        for j, (x, y) in enumerate(zip(a, b)):
            assert_tensor_close(x.cpu(), y.cpu(), rtol=rtol, atol=atol, msg=lambda m: f"list {i}[{j}]: {m}")


@pytest.mark.parametrize("case", list(OP_CASES))
def test_matches_cpu_kernel(case):
    name, args, kwargs = op_args(case)
    args[0][1].zero_()  # a zero-norm param (trust ratio 1)
    c_args, c_kwargs = to(clone_lists(args), "cuda"), to(kwargs, "cuda")
    run(name, args, kwargs, LRS, "cpu")
    run(name, c_args, c_kwargs, LRS, "cuda")
    assert_lists_close(c_args, args, float8_state=name == "lamb16_step_")


@pytest.mark.parametrize("case", ["lamb_all_options", "lamb16_all_options"])
def test_matches_float64_reference(case):
    name, args, kwargs = op_args(case)
    ref = [[t.double() if t.dtype == torch.float32 and t.dim() else t.clone() for t in lst] for lst in args]
    ref_step = reference.lamb_step if name == "lamb_step_" else reference.lamb16_step
    c_args, c_kwargs = to(args, "cuda"), to(kwargs, "cuda")
    for lr in LRS:
        run(name, c_args, c_kwargs, [lr], "cuda")
        ref_step(*ref, lr=lr, **kwargs)
    for a, b in zip(c_args, ref):
        for x, y in zip(a, b):
            x = x.cpu()
            assert_tensor_close(x.double() if x.element_size() > 1 else x, y.double() if y.element_size() > 1 else y,
                                rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("layout", ["transposed", "strided"])
@pytest.mark.parametrize("case", ["lamb", "lamb16", "lars", "adagrad", "novograd"])
def test_noncontiguous(case, layout):
    name, args, kwargs = op_args(case)
    c_args, kwargs = to(args, "cuda"), to(kwargs, "cuda")
    nc_args = [[noncontiguous_like(t, layout) for t in lst] for lst in c_args]
    run(name, c_args, kwargs, LRS[:2], "cuda")
    run(name, nc_args, kwargs, LRS[:2], "cuda")
    assert_lists_close(nc_args, c_args)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["lamb", "lamb16", "lars", "adagrad", "novograd"])
def test_low_precision_with_master(case, dtype):
    name, args, kwargs = op_args(case, dtype=dtype)
    c_args, c_kwargs = to(clone_lists(args), "cuda"), to({**kwargs, "master_params": clone_lists([kwargs["master_params"]])[0]}, "cuda")
    run(name, args, kwargs, LRS[:2], "cpu")
    run(name, c_args, c_kwargs, LRS[:2], "cuda")
    assert_lists_close([c_kwargs["master_params"]], [kwargs["master_params"]], float8_state=name == "lamb16_step_")
    for p, m in zip(c_args[0], c_kwargs["master_params"]):
        assert torch.equal(p, m.to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", ["lamb", "lamb16", "lars", "adagrad", "novograd_decoupled"])
def test_stochastic_rounding_matches_cpu_bits(case, dtype):
    """bf16/fp16 params without master copies, rounded stochastically (the default): the
    CPU kernel's bits, since both hash (seed, step, element) the same way. Where the float32
    value before rounding differs by an ulp (LAMB's and LARS's norms are sums in another
    order; nvcc contracts to FMA), a rounding moves only if its random threshold falls
    between the two: on an H100, 1-3 of 40000 elements over three steps, each to the
    neighbouring value. Anything more is a different rounding, not float32 noise."""
    name, args, kwargs = op_args(case, dtype=dtype)
    kwargs = {**{k: v for k, v in kwargs.items() if k != "master_params"}, "seed": 1234}
    c_args, c_kwargs = to(clone_lists(args), "cuda"), to(kwargs, "cuda")
    run(name, args, kwargs, LRS, "cpu")
    run(name, c_args, c_kwargs, LRS, "cuda")
    for j, (p, q) in enumerate(zip(c_args[0], args[0])):
        p = p.cpu()
        differ = p.view(torch.int16) != q.view(torch.int16)
        apart = (p.view(torch.int16).int() - q.view(torch.int16).int()).abs()
        assert (apart[differ] == 1).all() and (p.sign() == q.sign())[differ].all(), \
            f"params[{j}] ({tuple(q.shape)}, {dtype}): elements differ by more than one {dtype} ulp"
        assert differ.sum().item() <= max(1, q.numel() // 4000), \
            f"params[{j}] ({tuple(q.shape)}, {dtype}): {differ.sum().item()} of {q.numel()} elements differ"
    assert_lists_close(c_args[2:], args[2:])


def cuda_launches(fn) -> int:
    """Kernels of ours that fn() launches (a warm-up call first uploads the tensor table)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if "inductor_lamb" in e.name and e.device_type.name == "CUDA")


@pytest.mark.parametrize("case", ["lamb", "lamb_all_options", "lamb16", "lars", "adagrad", "novograd"])
def test_many_tensors_one_call_launches_what_the_module_counts(case):
    """A step launches the same kernels whatever the number of tensors (a layer-wise op: pass 1,
    the per-tensor totals and coefficients, pass 2; LAMB with clipping two more; Adagrad two):
    what torch.ops.lamb._cuda_launches counts without a GPU, and what torch.compile's launch model
    reads. A second param dtype in the same call adds one launch per chunk kernel."""
    name, _, kw = op_args(case)
    clipped = float(kw.get("max_grad_norm", 0.0)) > 0
    counted = torch.ops.lamb._cuda_launches(name, clipped)
    chunk_kernels = 1 if name == "adagrad_step_" else 2 + clipped
    assert counted == (2 if name == "adagrad_step_" else 3) + 2 * clipped

    def launches(n, mixed=False):
        shapes = [(i % 7 + 1, 33) if i % 5 else () for i in range(n)]
        _, args, kwargs = op_args(case, shapes=shapes)
        if mixed:  # every other param (and its grad) in bfloat16
            args[0] = [p.bfloat16() if i % 2 else p for i, p in enumerate(args[0])]
            args[1] = [g.bfloat16() if i % 2 else g for i, g in enumerate(args[1])]
        c_args, c_kwargs = to(clone_lists(args), "cuda"), to(kwargs, "cuda")
        count = cuda_launches(lambda: run(name, c_args, c_kwargs, [0.01], "cuda"))
        run(name, args, kwargs, [0.01, 0.01], "cpu")
        if not mixed:
            assert_lists_close(c_args, args, float8_state=name == "lamb16_step_")
        return count

    assert launches(10) == launches(2500) == counted
    assert launches(10, mixed=True) == counted + chunk_kernels


@pytest.mark.parametrize("case", ["lamb", "lamb_all_options", "lamb16", "lars", "adagrad", "novograd"])
@pytest.mark.parametrize("offsets", [(0, 0, 0), (1, 1, 1), (3, 3, 3), (1, 2, 3), (0, 5, 0)],
                         ids=lambda o: "offsets-" + "-".join(map(str, o)))
def test_views_at_any_offset_and_odd_sizes(case, offsets):
    """Params, grads and state as views `offsets` elements into larger buffers (every other
    tensor one element further): offsets that agree modulo 16 bytes give the vector path after a
    scalar head, others the scalar path; sizes around the packs and the 16384-element chunks.
    The CPU kernel's results in every layout."""
    from inductor_lamb.spec import SPECS, Role

    shapes = [(), (1,), (3,), (4,), (5,), (17,), (33, 17), (16383,), (16384,), (16385,), (40000,)]
    name, args, kwargs = op_args(case, shapes=shapes)
    c_args, c_kwargs = to(clone_lists(args), "cuda"), to(kwargs, "cuda")
    lists = [a for a in SPECS[name].args if a.role in (Role.PARAMS, Role.GRADS, Role.STATE, Role.SCALARS)]
    where = {Role.PARAMS: 0, Role.GRADS: 1, Role.STATE: 2}

    def view(t, k):
        buf = torch.empty(t.numel() + 32, dtype=t.dtype, device=t.device)
        return buf[k:k + t.numel()].view(t.shape).copy_(t)

    for j, a in enumerate(lists):
        if a.role in where:
            c_args[j] = [view(t, offsets[where[a.role]] + (i % 2 if offsets[where[a.role]] else 0))
                         for i, t in enumerate(c_args[j])]
    run(name, args, kwargs, LRS, "cpu")
    run(name, c_args, c_kwargs, LRS, "cuda")
    assert_lists_close(c_args, args, float8_state=name == "lamb16_step_")


def test_deterministic_bits():
    outs = []
    for _ in range(2):
        name, args, kwargs = op_args("lamb16", shapes=MIXED_SHAPES + [(3_000_001,)])
        c_args = to(args, "cuda")
        run(name, c_args, to(kwargs, "cuda"), LRS, "cuda")
        outs.append(c_args)
    for a, b in zip(*outs):
        assert all(equal(x.cpu(), y.cpu()) for x, y in zip(a, b))


@pytest.mark.parametrize("case", ["lamb", "lamb16", "lars", "adagrad", "novograd"])
def test_cuda_graph_capture_and_replay(case):
    name, args, kwargs = op_args(case)
    eager_args, kwargs = to(clone_lists(args), "cuda"), to(kwargs, "cuda")
    g_args = to(clone_lists(args), "cuda")
    lr = torch.tensor(0.01, device="cuda")
    op = getattr(torch.ops.lamb, name)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        op(*g_args, lr, **kwargs)  # warm-up: uploads the tensor table
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(*g_args, lr, **kwargs)
    op(*eager_args, torch.tensor(0.01, device="cuda"), **kwargs)
    for new_lr in (0.01, 0.02, 0.005):  # the captured step reads lr on the device
        lr.fill_(new_lr)
        graph.replay()
        op(*eager_args, torch.tensor(new_lr, device="cuda"), **kwargs)
    torch.cuda.synchronize()
    assert_lists_close(g_args, eager_args, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["lamb", "lamb16", "lars"])
def test_cuda_graph_capture_of_the_typed_wrappers(kind):
    """``inductor_lamb.ops`` turns float hyper-parameters into device tensors: under capture with
    fill kernels (a copy from pageable host memory cannot be captured), replayed with the values
    of the eager call."""
    name = f"{kind}_step_"
    op = getattr(inductor_lamb.ops, name)
    shapes = [(33, 17), (7,), (), (40000,)]
    eager, captured = to(spec_lists(name, shapes), "cuda"), to(spec_lists(name, shapes), "cuda")
    lr = torch.tensor(0.01, device="cuda")
    kw = {"momentum": 0.8, "weight_decay": 5e-4} if kind == "lars" else {"beta1": 0.8, "beta2": 0.99, "weight_decay": 0.01}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        op(*captured, lr=lr, **kw)  # warm-up
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(*captured, lr=lr, **kw)
    op(*eager, lr=lr, **kw)
    for _ in range(2):
        graph.replay()
        op(*eager, lr=lr, **kw)
    torch.cuda.synchronize()
    assert_lists_close(list(captured), list(eager), rtol=0, atol=0)


def test_opcheck_cuda():
    for case in ("lamb_all_options", "lamb16", "lars", "adagrad"):
        # nine params: the lars case gives one weight decay per param of MIXED_SHAPES
        name, args, kwargs = op_args(case, shapes=[(8, 5), (), (0,), (33,), (2, 3), (1,), (4, 0, 2), (7,), (3, 3)])
        utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
        if name != "lamb16_step_":
            utils = ("test_schema", *utils)
        with torch.no_grad():
            torch.library.opcheck(getattr(torch.ops.lamb, name).default,
                                  (*to(args, "cuda"), torch.tensor(0.01, device="cuda")), to(kwargs, "cuda"),
                                  test_utils=utils)


def _assert_the_lowering_is_refused(compile_and_run) -> None:
    """On a torch whose Inductor cannot take the lowering on CUDA (``_private.LIMITS``), forcing
    it raises our error, naming the release (``auto`` takes the CUDA kernel there)."""
    with pytest.raises(Exception) as raised:
        compile_and_run()
    assert f"torch {torch.__version__} cannot" in str(raised.value), str(raised.value)


@pytest.mark.parametrize("path", ["auto", "lowering"])
@pytest.mark.parametrize("cls,kw", [(Lamb, dict(lr=0.02, weight_decay=0.01)), (Lamb16, dict(lr=0.02, weight_decay=0.01)),
                                    (Lars, dict(lr=0.3, weight_decay=1e-3))])
def test_compiled_training_step_on_cuda(cls, kw, path):
    """The whole step compiled for CUDA matches eager: by default ("auto") the graph calls
    the CUDA kernel (fewer launches than the lowering, _inductor/cost.py); the lowering
    emits Triton for the step."""
    inductor_lamb.set_compile_path(path)
    torch._dynamo.reset()
    try:
        if path == "lowering" and _private.lacks("lowering_cuda"):
            _assert_the_lowering_is_refused(lambda: _compiled_training_step_on_cuda(cls, kw, path))
            return
        _compiled_training_step_on_cuda(cls, kw, path)
    finally:
        inductor_lamb.set_compile_path()
        torch._dynamo.reset()


def _compiled_training_step_on_cuda(cls, kw, path):
    model = make_step_model().cuda()
    twins = []
    for m in (model, copy.deepcopy(model)):
        opt = cls(m.parameters(), **kw)
        assert opt.param_groups[0]["lr"].device.type == "cuda"
        twins.append((m, opt))
    (model_e, opt_e), (model_c, opt_c) = twins
    backend = CountingBackend()
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(train_step, backend=backend, fullgraph=True)
        for x, y in step_batches(5):
            x, y = x.cuda(), y.cuda()
            torch.testing.assert_close(compiled(model_c, opt_c, x, y), train_step(model_e, opt_e, x, y),
                                       rtol=1e-5, atol=1e-5)
    assert backend.graphs == 1
    for p, q in zip(model_c.parameters(), model_e.parameters()):
        assert ((p - q).norm() / q.norm()).item() <= 1e-5
    from torch._inductor.utils import run_and_get_code

    x, y = (t.cuda() for t in step_batches(1, seed=7)[0])
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        _, codes = run_and_get_code(torch.compile(train_step, fullgraph=True), model_c, opt_c, x, y)
    code = "\n".join(codes)
    assert "triton" in code
    calls = lamb_calls(code)
    assert (len(calls) == 1) if path == "auto" else not calls, calls


@pytest.mark.parametrize("path", ["auto", "lowering"])
@pytest.mark.parametrize("case", ["lamb", "lamb16", "lars", "adagrad"])
def test_compiled_op_on_graph_inputs(case, path):
    """``torch.compile`` of an op call on graph inputs, as ``torch.compile(opt.step)``
    makes it: the default "auto" path calls the CUDA kernel (the eager bits), the
    lowering emits Triton (float32 rounding of the eager result)."""
    from torch._inductor.utils import run_and_get_code

    assert inductor_lamb.set_compile_path(path) == path
    torch._dynamo.reset()
    try:
        name, args, kwargs = op_args(case)
        c_args, c_kwargs = to(clone_lists(args), "cuda"), to(kwargs, "cuda")
        e_args = to(clone_lists(args), "cuda")

        def call(args, lr):
            getattr(torch.ops.lamb, name)(*args, lr, **c_kwargs)

        lr = torch.tensor(0.01, device="cuda")
        if path == "lowering" and _private.lacks("lowering_cuda"):
            _assert_the_lowering_is_refused(lambda: torch.compile(call, fullgraph=True)(c_args, lr))
            return
        _, codes = run_and_get_code(torch.compile(call, fullgraph=True), c_args, lr)
        call(e_args, lr)
        code = "\n".join(codes)
        if path == "auto":
            assert all(equal(x, y) for a, b in zip(c_args, e_args) for x, y in zip(a, b))
            calls = lamb_calls(code)
            assert len(calls) == 1 and f"torch.ops.lamb.{name}.default(" in calls[0], calls
        else:
            assert_lists_close(c_args, e_args, float8_state=name == "lamb16_step_")
            assert not lamb_calls(code) and "triton" in code, lamb_calls(code)
    finally:
        inductor_lamb.set_compile_path()
        torch._dynamo.reset()


def test_errors_name_argument_and_index():
    name, args, kwargs = op_args("lamb")
    c_args, c_kwargs = to(args, "cuda"), to(kwargs, "cuda")
    c_args[1][2] = c_args[1][2].cpu()
    with pytest.raises(RuntimeError, match=r"grads\[2\] is on cpu"):
        run(name, c_args, c_kwargs, [0.01], "cuda")
    with pytest.raises(RuntimeError, match=r"lr is on cpu"):
        inductor_lamb.ops.lamb_step_(*to(args, "cuda"), lr=torch.tensor(0.01))


@pytest.mark.parametrize("case", ["lamb", "lamb_all_options", "lamb16", "lars"])
def test_cuda_two_phase_is_one_call_and_matches_cpu(case):
    """CUDA: the one-call op is reduce then apply bit for bit (same launches), the
    reductions agree with the CPU kernel's, and apply takes reductions from elsewhere."""
    from inductor_lamb.spec import SPECS

    name, args, kwargs = op_args(case)
    spec = SPECS[name]
    one, one_kw = to(clone_lists(args), "cuda"), to(dict(kwargs), "cuda")
    two, two_kw = to(clone_lists(args), "cuda"), to(dict(kwargs), "cuda")
    cpu_args, cpu_kw = clone_lists(args), dict(kwargs)
    for lr in LRS:
        run(name, one, one_kw, [lr], "cuda")
        lr_d = torch.tensor(lr, device="cuda")
        red = getattr(torch.ops.lamb, spec.reduce_op)(*two, lr_d, **two_kw)
        cpu_red = getattr(torch.ops.lamb, spec.reduce_op)(*cpu_args, torch.tensor(lr), **cpu_kw)
        assert red.device.type == "cuda" and red.shape == cpu_red.shape
        torch.testing.assert_close(red.cpu(), cpu_red, rtol=1e-4, atol=1e-6)
        getattr(torch.ops.lamb, spec.apply_op)(*two, red, lr_d, **two_kw)
        getattr(torch.ops.lamb, spec.apply_op)(*cpu_args, cpu_red, torch.tensor(lr), **cpu_kw)
    for a, b in zip(one, two):
        for x, y in zip(a, b):
            assert equal(x.cpu(), y.cpu())
    assert_lists_close(two, cpu_args, float8_state=name == "lamb16_step_")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("cls", [Lamb, Lamb16, Lars, inductor_lamb.Adagrad], ids=lambda c: c.__name__)
def test_float64_optimizers_match_cpu(cls, compiled):
    """float64 params step through the float64 reference math on CUDA as on CPU."""
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    shapes = [(33, 17), (), (7,), (0,)]
    start = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    grads = [[torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes] for _ in range(3)]
    runs = []
    for device in ("cpu", "cuda"):
        params = [torch.nn.Parameter(t.clone().to(device)) for t in start]  # (t.to("cpu") is t itself)
        opt = cls(params, lr=0.01)
        step = torch.compile(opt.step) if compiled and device == "cuda" else opt.step
        for gs in grads:
            for p, g in zip(params, gs):
                p.grad = g.to(device)
            step()
        runs.append(params)
    tol = dict(rtol=1e-6, atol=1e-8) if cls is Lamb16 else dict(rtol=1e-12, atol=1e-14)
    for p, q in zip(*runs):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **tol)


# ---- no host sync, CUDA graphs of the optimizers ---------------------------------------------

CUDA_OPTIMIZERS = {
    "Lamb": lambda ps: Lamb(ps, lr=0.02, weight_decay=0.01, max_grad_norm=1.0),  # (the clip factor too)
    "Lamb16": lambda ps: Lamb16(ps, lr=0.02, weight_decay=0.01),
    "Lars": lambda ps: Lars(ps, lr=0.3, weight_decay=1e-3),
    "Adagrad": lambda ps: inductor_lamb.Adagrad(ps, lr=0.05, weight_decay=1e-4),
}


def _cuda_params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).cuda()) for s in [(33, 17), (), (7,), (40000,), (64, 48)]]


def _twins(name):
    a = _cuda_params()
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    return (a, CUDA_OPTIMIZERS[name](a)), (b, CUDA_OPTIMIZERS[name](b))


def _assert_same_run(run_a, run_b):
    (pa, oa), (pb, ob) = run_a, run_b
    for p, q in zip(pa, pb):
        assert equal(p.detach(), q.detach())
        for key, value in oa.state[p].items():
            assert equal(ob.state[q][key], value), key


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", list(CUDA_OPTIMIZERS))
def test_steps_never_sync_the_host(name, compiled):
    """``torch.cuda.set_sync_debug_mode("error")`` around steps whose grads move between steps
    (new tensors, the old ones kept alive, so every step's tensor table is new): no ``.item()``,
    no blocking copy (tables go up asynchronously from pinned memory). Eager and
    ``torch.compile(opt.step)`` (compiled once before the checked steps) give the same bits."""
    run_e, run_c = _twins(name)
    torch._dynamo.reset()
    steps = {id(run_e): run_e[1].step, id(run_c): torch.compile(run_c[1].step) if compiled else run_c[1].step}
    gen = torch.Generator().manual_seed(1)
    kept = []
    for k in range(4):
        grads = [torch.randn(p.shape, generator=gen).cuda() for p in run_e[0]]
        for run in (run_e, run_c):
            for p, g in zip(run[0], grads):
                p.grad = g.clone()
                kept.append(p.grad)
            if k == 0:
                steps[id(run)]()  # (the compiled step compiles here)
                continue
            torch.cuda.set_sync_debug_mode("error")
            try:
                steps[id(run)]()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    _assert_same_run(run_c, run_e)


@pytest.mark.parametrize("name", list(CUDA_OPTIMIZERS))
def test_manual_cuda_graph_capture_of_opt_step(name):
    """``opt.step()`` captured with ``torch.cuda.graph`` after a warm-up step on a side stream (the
    recipe of torch's CUDA graph docs), grads at static addresses, the lr changed in place by a
    scheduler between replays: every replay gives the eager step's bits."""
    run_e, run_g = _twins(name)
    sched_e, sched_g = (torch.optim.lr_scheduler.ExponentialLR(r[1], gamma=0.7) for r in (run_e, run_g))
    gen = torch.Generator().manual_seed(1)
    static_grads = [torch.zeros_like(p) for p in run_g[0]]
    for p, g in zip(run_g[0], static_grads):
        p.grad = g

    def grads():
        gs = [torch.randn(p.shape, generator=gen).cuda() for p in run_e[0]]
        for p, g, s in zip(run_e[0], gs, static_grads):
            p.grad = g
            s.copy_(g)

    grads()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_g[1].step()  # warm-up
    torch.cuda.current_stream().wait_stream(stream)
    run_e[1].step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_g[1].step()
    for _ in range(4):
        sched_e.step()
        sched_g.step()
        grads()
        graph.replay()
        run_e[1].step()
    torch.cuda.synchronize()
    _assert_same_run(run_g, run_e)


def _replays_a_cuda_graph(fn) -> bool:
    """Whether one call of ``fn`` launches a CUDA graph (the profiler's cudaGraphLaunch)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    return any("cudaGraphLaunch" in e.name for e in prof.events())


@pytest.mark.parametrize("recipe", ["whole_step", "compiled_opt_step"])
@pytest.mark.parametrize("name", ["Lamb", "Lamb16", "Lars", "Adagrad"])
def test_reduce_overhead_builds_cuda_graphs(name, recipe):
    """``mode="reduce-overhead"`` builds and replays CUDA graphs (``cudagraph_or_error``: a skip
    fails; ``slow_path_cudagraph_asserts``: Inductor checks that no memory its graph pool owns is
    used wrongly) for the whole training step and for ``torch.compile(opt.step)`` beside a
    compiled model, while a scheduler changes lr every step; the result follows the eager run."""
    from conftest import STEP_OPTIMIZERS

    cls, kw = STEP_OPTIMIZERS[name]
    model_e = make_step_model().cuda()
    model_c = copy.deepcopy(model_e)
    opt_e, opt_c = cls(model_e.parameters(), **kw), cls(model_c.parameters(), **kw)
    scheds = [torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.8) for o in (opt_e, opt_c)]
    torch._dynamo.reset()
    with torch._inductor.config.patch({"triton.cudagraph_or_error": True, "triton.slow_path_cudagraph_asserts": True}), \
            torch._dynamo.config.patch(trace_autograd_ops=recipe == "whole_step"):
        if recipe == "whole_step":
            compiled = torch.compile(train_step, mode="reduce-overhead", fullgraph=True)
            step_c = lambda x, y: compiled(model_c, opt_c, x, y)  # noqa: E731
        else:
            cmodel = torch.compile(model_c)
            cstep = torch.compile(opt_c.step, mode="reduce-overhead", fullgraph=True)

            def step_c(x, y):
                torch.nn.functional.cross_entropy(cmodel(x), y).backward()
                cstep()
                opt_c.zero_grad(set_to_none=True)
        batches = [(x.cuda(), y.cuda()) for x, y in step_batches(6)]
        for k, (x, y) in enumerate(batches):
            train_step(model_e, opt_e, x, y)
            if k == len(batches) - 1:
                assert _replays_a_cuda_graph(lambda: step_c(x, y))
            else:
                step_c(x, y)
            for s in scheds:
                s.step()
    for p, q in zip(model_c.parameters(), model_e.parameters()):
        assert ((p - q).norm() / q.norm()).item() <= (1e-4 if cls is Lamb16 else 1e-5)


# ---- the tensor tables of captured steps (csrc/common/graph_tables.h) -------------------------


def _capture_step(opt, stream=None):
    """``opt.step()`` captured into a new CUDA graph (after a warm-up step on a side stream)."""
    stream = stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        opt.step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    return graph


def _static_grads(params):
    out = [torch.zeros_like(p) for p in params]
    for p, g in zip(params, out):
        p.grad = g
    return out


@pytest.mark.parametrize("name", list(CUDA_OPTIMIZERS))
def test_two_captures_replayed_in_reverse_order(name):
    """Two graphs capture the same optimizer's step (two lists of grads, so two tables); replayed
    B then A, then A then B, each replay gives the eager step's bits: each graph wrote its own
    table."""
    run_e, run_g = _twins(name)
    grads_a, grads_b = _static_grads(run_g[0]), None
    gen = torch.Generator().manual_seed(3)
    for g in grads_a:
        g.copy_(torch.randn(g.shape, generator=gen).cuda())
    graph_a = _capture_step(run_g[1])
    grads_b = _static_grads(run_g[0])
    for g in grads_b:
        g.copy_(torch.randn(g.shape, generator=gen).cuda())
    graph_b = _capture_step(run_g[1])
    # the eager twin took the same four steps (two warm-ups, two captures run nothing)
    for grads in (grads_a, grads_b):
        for p, g in zip(run_e[0], grads):
            p.grad = g.clone()
        run_e[1].step()
    for order in ((graph_b, grads_b, graph_a, grads_a), (graph_a, grads_a, graph_b, grads_b)):
        for graph, grads in (order[:2], order[2:]):
            graph.replay()
            for p, g in zip(run_e[0], grads):
                p.grad = g.clone()
            run_e[1].step()
    torch.cuda.synchronize()
    _assert_same_run(run_g, run_e)


def test_captures_after_many_eager_steps_with_new_grads():
    """300 eager steps whose grads are new tensors every step (300 tables made and dropped), then
    a capture: the replay gives the eager bits, and the eager steps left no graph table."""
    run_e, run_g = _twins("Lamb")
    gen = torch.Generator().manual_seed(4)
    before = torch.ops.lamb._graph_table_counts()
    for _ in range(300):
        grads = [torch.randn(p.shape, generator=gen).cuda() for p in run_e[0]]
        for run in (run_e, run_g):
            for p, g in zip(run[0], grads):
                p.grad = g.clone()
            run[1].step()
    assert torch.ops.lamb._graph_table_counts() == before
    static = _static_grads(run_g[0])
    grads = [torch.randn(p.shape, generator=gen).cuda() for p in run_e[0]]
    for s, g in zip(static, grads):
        s.copy_(g)
    for p, g in zip(run_e[0], grads):
        p.grad = g.clone()
    graph = _capture_step(run_g[1])  # (its warm-up is a step: the eager twin takes two)
    run_e[1].step()
    graph.replay()
    run_e[1].step()
    torch.cuda.synchronize()
    _assert_same_run(run_g, run_e)


def _wait_for_released_tables(held: int = 0, timeout: float = 10.0) -> None:
    """CUDA returns a destroyed graph's tables from a thread of its own, at a time of its own: wait
    until no more than ``held`` are held."""
    import time

    end = time.monotonic() + timeout
    while torch.ops.lamb._graph_table_counts()[0] > held:
        assert time.monotonic() < end, torch.ops.lamb._graph_table_counts()
        time.sleep(0.01)


def test_a_hundred_captures_keep_memory_flat():
    """A graph captured 100 times over, each replacing the last (as Inductor's trees re-record):
    the graph tables and the device memory stay flat."""
    params = _cuda_params()
    opt = CUDA_OPTIMIZERS["Lamb"](params)
    _static_grads(params)
    held = torch.ops.lamb._graph_table_counts()[0]
    graph = _capture_step(opt)
    del graph
    torch.cuda.synchronize()
    counts, memory = None, None
    for k in range(100):
        _wait_for_released_tables(held)
        graph = _capture_step(opt)
        graph.replay()
        graph.reset()
        del graph
        torch.cuda.synchronize()
        if k == 10:
            counts, memory = torch.ops.lamb._graph_table_counts(), torch.cuda.memory_allocated()
    held, spare, allocated, nbytes = torch.ops.lamb._graph_table_counts()
    assert allocated <= counts[2] + 1 and nbytes <= counts[3] + 4096, (counts, (held, spare, allocated, nbytes))
    assert torch.cuda.memory_allocated() <= memory


def test_a_failed_capture_then_eager_steps_and_a_new_capture():
    """A capture that fails (an illegal sync inside it) discards its graph and what it held; eager
    steps and a new capture then give the eager bits."""
    run_e, run_g = _twins("Lars")
    static = _static_grads(run_g[0])
    gen = torch.Generator().manual_seed(5)
    stream = torch.cuda.Stream()
    with pytest.raises(RuntimeError):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            run_g[1].step()
            torch.cuda.synchronize()  # (not allowed while capturing)
    torch.cuda.synchronize()
    # the failed capture may have run nothing or everything: restart both from the same state
    run_g[1].load_state_dict(run_e[1].state_dict())
    for p, q in zip(run_g[0], run_e[0]):
        with torch.no_grad():
            p.copy_(q)
    for _ in range(2):
        grads = [torch.randn(p.shape, generator=gen).cuda() for p in run_e[0]]
        for s, p, g in zip(static, run_e[0], grads):
            s.copy_(g)
            p.grad = g.clone()
        run_g[1].step()
        run_e[1].step()
    graph = _capture_step(run_g[1])
    run_e[1].step()
    graph.replay()
    run_e[1].step()
    torch.cuda.synchronize()
    _assert_same_run(run_g, run_e)


def test_concurrent_steps_on_two_threads_and_streams():
    """Two optimizers stepped at once from two threads, each on its own stream, 50 steps with new
    grads each: each gives the bits of its eager twin stepped alone."""
    import threading

    runs = [_twins("Lamb16") for _ in range(2)]
    grads = [[[torch.randn(p.shape).cuda() for p in run[0][0]] for _ in range(50)] for run in runs]
    torch.cuda.synchronize()
    errors = []

    def work(k):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                params, opt = runs[k][1]
                for gs in grads[k]:
                    for p, g in zip(params, gs):
                        p.grad = g
                    opt.step()
            stream.synchronize()
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k, run in enumerate(runs):
        params, opt = run[0]
        for gs in grads[k]:
            for p, g in zip(params, gs):
                p.grad = g
            opt.step()
        torch.cuda.synchronize()
        _assert_same_run(run[1], run[0])


@pytest.mark.parametrize("case", ["lamb", "lamb16", "lars", "adagrad", "novograd"])
def test_pinned_table_uploads_under_stress(case):
    """200 calls, each on another subset of 27 tensors (a table of its own, copied up from pinned
    memory), on one of three streams ordered by stream waits alone, with no host sync between
    calls and all of them queued behind a quarter second of GPU sleep: the bits of the same calls
    each followed by a synchronize (every copy done before the next table is made). A pinned
    buffer reused before its copy ran would hand a call another's table."""
    gen = torch.Generator().manual_seed(7)
    shapes = [MIXED_SHAPES[i % len(MIXED_SHAPES)] for i in range(27)]
    name, args, kwargs = op_args(case, shapes=shapes)
    per_param = {k for k, v in kwargs.items() if isinstance(v, list)}
    calls = []
    for _ in range(200):
        k = int(torch.randint(1, len(shapes) + 1, (1,), generator=gen))
        calls.append((torch.randperm(len(shapes), generator=gen)[:k].tolist(),
                      int(torch.randint(0, 3, (1,), generator=gen)), 0.01 * (1 + float(torch.rand(1, generator=gen)))))
    lrs = [torch.tensor(lr, device="cuda") for _, _, lr in calls]  # (made before: no copies between calls)
    kw = to(kwargs, "cuda")
    op = getattr(torch.ops.lamb, name)

    def call(lists, idx, lr):
        sub = [[lst[i] for i in idx] if isinstance(lst, list) else lst for lst in lists]
        op(*sub, lr, **{k: [v[i] for i in idx] if k in per_param else v for k, v in kw.items()})

    stressed, synced = to(clone_lists(args), "cuda"), to(clone_lists(args), "cuda")
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in range(3)]
    last = torch.cuda.current_stream()
    torch.cuda._sleep(500_000_000)  # (about 0.25 s: every upload below queues behind it, none done yet)
    for (idx, s, _), lr in zip(calls, lrs):
        streams[s].wait_stream(last)
        with torch.cuda.stream(streams[s]):
            call(stressed, idx, lr)
        last = streams[s]
    torch.cuda.current_stream().wait_stream(last)
    for (idx, _, _), lr in zip(calls, lrs):
        call(synced, idx, lr)
        torch.cuda.synchronize()
    torch.cuda.synchronize()
    for i, (a, b) in enumerate(zip(stressed, synced)):
        for j, (x, y) in enumerate(zip(a, b)):
            assert equal(x, y), f"list {i}[{j}] differs"


def test_load_state_dict_then_a_new_capture():
    """``load_state_dict`` replaces the state tensors, so a graph captured before writes into the
    old ones; capturing again (what docs/compile.md asks after a load) follows the loaded state."""
    run_e, run_g = _twins("Lamb")
    static = _static_grads(run_g[0])
    gen = torch.Generator().manual_seed(6)

    def grads():
        gs = [torch.randn(p.shape, generator=gen).cuda() for p in run_e[0]]
        for s, p, g in zip(static, run_e[0], gs):
            s.copy_(g)
            p.grad = g.clone()

    grads()
    graph = _capture_step(run_g[1])
    run_e[1].step()
    graph.replay()
    run_e[1].step()
    saved = copy.deepcopy(run_e[1].state_dict())
    run_g[1].load_state_dict(saved)
    graph = _capture_step(run_g[1])
    run_e[1].step()
    for _ in range(3):
        grads()
        graph.replay()
        run_e[1].step()
    torch.cuda.synchronize()
    _assert_same_run(run_g, run_e)


@pytest.mark.parametrize("name,dtype", [("Lamb", torch.float32), ("Lamb16", torch.bfloat16), ("Lars", torch.float32),
                                        ("Adagrad", torch.float32), ("NovoGrad", torch.float32)])
def test_step_in_backward_on_cuda(name, dtype):
    """step_in_backward on CUDA params (the backward's hooks run on autograd's device thread, the
    steps on its stream): the ordinary CUDA step's bits over steps with a changing lr, no grad
    left; a training step's peak memory (torch.cuda.max_memory_allocated, over what was allocated
    before) lower by most of the grads, which the ordinary step holds all at once."""
    width, layers = 1024, 6

    def make():
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers)))
        return model.to("cuda", dtype)

    a, b = make(), make()
    oa = getattr(inductor_lamb, name)(a.parameters(), lr=LRS[0])
    ob = getattr(inductor_lamb, name)(b.parameters(), lr=LRS[0])
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(16, width, generator=gen).to("cuda", dtype) for _ in LRS]
    peaks = []
    with inductor_lamb.step_in_backward(ob, bucket_bytes=width * width * dtype.itemsize):  # (a param a batch)
        for model, opt in ((a, oa), (b, ob)):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()  # (the other model's params and state too)
            for x, lr in zip(xs, LRS):
                for g in opt.param_groups:
                    g["lr"] = lr
                model(x).float().square().mean().backward()
                opt.step()
                opt.zero_grad()
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated() - before)
    assert all(p.grad is None for p in b.parameters())
    for i, (p, q) in enumerate(zip(a.parameters(), b.parameters())):
        assert torch.equal(p, q), i
        assert oa.state[p].keys() == ob.state[q].keys()
        for key, v in oa.state[p].items():
            assert equal(v, ob.state[q][key]), (i, key)
    grad_bytes = width * width * dtype.itemsize
    assert peaks[1] <= peaks[0] - (layers - 3) * grad_bytes, (peaks, grad_bytes)
