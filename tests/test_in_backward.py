"""The step inside the backward (inductor_lamb.step_in_backward): the bits of the ordinary step for
every optimizer and configuration, the loop unchanged around it (step, zero_grad, LR schedulers,
state dicts both ways), few op calls, and clear refusals that leave every tensor untouched."""

from __future__ import annotations

import copy
import gc
import pickle

import pytest
import torch
from optim_infos import INFOS

import inductor_lamb
from inductor_lamb.optim._in_backward import StepInBackward
from inductor_lamb.optim._route import Conditions, Route, route


class Net(torch.nn.Module):
    """Mixed shapes: Linear layers, a 0-d scale, an empty param, a non-contiguous (transposed)
    weight, a weight used twice (its hook fires once, with the summed grad) and a frozen one."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)

        def param(*shape: int, scale: float = 0.3) -> torch.nn.Parameter:
            return torch.nn.Parameter((torch.randn(shape, generator=g) * scale).to(dtype))

        self.l1 = torch.nn.Linear(12, 24).to(dtype)
        self.l2 = torch.nn.Linear(24, 24).to(dtype)
        with torch.no_grad():
            for m in (self.l1, self.l2):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.3)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.3)
        self.tied = param(24, 24)  # used twice
        self.wt = torch.nn.Parameter(param(6, 24).detach().t())  # (24, 6), non-contiguous
        self.scale = param(scale=1.0)  # 0-d
        self.empty = param(0)
        self.frozen = torch.nn.Parameter(param(24, 24).detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.l1(x))
        h = torch.tanh(h @ self.tied) @ self.tied
        h = torch.tanh(self.l2(h) @ self.frozen)
        return (h @ self.wt) * self.scale + self.empty.sum()


def loss_of(model: torch.nn.Module, seed: int, dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return model(x).float().square().mean()


def train(model, opt, steps=4, sched=None, seed=0):
    for i in range(steps):
        opt.zero_grad()
        loss_of(model, seed + i, next(model.parameters()).dtype).backward()
        opt.step()
        if sched is not None:
            sched.step()


def _configs():
    for info in INFOS:
        for inp in info.optim_inputs_func():
            yield pytest.param(info.optim_cls, inp.kwargs, id=f"{info.optim_cls.__name__}-{inp.desc}")


def _clips(cls, kwargs) -> bool:
    return float(kwargs.get("max_grad_norm") or 0) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cls,kwargs", list(_configs()))
def test_same_bits_as_the_ordinary_step(cls, kwargs, dtype):
    """Every configuration of every optimizer, on every param dtype (bf16/fp16 with stochastic
    rounding, or master copies), with a scheduler changing the lr: the params, and the whole
    state, bit for bit the ordinary step's."""
    a, b = Net(dtype), Net(dtype)
    kwargs = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    oa, ob = cls(a.parameters(), **kwargs), cls(b.parameters(), **copy.deepcopy(kwargs))
    if _clips(cls, kwargs):
        before = [p.clone() for p in b.parameters()]
        with pytest.raises(ValueError, match=r"max_grad_norm'\] is 0.5: clipping by the norm of several grads"):
            inductor_lamb.step_in_backward(ob)
        assert all(torch.equal(p, q) for p, q in zip(before, b.parameters()))
        return
    handle = inductor_lamb.step_in_backward(ob, bucket_bytes=3000)
    sa, sb = (torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.7) for o in (oa, ob))
    train(a, oa, sched=sa)
    train(b, ob, sched=sb)
    assert all(p.grad is None for p in b.parameters())
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert str(oa.state_dict()) == str(ob.state_dict())
    handle.remove()


