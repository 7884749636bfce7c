"""Shared helpers: random optimizer problems and float64 reference runs."""

from __future__ import annotations

import copy

import pytest
import torch

import inductor_lamb  # noqa: F401  (registers torch.ops.lamb.*)

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
