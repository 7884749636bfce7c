"""The shared math headers (csrc/common/<opt>.h) through their scalar
instantiation (V = float, what the CUDA kernels compile), built on the host from
tests/cpp/scalar_math.cpp without torch or CUDA headers, against the CPU op (the
same headers instantiated for at::vec vectors) and the float64 reference."""

from __future__ import annotations

import ctypes

import pytest
import torch
from conftest import assert_tensor_close, host_library, randn, raw_op_kwargs

import inductor_lamb
from inductor_lamb import reference, rounding
from inductor_lamb._inductor.torch_backend import TorchBackend

N = 20000  # > 1 chunk, odd tail
LRS = [0.02, 0.011, 0.005]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    # -ffp-contract=off: plain float rounding of every operation (no FMA), the scalar baseline
    lib = host_library(tmp_path_factory, "scalar_math.cpp", "-ffp-contract=off")
    i64, f32, f64, i32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_double, ctypes.c_int, ctypes.c_void_p
    lib.lamb_step.argtypes = [i64, ptr, ptr, ptr, ptr, f64, f64, f32, f32, f64, f64, i32, i32, i32, i32, i32, f64, f32]
    lib.lamb16_step.argtypes = [i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, f64, f32, f32, f64, f64, f64, f32, i32, i64, f32]
    lib.lars_step.argtypes = [i64, ptr, ptr, ptr, f64, f32, f64, f64, f64, f64, i32, f32, i32]
    lib.adagrad_step.argtypes = [i64, ptr, ptr, ptr, f64, f64, f64, f64, f64, i32, f32]
    lib.novograd_step.argtypes = [i64, ptr, ptr, ptr, ptr, f64, f32, f32, f64, f64, f64, i32, i32, i32, f32]
    lib.rounding_both_ways.argtypes = [i64, ptr, ptr, ptr, ptr, ptr, ptr]
    lib.round_params.argtypes = [i64, i32, ctypes.c_uint32, ptr, ptr, ptr, ptr]
    return lib


@pytest.fixture
def set_cap():
    """Runs the CPU op on the best kernels or the generic ones (conftest restores the choice)."""

    def set_to(cap: str) -> None:
        if cap == "default":
            inductor_lamb.set_cpu_capability("default")

    return set_to


def ptr(t: torch.Tensor):
    assert t.is_contiguous() and t.dtype in (torch.float32, torch.uint8, torch.int32)
    return ctypes.c_void_p(t.data_ptr())


def tensors(seed, *scales):
    gen = torch.Generator().manual_seed(seed)
    return [randn((N,), torch.float32, gen, s) for s in scales]