@pytest.mark.parametrize("bucket_bytes", [0, 1000, 2**30])
def test_batches_and_op_calls(bucket_bytes):
    """A batch steps once it holds ``bucket_bytes`` of grads (0: each param alone), the rest at the
    end of the backward: the op calls per backward follow, with the same bits."""
    a, b = Net(), Net()
    oa, ob = inductor_lamb.Lamb(a.parameters(), lr=1e-2), inductor_lamb.Lamb(b.parameters(), lr=1e-2)
    handle = inductor_lamb.step_in_backward(ob, bucket_bytes=bucket_bytes)
    batches = []
    step_batch = ob._step_batch
    ob._step_batch = lambda batch: (batches.append(batch), step_batch(batch))
    calls = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        train(b, ob, steps=1)
    calls = [e for e in prof.events() if e.name == "lamb::lamb_step_"]
    train(a, oa, steps=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    hooked = [i for i, p in enumerate(b.parameters()) if p.requires_grad]
    stepped = sorted(k for batch in batches for places in batch.values() for k in places)
    assert stepped == hooked  # every param once (the tied one too), the frozen one never
    expected = len(hooked) if bucket_bytes == 0 else 1 if bucket_bytes == 2**30 else None
    if expected is not None:
        assert len(batches) == expected
    else:
        assert 1 < len(batches) < len(hooked)
    assert len(calls) == len(batches)  # one fused call a batch (one group, one dtype)
    handle.remove()


def test_step_and_zero_grad_keep_their_meaning():
    """opt.step() steps what did not step in the backward (a grad set by hand), zero_grad frees
    nothing twice, remove() returns to ordinary steps, and the handle is a context manager."""
    a, b = Net(), Net()
    oa, ob = inductor_lamb.Lamb16(a.parameters(), lr=1e-2), inductor_lamb.Lamb16(b.parameters(), lr=1e-2)
    with inductor_lamb.step_in_backward(ob) as handle:
        assert isinstance(handle, StepInBackward) and ob._in_backward is handle
        train(a, oa, steps=2)
        train(b, ob, steps=2)
        # a grad made outside a backward steps in opt.step(), as ever
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            m.l1.bias.grad = torch.full_like(m.l1.bias, 0.25)
            o.step()
            o.zero_grad()
    assert ob._in_backward is None and ob._step_supports_amp_scaling is False
    train(a, oa, steps=2, seed=5)
    train(b, ob, steps=2, seed=5)  # ordinary steps again: the grads stay until zero_grad
    assert all(p.grad is not None for p in b.parameters() if p.requires_grad)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("direction", ["in backward, then ordinary", "ordinary, then in backward"])
def test_state_dicts_are_the_ordinary_ones(direction, tmp_path):
    """A checkpoint of a run that stepped in the backward resumes in an ordinary run, and back."""
    ref, first = Net(torch.bfloat16), Net(torch.bfloat16)
    oref = inductor_lamb.Lamb16(ref.parameters(), lr=1e-2, weight_decay=0.1)
    o1 = inductor_lamb.Lamb16(first.parameters(), lr=1e-2, weight_decay=0.1)
    in_first = direction.startswith("in backward")
    handle = inductor_lamb.step_in_backward(o1) if in_first else None
    train(ref, oref, steps=5)
    train(first, o1, steps=3)
    if handle is not None:
        handle.remove()
    torch.save({"model": first.state_dict(), "opt": o1.state_dict()}, tmp_path / "ckpt.pt")
    ckpt = torch.load(tmp_path / "ckpt.pt")
    second = Net(torch.bfloat16)
    second.load_state_dict(ckpt["model"])
    o2 = inductor_lamb.Lamb16(second.parameters(), lr=1e-2, weight_decay=0.1)
    if not in_first:
        handle = inductor_lamb.step_in_backward(o2)
    o2.load_state_dict(ckpt["opt"])  # (with a handle: it stays)
    assert (o2._in_backward is handle) is not in_first
    train(second, o2, steps=2, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(ref.parameters(), second.parameters()))


def test_copies_do_not_carry_the_hooks():
    model = Net()
    opt = inductor_lamb.Lamb(model.parameters())
    inductor_lamb.step_in_backward(opt)
    for clone in (pickle.loads(pickle.dumps(opt)), copy.deepcopy(opt)):
        assert clone._in_backward is None and clone._step_supports_amp_scaling is False


def test_gradient_accumulation_needs_a_boundary():
    """Stepping on every micro-batch is refused at the second backward, before anything steps;
    micro-batches inside no_step() accumulate, and the next backward steps with the sum: the
    ordinary accumulation's bits."""
    a, b = Net(), Net()
    oa, ob = inductor_lamb.Lamb(a.parameters(), lr=1e-2), inductor_lamb.Lamb(b.parameters(), lr=1e-2)
    handle = inductor_lamb.step_in_backward(ob)
    loss_of(b, 0, torch.float32).backward()
    before = [p.clone() for p in b.parameters()]
    with pytest.raises(RuntimeError, match=r"handle.no_step\(\)"):
        loss_of(b, 1, torch.float32).backward()
    assert all(torch.equal(p, q) for p, q in zip(before, b.parameters()))
    ob.zero_grad()
    train(a, oa, steps=1)  # (b stepped once above too)
    oa.zero_grad()
    for micro in range(3):  # ordinary accumulation
        loss_of(a, 10 + micro, torch.float32).backward()
    oa.step()
    oa.zero_grad()
    for micro in range(3):
        if micro < 2:
            with handle.no_step():
                loss_of(b, 10 + micro, torch.float32).backward()
            assert all(p.grad is not None for p in b.parameters() if p.requires_grad)
        else:
            loss_of(b, 10 + micro, torch.float32).backward()
    ob.step()
    ob.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_clipping_set_later_is_refused_before_anything_steps():
    model = Net()
    opt = inductor_lamb.Lamb(model.parameters(), lr=1e-2)
    inductor_lamb.step_in_backward(opt)
    opt.param_groups[0]["max_grad_norm"] = 1.0
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"Lamb: param_groups\[0\]\['max_grad_norm'\] is 1.0"):
        loss_of(model, 0, torch.float32).backward()
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters()))


