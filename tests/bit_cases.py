"""Exact-bits cases of every CPU kernel: a refactor of the kernels must not change one bit.

Each case runs a few steps of one op (with a changing lr) on random mixed-shape
lists and hashes every tensor the op writes (and the two-phase ops' reductions)
after each step. ``tests/fixtures/kernel_bits.json`` holds the hashes per CPU
capability; ``PYTHONPATH=. python tests/bit_cases.py`` regenerates the capabilities this CPU
has (only do that for an intended change of results, and say why in the commit).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import MIXED_SHAPES, noncontiguous_like, randn  # noqa: E402

import inductor_lamb  # noqa: E402
from inductor_lamb.spec import STEPS, Role  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "kernel_bits.json")
LRS = [0.02, 0.011, 0.005]
VARIANTS = ("f32", "bf16", "f16_master", "f32_transposed", "f32_strided")


def _lists(op: str, variant: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    dtype = {"bf16": torch.bfloat16, "f16_master": torch.float16}.get(variant, torch.float32)
    p = [randn(s, dtype, gen) for s in MIXED_SHAPES]
    g = [randn(s, dtype, gen) for s in MIXED_SHAPES]
    states = []
    if op in ("lamb", "lamb16"):
        states = [[randn(s, torch.float32, gen, 0.1) for s in MIXED_SHAPES],
                  [(torch.rand(s, generator=gen, dtype=torch.float64) * 0.1 + 1e-3).float() for s in MIXED_SHAPES]]
        if op == "lamb16":  # float8 moments with their per-tensor scales
            m_scales = [torch.tensor(0.1 / 448) for _ in MIXED_SHAPES]
            v_scales = [torch.tensor(0.101 / 57344) for _ in MIXED_SHAPES]
            # (saturated at 448 before the encode, as torch's encoder does from 2.13; 2.11's gave NaN)
            states = [[(m / s).clamp(-448, 448).to(torch.float8_e4m3fn) for m, s in zip(states[0], m_scales)],
                      [(v / s).to(torch.float8_e5m2) for v, s in zip(states[1], v_scales)], m_scales, v_scales]
    elif op == "lars":
        states = [[randn(s, torch.float32, gen, 0.01) for s in MIXED_SHAPES]]
    elif op == "novograd":  # m, and per tensor v and its max (0 on every other tensor: its first step)
        v = [torch.tensor(0.0 if i % 2 else float(torch.rand((), generator=gen)) + 0.1) for i in range(len(MIXED_SHAPES))]
        states = [[randn(s, torch.float32, gen, 0.01) for s in MIXED_SHAPES], v, [t * 1.5 for t in v]]
    else:
        states = [[(torch.rand(s, generator=gen, dtype=torch.float64) + 0.1).float() for s in MIXED_SHAPES]]
    if variant.startswith("f32_"):
        kind = variant.split("_")[1]
        p = [noncontiguous_like(t, kind) for t in p]
        g = [noncontiguous_like(t, kind) for t in g]
        states = [[noncontiguous_like(t, kind) if t.dim() else t for t in lst] for lst in states]
    steps = [torch.tensor(0.0) for _ in MIXED_SHAPES] if op != "lars" else None
    master = [t.float() for t in p] if variant == "f16_master" else None
    return p, g, states, steps, master


CONFIGS = {
    "lamb": {
        "default": {},
        "clip_scale": dict(max_grad_norm=1.0, grad_scale=2.0),
        "options": dict(bias_correction=False, grad_averaging=False, trust_clip=True, weight_decay=0.1),
        "eps0_adapt": dict(eps=0.0, weight_decay=0.0, always_adapt=True),
        "decoupled": dict(weight_decay=0.1, decoupled_decay=True, max_lr=0.03, seed=3),
    },
    # (recorded before stochastic rounding existed: pinned to round to nearest)
    "lamb16": {"default": dict(stochastic_rounding=False),
               "decay_scale": dict(weight_decay=0.01, trust_scale=0.5, grad_scale=4.0, stochastic_rounding=False),
               "stochastic": dict(weight_decay=0.01, grad_scale=4.0, seed=99)},
    "lars": {
        "default": dict(weight_decay=[5e-4]),
        "per_param": dict(weight_decay=[5e-4, 0.0, 1e-3, 0.0, 2e-4, 5e-4, 1e-4, 0.0, 3e-4],
                          layer_adaptation=[True, False] * 4 + [True], rescale_grad=0.5, eps=1e-3),
    },
    "adagrad": {"default": {}, "decay_maximize": dict(lr_decay=0.1, weight_decay=0.05, eps=1e-6, maximize=True)},
    "novograd": {"default": dict(weight_decay=0.01),
                 "options": dict(beta1=0.9, beta2=0.99, eps=1e-6, weight_decay=0.05, grad_averaging=True, amsgrad=True,
                                 grad_scale=4.0),
                 "decoupled": dict(weight_decay=0.1, decoupled_decay=True, seed=7)},
}

# (the scheduled hyper-parameters are 0-d tensors; the recorded bits took these values)
_TENSOR_DEFAULTS = {"beta1": 0.9, "beta2": 0.999, "momentum": 0.9}


def _tensor_hypers(op: str) -> list[str]:
    spec = next(s for s in STEPS if s.family == op)
    return [a.name for a in spec.of(Role.TENSOR) if a.name != "lr"]


def _bytes(t: torch.Tensor) -> bytes:
    if t.numel() == 0:
        return b""
    x = torch.empty(t.numel(), dtype=t.dtype).copy_(t.detach().reshape(-1))  # stride 1, even for size-1 dims
    return x.view(torch.uint8).numpy().tobytes()  # raw bits, any dtype


def run_case(op: str, config: str, variant: str) -> str:
    """sha256 of everything the op wrote, after each of len(LRS) steps."""
    kw = dict(CONFIGS[op][config])
    for name in _tensor_hypers(op):
        kw[name] = torch.tensor(float(kw.get(name, _TENSOR_DEFAULTS[name])))
    if "grad_scale" in kw:
        kw["grad_scale"] = torch.tensor(kw["grad_scale"])
    p, g, states, steps, master = _lists(op, variant, seed=len(op) + len(config))
    if "grad_scale" in kw:
        g = [t * kw["grad_scale"].to(t.dtype) for t in g]
    h = hashlib.sha256()
    for k, lr in enumerate(LRS):
        lists = [p, g, *states] + ([steps] if steps is not None else [])
        lr_t = torch.tensor(lr)
        if op == "adagrad":
            torch.ops.lamb.adagrad_step_(*lists, lr_t, master_params=master, **kw)
        else:
            reduce = getattr(torch.ops.lamb, "lars_reduce" if op == "lars" else f"{op}_reduce_")
            apply = getattr(torch.ops.lamb, f"{op}_apply_")
            if k % 2:  # odd steps through the two phases, the others through the one-call op
                r = reduce(*lists, lr_t, master_params=master, **kw)
                h.update(_bytes(r))
                apply(*lists, r, lr_t, master_params=master, **kw)
            else:
                getattr(torch.ops.lamb, f"{op}_step_")(*lists, lr_t, master_params=master, **kw)
        for lst in [p] + states + [steps or [], master or []]:
            for t in lst:
                h.update(_bytes(t))
    return h.hexdigest()


def cases():
    return [(op, c, v) for op in CONFIGS for c in CONFIGS[op] for v in VARIANTS]


def case_id(op, config, variant) -> str:
    return f"{op}/{config}/{variant}"


CAPABILITIES = ("default", "avx2", "avx512")


def available_capabilities() -> list[str]:
    best = torch.ops.lamb._max_cpu_capability()
    return list(CAPABILITIES[: best + 1])


def compute(cap: str) -> dict[str, str]:
    before = inductor_lamb.cpu_capability()
    inductor_lamb.set_cpu_capability(cap)
    try:
        return {case_id(*c): run_case(*c) for c in cases()}
    finally:
        inductor_lamb.set_cpu_capability(before)


if __name__ == "__main__":
    # python tests/bit_cases.py [cap ...]: (re)records those capabilities (default:
    # every one this CPU has); the others keep their recorded bits.
    data = json.load(open(FIXTURE)) if os.path.exists(FIXTURE) else {}
    for cap in sys.argv[1:] or available_capabilities():
        data[cap] = compute(cap)
        print(cap, len(data[cap]), "cases")
    with open(FIXTURE, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