def close(a, b, rtol=2e-5, atol=2e-6):
    torch.testing.assert_close(a.double(), b.double(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("cap", ["best", "default"])
@pytest.mark.parametrize("kw", [dict(), dict(weight_decay=0.1, trust_clip=True, grad_scale=4.0),
                                dict(bias_correction=False, grad_averaging=False, weight_decay=0.0, always_adapt=True),
                                dict(weight_decay=0.2, decoupled_decay=True),
                                dict(weight_decay=0.2, decoupled_decay=True, max_lr=0.04, trust_clip=True)])
def test_lamb(lib, kw, cap, set_cap):
    set_cap(cap)
    p, g, m = tensors(1, 1.0, 1.0, 0.1)
    v = m.abs() + 1e-3
    scale = kw.get("grad_scale", 1.0)
    g = g * scale
    s_p, s_m, s_v = p.clone(), m.clone(), v.clone()  # scalar twin
    o_p, o_m, o_v, steps = p.clone(), m.clone(), v.clone(), [torch.tensor(0.0)]
    r_p, r_g, r_m, r_v = (t.double() for t in (p, g / scale, m, v))
    r_steps = [torch.tensor(0.0, dtype=torch.float64)]
    hyp = dict(eps=1e-6, weight_decay=kw.get("weight_decay", 0.01), bias_correction=kw.get("bias_correction", True),
               grad_averaging=kw.get("grad_averaging", True), always_adapt=kw.get("always_adapt", False),
               trust_clip=kw.get("trust_clip", False), decoupled_decay=kw.get("decoupled_decay", False),
               max_lr=kw.get("max_lr", 0.0))
    for t, lr in enumerate(LRS, 1):
        lib.lamb_step(N, ptr(s_p), ptr(g), ptr(s_m), ptr(s_v), float(t), lr, 0.9, 0.999, hyp["eps"],
                      hyp["weight_decay"], *(int(hyp[k]) for k in ("bias_correction", "grad_averaging", "always_adapt",
                                                                  "trust_clip", "decoupled_decay")), hyp["max_lr"],
                      1.0 / scale)
        torch.ops.lamb.lamb_step_([o_p], [g], [o_m], [o_v], steps, torch.tensor(lr),
                                  grad_scale=torch.tensor(scale), **raw_op_kwargs("lamb_step_", hyp))
        reference.lamb_step([r_p], [r_g], [r_m], [r_v], r_steps, lr=lr, **hyp)
    for s, o, r in ((s_p, o_p, r_p), (s_m, o_m, r_m), (s_v, o_v, r_v)):
        close(s, o)
        close(s, r)


@pytest.mark.parametrize("cap", ["best", "default"])
@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
def test_lamb16(lib, cap, set_cap, stochastic):
    set_cap(cap)
    p, g, m = tensors(2, 1.0, 1.0, 0.1)
    m_scale, v_scale = torch.tensor(0.3 / 448), torch.tensor(0.1 / 57344)
    m8 = (m / m_scale).clamp(-448, 448).to(torch.float8_e4m3fn)  # (saturated: torch 2.11's encoder gives NaN past it)
    v8 = ((m * m + 1e-4) / v_scale).to(torch.float8_e5m2)
    hyp = dict(eps=1e-6, weight_decay=0.01, trust_scale=0.382, stochastic_rounding=stochastic, seed=2**40 + 3)
    lr = 0.02
    s_p, s_m, s_v = p.clone(), m8.float(), v8.float()
    scales = torch.tensor([float(m_scale), float(v_scale)])
    m_codes, v_codes = m8.view(torch.uint8).clone(), v8.view(torch.uint8).clone()
    lib.lamb16_step(N, ptr(s_p), ptr(g), ptr(s_m), ptr(s_v), ptr(m_codes), ptr(v_codes), ptr(scales), lr, 0.9, 0.999,
                    hyp["eps"], hyp["weight_decay"], hyp["trust_scale"], 1.0, stochastic, hyp["seed"], 1.0)
    o_p, o_m8, o_v8, o_ms, o_vs = p.clone(), m8.clone(), v8.clone(), m_scale.clone(), v_scale.clone()
    torch.ops.lamb.lamb16_step_([o_p], [g], [o_m8], [o_v8], [o_ms], [o_vs], [torch.tensor(0.0)], torch.tensor(lr),
                                **raw_op_kwargs("lamb16_step_", hyp))
    close(s_p, o_p)
    close(scales, torch.stack([o_ms, o_vs]), rtol=1e-6, atol=0)
    assert_tensor_close(s_m.to(torch.float8_e4m3fn), o_m8)  # RNE encode of the scalar values (on the grid if SR)
    assert_tensor_close(s_v.to(torch.float8_e5m2), o_v8)
    r = [[t.double()] for t in (p, g)] + [[m8], [v8], [m_scale.double()], [v_scale.double()],
                                          [torch.tensor(0.0, dtype=torch.float64)]]
    reference.lamb16_step(*r, lr=lr, **hyp)
    close(s_p, r[0][0])


def test_stochastic_codes_are_the_encoded_rounded_values(lib):
    """rounding::stochastic_code (what the CPU kernels store) is c10's code of
    rounding::stochastic_round's value, over both float8 grids: every finite code,
    points between neighbours, the subnormal range, zeros and NaN, with random
    hashes (tie dithers included)."""
    gen = torch.Generator().manual_seed(0)
    values = []
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype).float()
        grid = grid[grid.isfinite()].unique()  # sorted
        between = grid[:-1] + (grid[1:] - grid[:-1]) * torch.rand(len(grid) - 1, 8, generator=gen).T
        values += [grid, between.flatten(), (grid[:-1] + grid[1:]) / 2]
    x = torch.cat(values + [torch.tensor([0.0, -0.0, float("nan"), -float("nan"), 1e-30, -1e-30])])
    x = x[(x.abs() <= 448) | x.isnan()].repeat(4).contiguous()
    hashes = torch.randint(-2**31, 2**31, x.shape, generator=gen, dtype=torch.int64).to(torch.int32)
    hashes[:16] = torch.tensor([0, -1, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFF8000, 0x80008000 - 2**32] * 2)
    out = {k: torch.empty(len(x), dtype=d) for k, d in
           (("mr", torch.float32), ("mc", torch.uint8), ("vr", torch.float32), ("vc", torch.uint8))}
    lib.rounding_both_ways(len(x), ptr(x), ptr(hashes), ptr(out["mr"]), ptr(out["mc"]), ptr(out["vr"]), ptr(out["vc"]))
    assert torch.equal(out["mc"], out["mr"].to(torch.float8_e4m3fn).view(torch.uint8))
    v_in = x.abs() <= 57344  # (v's grid is non-negative in use; signs are checked too)
    assert torch.equal(out["vc"][v_in], out["vr"][v_in].to(torch.float8_e5m2).view(torch.uint8))
    # the rounded values are on the grid (so encoding them is exact)
    assert torch.equal(out["mr"][x.isfinite()], out["mr"].to(torch.float8_e4m3fn).float()[x.isfinite()])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_param_rounding_is_the_same_in_cpp_and_torch(lib, dtype):
    """rounding::round_param on floats (the CUDA kernels' and the host's) against
    rounding.round_param on tensors (the lowering's, the decomposition's): the same bits,
    on values between grid points, on the grid, subnormal, huge, signed zeros and NaN; and
    every result is on dtype's grid, less than a grid step from the value."""
    gen = torch.Generator().manual_seed(1)
    x = torch.cat([randn((4000,), torch.float32, gen), randn((1000,), torch.float32, gen, 1e-6),
                   torch.tensor([0.0, -0.0, 1e-40, -3e-39, 6e-5, 65000.0, 3e38, float("inf"), float("nan")])])
    x = torch.cat([x, x.to(dtype).float()])  # on the grid too
    hash_in, p0 = randn(x.shape, torch.float32, gen), randn(x.shape, torch.float32, gen).to(dtype).float()
    key = rounding.key_of(7, 3)
    out = torch.empty_like(x)
    lib.round_params(len(x), 0 if dtype == torch.bfloat16 else 1, key, ptr(x), ptr(hash_in), ptr(p0), ptr(out))
    expected = rounding.round_param(TorchBackend(), dtype, x, p0, key=key, hash_in=hash_in)
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32))
    finite = x.isfinite() & (x.abs() < torch.finfo(dtype).max / 2)
    assert torch.equal(out[finite], out[finite].to(dtype).float())  # on the grid: the store keeps it
    spacing = torch.finfo(dtype).eps * x.abs().clamp(min=torch.finfo(dtype).tiny)  # (at most one grid step away)
    assert ((out - x).abs()[finite] <= spacing[finite] + torch.finfo(dtype).smallest_normal * 2**-10).all()


