"""Smoke test of an installed inductor_lamb (a wheel: no build step, no source checkout on
the path), run by .ci/run in a fresh virtualenv:

    python tests/wheel_smoke.py            # every op against the float64 reference, one step of
                                           # each optimizer; and, where a C++ compiler is found,
                                           # one compiled training step against eager
    python tests/wheel_smoke.py --expect-no-compiler   # fails if a C++ compiler is on PATH

Self-contained: it imports nothing from the tests. Exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

# The installed package, never the checkout this script lies in.
sys.path = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402
from torch import nn  # noqa: E402

import inductor_lamb  # noqa: E402
from inductor_lamb import reference  # noqa: E402
from inductor_lamb.spec import SPECS, Role  # noqa: E402

SHAPES = [(33, 17), (), (0,), (7,), (40000,)]
# A state in flight: step 2, LAMB16's float8 scales; any other per-tensor scalar (a per-tensor
# moment such as NovoGrad's v) 0.3.
SCALARS = {"steps": 2.0, "exp_avg_scales": 2.5e-4, "exp_avg_sq_scales": 2e-6}


def op_lists(name: str, gen: torch.Generator) -> list[list[torch.Tensor]]:
    """Random list arguments of step op ``name`` in schema order (a state in flight)."""
    out = []
    for a in SPECS[name].args:
        if a.role in (Role.PARAMS, Role.GRADS):
            out.append([torch.randn(s, generator=gen) for s in SHAPES])
        elif a.role is Role.STATE:
            x = [torch.rand(s, generator=gen) * 0.1 + 1e-3 for s in SHAPES]
            if a.dtype == torch.float8_e4m3fn:
                x = [(t * 4000).to(a.dtype) for t in x]
            elif a.dtype == torch.float8_e5m2:
                x = [(t * 5e5).to(a.dtype) for t in x]
            out.append(x)
        elif a.role is Role.SCALARS:
            out.append([torch.tensor(SCALARS.get(a.name, 0.3)) for _ in SHAPES])
    return out


def check_ops() -> None:
    """Each step op against the reference (float64 params and grads), and reduce + apply
    against the one-call op, bit for bit."""
    gen = torch.Generator().manual_seed(0)
    for name, spec in SPECS.items():
        if spec.phase != "step":
            continue
        lists = op_lists(name, gen)
        ref = [[t.double() if k < 2 else t.clone() for t in lst] for k, lst in enumerate(lists)]
        two = [[t.clone() for t in lst] for lst in lists]
        getattr(inductor_lamb.ops, name)(*lists, lr=0.01)
        getattr(reference, name.removesuffix("_"))(*ref, lr=0.01)
        for x, y in zip(lists[0], ref[0]):
            torch.testing.assert_close(x.double(), y, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
        if spec.reduce_op:
            reduce, apply = getattr(inductor_lamb.ops, spec.reduce_op), getattr(inductor_lamb.ops, spec.apply_op)
            apply(*two, reduce(*two, lr=0.01), lr=0.01)
            for lst, lst2 in zip(lists, two):
                assert all(torch.equal(x.view(torch.uint8) if x.dtype.itemsize == 1 else x,
                                       y.view(torch.uint8) if y.dtype.itemsize == 1 else y)
                           for x, y in zip(lst, lst2)), f"{name}: reduce + apply differs from the one-call op"
        print(f"ok  {name} (and its phases)" if spec.reduce_op else f"ok  {name}")


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 5))


def step(net: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


# Every optimizer the package exports, each at a learning rate that suits it (default 0.02).
LR = {"Lars": dict(lr=0.3, weight_decay=1e-3), "Adagrad": dict(lr=0.05)}


def check_optimizers() -> None:
    x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
    for cls in inductor_lamb.optim.OPTIMIZERS:
        name = cls.__name__
        net = model()
        before = [p.detach().clone() for p in net.parameters()]
        opt = cls(net.parameters(), **LR.get(name, dict(lr=0.02, weight_decay=0.01)))
        step(net, opt, x, y)
        assert all(torch.isfinite(p).all() and not torch.equal(p, b) for p, b in zip(net.parameters(), before)), name
        print(f"ok  {name}: one step")


def check_compiled_step() -> None:
    """A whole training step (forward, backward, Lamb's step) compiled against the same
    steps eagerly: Inductor generates C++ here, so this needs a compiler."""
    batches = [(torch.randn(16, 12), torch.randint(0, 5, (16,))) for _ in range(3)]
    nets, losses = [model(), model()], [[], []]
    for i, net in enumerate(nets):
        opt = inductor_lamb.Lamb(net.parameters(), lr=0.02, weight_decay=0.01)
        run = step if i == 0 else torch.compile(step)
        for x, y in batches:
            losses[i].append(float(run(net, opt, x, y)))
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    print(f"ok  compiled training step matches eager (losses {losses[1]})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expect-no-compiler", action="store_true")
    args = parser.parse_args()
    compiler = next((c for c in ("c++", "g++", "gcc", "clang++") if shutil.which(c)), None)
    if args.expect_no_compiler and compiler:
        sys.exit(f"a C++ compiler ({shutil.which(compiler)}) is on PATH")
    print(f"inductor_lamb from {os.path.dirname(inductor_lamb.__file__)}, torch {torch.__version__}, "
          f"built against {inductor_lamb._build.build_info()}")
    check_ops()
    check_optimizers()
    if compiler:
        check_compiled_step()
    else:
        print("no C++ compiler on PATH: the compiled step is not tried (Inductor needs one on CPU)")


if __name__ == "__main__":
    main()