def test_grad_scaler_is_refused():
    """Refused at its step (the backward before it has stepped); the scaler's values are not left
    on the optimizer, whose next steps are ordinary ones."""
    model = Net()
    opt = inductor_lamb.Lamb(model.parameters(), lr=1e-2)
    handle = inductor_lamb.step_in_backward(opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale(loss_of(model, 0, torch.float32)).backward()
    with pytest.raises(RuntimeError, match="GradScaler cannot drive Lamb stepping in the backward"):
        scaler.step(opt)
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
    opt.zero_grad()
    handle.remove()
    loss_of(model, 1, torch.float32).backward()
    opt.step()


def test_create_graph_is_refused():
    model = Net()
    opt = inductor_lamb.Lamb(model.parameters(), lr=1e-2)
    with inductor_lamb.step_in_backward(opt) as handle:
        before = [p.clone() for p in model.parameters()]
        with pytest.raises(RuntimeError, match="create_graph=True cannot step Lamb's params"):
            loss_of(model, 0, torch.float32).backward(create_graph=True)
        assert all(torch.equal(p, q) for p, q in zip(before, model.parameters()))
        opt.zero_grad()
        with handle.no_step():  # (a gradient penalty's double backward: accumulated, not stepped)
            loss_of(model, 0, torch.float32).backward(create_graph=True)
        opt.zero_grad()


def test_reentrant_checkpointing_steps_once():
    """A reentrant activation checkpoint runs a backward inside the backward (its own graph task):
    part of the same pass, with the ordinary step's bits."""
    from torch.utils.checkpoint import checkpoint

    def forward(model, x):
        h = checkpoint(lambda t: torch.tanh(model.l2(torch.tanh(model.l1(t)))), x, use_reentrant=True)
        return (h @ model.wt) * model.scale

    a, b = Net(), Net()
    oa, ob = inductor_lamb.Lamb(a.parameters(), lr=1e-2), inductor_lamb.Lamb(b.parameters(), lr=1e-2)
    inductor_lamb.step_in_backward(ob, bucket_bytes=0)
    for i in range(3):
        x = torch.randn(8, 12, generator=torch.Generator().manual_seed(i), requires_grad=True)
        for m, o in ((a, oa), (b, ob)):
            forward(m, x).square().mean().backward()
            o.step()
            o.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_bad_arguments():
    model = Net()
    with pytest.raises(TypeError, match="takes an inductor_lamb optimizer .* got SGD"):
        inductor_lamb.step_in_backward(torch.optim.SGD(model.parameters()))
    opt = inductor_lamb.Lars(model.parameters())
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="bucket_bytes must be an int >= 0"):
            inductor_lamb.step_in_backward(opt, bucket_bytes=bad)
    handle = inductor_lamb.step_in_backward(opt)
    with pytest.raises(RuntimeError, match="already steps in the backward"):
        inductor_lamb.step_in_backward(opt)
    handle.remove()
    handle.remove()  # (twice: nothing)
    inductor_lamb.step_in_backward(opt).remove()


def test_route():
    assert route(Conditions(False, False, False, True, in_backward=True)) is Route.IN_BACKWARD
    assert route(Conditions(True, False, False, True, in_backward=True)) is Route.TRACED_WITH_BACKWARD
    assert Route.IN_BACKWARD.eager


@pytest.mark.parametrize("cls", [inductor_lamb.Lamb, inductor_lamb.Lamb16])
def test_compiled_autograd_traces_the_steps_into_the_backward(cls):
    """Under compiled autograd the hooks' op calls are in the backward graph (at its end: compiled
    autograd moves a param's hook before the backward's last read of the param): one compile, no
    graph break and no recompile while the lr changes, and the bits of the ordinary step after
    the same compiled forward and backward."""
    from torch._dynamo import compiled_autograd
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    def run(in_backward: bool):
        torch._dynamo.reset()
        counters.clear()
        model = Net(torch.bfloat16)
        opt = cls(model.parameters(), lr=torch.tensor(1e-2), weight_decay=0.1)
        if in_backward:
            inductor_lamb.step_in_backward(opt, bucket_bytes=0)
        backend = CompileCounterWithBackend("inductor")
        # (the forward compiled too, as compiled autograd's recipes do: an eager forward saves views
        # of the params, which AOTAutograd refuses beside the params the steps write)
        forward = torch.compile(lambda x: model(x).float().square().mean())
        for i in range(4):
            loss = forward(torch.randn(8, 12, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16))
            with compiled_autograd._enable(torch.compile(backend=backend, fullgraph=True)):
                loss.backward()
            opt.step()
            opt.zero_grad()
            opt.param_groups[0]["lr"].fill_(1e-2 / (i + 2))
        assert all(p.grad is None for p in model.parameters())
        return model, backend

    # (bfloat16 grads that feed the step inside the graph are rounded as a graph output's are)
    with torch._inductor.config.patch(emulate_precision_casts=True):
        ordinary, _ = run(False)
        stepped, backend = run(True)
    assert backend.frame_count == 1 and not counters["graph_break"]
    op = cls._layout.spec.op
    calls = [n for g in backend.graphs for n in g.graph.nodes if n.target is op or getattr(n.target, "_op", None) is op
             or "lamb" in str(n.target)]
    assert len(calls) >= sum(p.requires_grad for p in stepped.parameters()) - 1, backend.graphs[0].code
    for (name, p), q in zip(ordinary.named_parameters(), stepped.parameters()):
        assert torch.equal(p, q), name



