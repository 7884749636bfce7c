"""A step is an in-place update that autograd sees, as torch's own in-place ops are:
version counters of every written tensor go up (eagerly, through the optimizers and on
every compile path), a tensor that requires grad is not written while grad mode is on,
inference tensors are not written outside inference mode, and memory shared between what
an op writes and anything else of the call is refused before anything is written
(tests/test_spec.py's BAD table holds those cases, on every compile path)."""

from __future__ import annotations

import pytest
import torch
from conftest import STEP_OPTIMIZERS, clone_lists, equal, raw_op_kwargs, spec_lists
from torch import nn

import inductor_lamb
from inductor_lamb.spec import SPECS

SHAPES = [(3, 4), (5,), ()]
PATHS = inductor_lamb._inductor.PATHS


@pytest.fixture
def reset_path():
    yield
    inductor_lamb.set_compile_path("auto")
    torch._dynamo.reset()


def _call(name, args, kwargs):
    getattr(torch.ops.lamb, name)(*args, **kwargs)


def _split(name, args, kwargs):
    """(written tensors, read tensors) of a call, from the schema's (a!) annotations."""
    spec, written, read = SPECS[name], [], []
    values = spec.bind(args, kwargs)
    for a in spec.args:
        v = values[a.name]
        tensors = v if isinstance(v, list) else [v] if isinstance(v, torch.Tensor) else []
        (written if a.name in spec.mutates else read).extend(tensors)
    return written, read


@pytest.mark.parametrize("path", ["eager", *PATHS])
@pytest.mark.parametrize("name", list(SPECS))
def test_every_written_tensor_gets_a_new_version(name, path, reset_path):
    args = spec_lists(name, SHAPES, seed=1)
    kwargs = raw_op_kwargs(name, {"lr": torch.tensor(0.01)})
    written, read = _split(name, args, kwargs)
    assert read and (written or name == "lars_reduce")  # (lars_reduce writes nothing)
    before = [t._version for t in written], [t._version for t in read]
    if path == "eager":
        _call(name, args, kwargs)
    else:
        inductor_lamb.set_compile_path(path, ops=name)
        torch._dynamo.reset()
        torch.compile(_call, fullgraph=True)(name, args, kwargs)
    assert all(t._version > v for t, v in zip(written, before[0]))
    assert [t._version for t in read] == before[1]


def _saved_param_graph(seed=0):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    x = torch.randn(4, 6, requires_grad=True)
    return net, net(x).pow(2).sum()  # backward needs the weights (grad of x and of the hidden layer)


OPTIMIZERS = {**STEP_OPTIMIZERS, "torch.optim.AdamW": (torch.optim.AdamW, dict(lr=0.01))}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_backward_through_weights_saved_before_a_step_raises(name, compiled):
    """As with torch.optim: the step bumps every param's version, so autograd refuses the
    second backward that would otherwise use the new weights in place of the saved ones."""
    cls, kwargs = OPTIMIZERS[name]
    net, out = _saved_param_graph()
    out.backward(retain_graph=True)
    opt = cls(net.parameters(), **kwargs)
    versions = [p._version for p in net.parameters()]
    (torch.compile(opt.step) if compiled else opt.step)()
    assert all(p._version > v for p, v in zip(net.parameters(), versions))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


@pytest.mark.parametrize("path", ["eager", *PATHS])
@pytest.mark.parametrize("name", ["lamb_step_", "lamb16_apply_", "lars_step_", "lamb_reduce_", "adagrad_step_"])
def test_a_tensor_that_requires_grad_is_not_written_in_grad_mode(name, path, reset_path):
    args = spec_lists(name, SHAPES, seed=2)
    kwargs = raw_op_kwargs(name, {"lr": torch.tensor(0.01)})
    written, _ = _split(name, args, kwargs)
    target = next(t for t in written if t.is_floating_point() and t.dtype.itemsize >= 2)
    target.requires_grad_(True)
    before = clone_lists(args)
    call = _call if path == "eager" else torch.compile(_call, fullgraph=True)
    if path != "eager":
        inductor_lamb.set_compile_path(path, ops=name)
        torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=rf"{name}: \w+\[\d+\] requires grad and grad mode is on \(a leaf Variable "
                                           r"that requires grad is being used in an in-place operation\).*"
                                           r"torch\.no_grad\(\)"):
        call(name, args, kwargs)
    assert all(equal(x.detach(), y) for a, b in zip(args, before) for x, y in zip(a, b))
    with torch.no_grad():
        call(name, args, kwargs)  # (what optimizers do)


def test_grads_that_require_grad_are_read_in_grad_mode():
    """A grad that requires grad (a backward with create_graph=True) is only read: allowed."""
    args = spec_lists("lamb_step_", SHAPES, seed=3)
    args[1] = [g.requires_grad_(True) for g in args[1]]
    _call("lamb_step_", args, raw_op_kwargs("lamb_step_", {"lr": torch.tensor(0.01)}))


@pytest.mark.parametrize("name", ["lamb_step_", "lamb16_step_", "lars_step_", "adagrad_step_"])
def test_inference_tensors_are_written_only_in_inference_mode(name):
    args = spec_lists(name, SHAPES, seed=4)
    kwargs = raw_op_kwargs(name, {"lr": torch.tensor(0.01)})
    expected = clone_lists(args)
    _call(name, expected, kwargs)
    with torch.inference_mode():
        frozen = clone_lists(args)  # inference tensors
    untouched = clone_lists(frozen)
    with pytest.raises(RuntimeError, match=rf"{name}: params\[0\] is an inference tensor: inplace update to "
                                           r"inference tensor outside InferenceMode is not allowed"):
        _call(name, frozen, kwargs)
    assert all(equal(x, y) for a, b in zip(frozen, untouched) for x, y in zip(a, b))
    with torch.inference_mode():
        _call(name, frozen, kwargs)
    assert all(equal(x, y) for a, b in zip(frozen, expected) for x, y in zip(a, b))


def test_disjoint_views_of_one_buffer_are_separate_tensors():
    """Views that share a storage but no element (the rows of a flat buffer, the columns of
    one matrix: interleaved address ranges) step as if they were separate tensors."""
    flat, wide = torch.randn(12), torch.randn(4, 6)
    views = [flat[:5], flat[5:], wide[:, :3], wide[:, 3:]]
    separate = [v.clone() for v in views]

    def lists(params, seed):
        gen = torch.Generator().manual_seed(seed)
        grads = [torch.randn(p.shape, generator=gen) for p in params]
        return [params, grads, [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params],
                [torch.tensor(0.0) for _ in params]]

    kwargs = raw_op_kwargs("lamb_step_", {"lr": torch.tensor(0.01)})
    for params in (views, separate):
        _call("lamb_step_", lists(params, 0), kwargs)
    assert all(torch.equal(v, s) for v, s in zip(views, separate))
    assert torch.equal(flat, torch.cat([views[0], views[1]])) and torch.equal(wide, torch.cat(views[2:], dim=1))


def test_read_only_tensors_may_share_memory():
    """One grad for two params, or one tensor as lr and as grad_scale: nothing is written into them."""
    args = spec_lists("lamb_step_", [(5,), (5,)], seed=5)
    args[1] = [args[1][0], args[1][0]]
    lr = torch.tensor(0.01)
    _call("lamb_step_", args, raw_op_kwargs("lamb_step_", {"lr": lr, "grad_scale": lr}))
    assert not torch.equal(args[0][0], args[0][1])  # (different params and state, one grad)