@pytest.mark.parametrize("cap", ["best", "default"])
@pytest.mark.parametrize("wd,adapt,scale,in_v", [(5e-4, True, 1.0, True), (1e-2, True, 2.0, True), (1e-2, False, 1.0, True),
                                                  (0.0, True, 1.0, True), (5e-4, True, 2.0, False), (0.0, True, 1.0, False)])
def test_lars(lib, wd, adapt, scale, in_v, cap, set_cap):
    set_cap(cap)
    p, g, buf = tensors(3, 1.0, 1.0, 0.01)
    hyp = dict(lars_coeff=0.02, eps=1e-3, rescale_grad=0.5, weight_decay=[wd], layer_adaptation=[adapt],
               lr_in_momentum=in_v)
    s_p, s_b, o_p, o_b = p.clone(), buf.clone(), p.clone(), buf.clone()
    r_p, r_b = p.double(), buf.double()
    for lr in LRS:
        lib.lars_step(N, ptr(s_p), ptr(g), ptr(s_b), lr, 0.9, 0.02, 1e-3, 0.5, wd, int(adapt), 1.0 / scale, int(in_v))
        torch.ops.lamb.lars_step_([o_p], [g], [o_b], torch.tensor(lr), grad_scale=torch.tensor(scale),
                                  **raw_op_kwargs("lars_step_", hyp))
        reference.lars_step([r_p], [g.double() / scale], [r_b], lr=lr, **hyp)
    for s, o, r in ((s_p, o_p, r_p), (s_b, o_b, r_b)):
        close(s, o)
        close(s, r)