@pytest.mark.parametrize("clip", ["clip_grad_norm_", "clip_grad_value_"])
def test_clipping_after_the_grads_are_gone_is_refused(clip):
    """torch's clipping finds no grads after a backward that stepped: it would clip nothing and
    report a norm of 0. Refused by name while the handle is active; torch's own function again
    once it is removed."""
    gc.collect()  # (handles other tests dropped without remove(): no longer active)
    model = Net()
    opt = inductor_lamb.Lamb(model.parameters(), lr=1e-2)
    original, clip_grad_own = getattr(torch.nn.utils, clip), getattr(torch.nn.utils.clip_grad, clip)
    if getattr(original, "_refuses_after_step_in_backward", False):
        original, clip_grad_own = original.__wrapped__, clip_grad_own.__wrapped__
    handle = inductor_lamb.step_in_backward(opt)
    with handle.no_step():  # (grads accumulated, nothing stepped: clipping them is allowed)
        loss_of(model, 0, torch.float32).backward()
    getattr(torch.nn.utils, clip)(model.parameters(), 1.0)
    loss_of(model, 1, torch.float32).backward()
    for fn in (getattr(torch.nn.utils, clip), getattr(torch.nn.utils.clip_grad, clip)):
        with pytest.raises(RuntimeError, match=f"torch.nn.utils.{clip} after a backward in which Lamb stepped"):
            fn(model.parameters(), 1.0)
    other = torch.nn.Linear(3, 3)
    other(torch.randn(2, 3)).sum().backward()
    getattr(torch.nn.utils, clip)(other.parameters(), 1.0)  # (params of no handle: torch's)
    opt.step()
    opt.zero_grad()
    with handle.no_step():  # (a new training step)
        loss_of(model, 2, torch.float32).backward()
    getattr(torch.nn.utils, clip)(model.parameters(), 1.0)
    handle.remove()
    loss_of(model, 3, torch.float32).backward()  # (ordinary again: torch's clipping of real grads)
    getattr(torch.nn.utils, clip)(model.parameters(), 1.0)
    gc.collect()
    from inductor_lamb.optim import _in_backward

    if not _in_backward._ACTIVE:  # (torch's own functions back once no handle is alive)
        assert getattr(torch.nn.utils, clip) is original
        assert getattr(torch.nn.utils.clip_grad, clip) is clip_grad_own



def test_compiled_autograd_keeps_the_refusals():
    """The checks run while compiled autograd traces the hooks (what they read is guarded): a second
    stepping backward before the training step ended is refused there too."""
    from torch._dynamo import compiled_autograd

    torch._dynamo.reset()
    model = Net()
    opt = inductor_lamb.Lamb(model.parameters(), lr=1e-2)
    inductor_lamb.step_in_backward(opt, bucket_bytes=0)
    forward = torch.compile(lambda x: model(x).square().mean())
    with pytest.raises(Exception, match=r"needs its backward compiled with fullgraph=True"):
        with compiled_autograd._enable(torch.compile(backend="inductor")):
            forward(torch.randn(8, 12)).backward()
    opt.zero_grad()
    torch._dynamo.reset()  # (compiled autograd keeps that graph, with its graph break, for this backward)
    compiler = torch.compile(backend="inductor", fullgraph=True)
    for i in range(2):
        with compiled_autograd._enable(compiler):
            forward(torch.randn(8, 12)).backward()
        opt.step()
        opt.zero_grad()
    with compiled_autograd._enable(compiler):
        forward(torch.randn(8, 12)).backward()
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(Exception, match=r"stepped in the last backward"):
        with compiled_autograd._enable(compiler):
            forward(torch.randn(8, 12)).backward()
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters()))