@pytest.mark.parametrize("cap", ["best", "default"])
@pytest.mark.parametrize("kw", [dict(), dict(lr_decay=0.1, weight_decay=0.05, eps=1e-6, maximize=True)])
def test_adagrad(lib, kw, cap, set_cap):
    set_cap(cap)
    p, g, s0 = tensors(4, 1.0, 1.0, 1.0)
    s0 = s0.abs() + 0.1
    hyp = dict(lr_decay=0.0, weight_decay=0.0, eps=1e-10, maximize=False) | kw
    s_p, s_s, o_p, o_s = p.clone(), s0.clone(), p.clone(), s0.clone()
    r_p, r_s, steps, r_steps = p.double(), s0.double(), [torch.tensor(0.0)], [torch.tensor(0.0, dtype=torch.float64)]
    for t, lr in enumerate(LRS, 1):
        lib.adagrad_step(N, ptr(s_p), ptr(g), ptr(s_s), float(t), lr, hyp["lr_decay"], hyp["weight_decay"],
                         hyp["eps"], int(hyp["maximize"]), 1.0)
        torch.ops.lamb.adagrad_step_([o_p], [g], [o_s], steps, torch.tensor(lr), **hyp)
        reference.adagrad_step([r_p], [g.double()], [r_s], r_steps, lr=lr, **hyp)
    for s, o, r in ((s_p, o_p, r_p), (s_s, o_s, r_s)):
        close(s, o)
        close(s, r)


@pytest.mark.parametrize("cap", ["best", "default"])
@pytest.mark.parametrize("kw", [dict(), dict(weight_decay=0.05, grad_averaging=True, amsgrad=True),
                                dict(weight_decay=0.1, decoupled_decay=True, eps=1e-6),
                                dict(weight_decay=0.1, decoupled_decay=True, max_lr=0.03, amsgrad=True)])
@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_novograd(lib, kw, scale, cap, set_cap):
    set_cap(cap)
    p, m = tensors(5, 1.0, 0.01)
    hyp = dict(beta1=0.95, beta2=0.98, eps=1e-8, weight_decay=0.0, grad_averaging=False, amsgrad=False,
               decoupled_decay=False, max_lr=0.0) | kw
    s_p, s_m, s_v = p.clone(), m.clone(), torch.zeros(2)
    o_p, o_m, o_v, o_vmax, steps = p.clone(), m.clone(), torch.tensor(0.0), torch.tensor(0.0), [torch.tensor(0.0)]
    r_p, r_m, r_v, r_vmax = p.double(), m.double(), torch.tensor(0.0).double(), torch.tensor(0.0).double()
    for i, lr in enumerate(LRS):
        # a shrinking grad: v's EMA falls below its running max, which amsgrad's denominator keeps
        (g,) = tensors(50 + i, 1.0 / (i + 1))
        lib.novograd_step(N, ptr(s_p), ptr(g), ptr(s_m), ptr(s_v), lr, hyp["beta1"], hyp["beta2"], hyp["eps"],
                          hyp["weight_decay"], hyp["max_lr"], int(hyp["grad_averaging"]), int(hyp["amsgrad"]),
                          int(hyp["decoupled_decay"]), 1.0 / scale)
        torch.ops.lamb.novograd_step_([o_p], [g], [o_m], [o_v], [o_vmax], steps, torch.tensor(lr),
                                      grad_scale=torch.tensor(scale), **raw_op_kwargs("novograd_step_", hyp))
        reference.novograd_step([r_p], [g.double() / scale], [r_m], [r_v], [r_vmax], [torch.tensor(0.0).double()],
                                lr=lr, **hyp)
    for s, o, r in ((s_p, o_p, r_p), (s_m, o_m, r_m), (s_v[0], o_v, r_v), (s_v[1], o_vmax, r_vmax)):
        close(s, o)
        close(s, r)
    assert s_v[1] >= s_v[0] and (s_v[1] > s_v[0]) == (len(LRS) > 1)  # the max kept, and above v by now
