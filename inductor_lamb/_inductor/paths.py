"""Installing the compile paths of each op (lowering, decomposition, external),
with the fallback chain, ``set_compile_path`` / ``compile_path`` and the
``INDUCTOR_LAMB_COMPILE_PATH`` environment variable. See the package docstring."""

from __future__ import annotations

import os
import warnings
from types import SimpleNamespace
from typing import Any

import torch

from .. import _private
from ..ops import run_checks
from ..spec import SPECS, OpSpec, Role
from . import cache_key
from .steps import step_functions

__all__ = ["PATHS", "OPS", "compile_path", "set_compile_path", "install", "ensure_installed"]

PATHS = ("auto", "lowering", "decomposition", "external")
OPS = tuple(SPECS)

# Per op name: its active path, its lowered OpOverload, its decomposition's Library;
# "pending": the (path, op) items that install() recorded at import and ensure_installed()
# applies (None once applied).
_state: dict[str, Any] = {"paths": {}, "lowered": {}, "libraries": {}, "pending": None}


def compile_path(op: str | None = None) -> str:
    """The active path of ``op`` (``"lamb_step_"``, ``"lamb16_step_"``, ...):
    ``"auto"``, ``"lowering"``, ``"decomposition"`` or ``"external"``. Without ``op``: the
    path all ops share, or ``"mixed"`` when they differ."""
    ensure_installed()
    if op is not None:
        return _state["paths"].get(_check_op(op), "external")
    paths = {_state["paths"].get(name, "external") for name in OPS}
    return paths.pop() if len(paths) == 1 else "mixed"


def _paths_text() -> str:
    """Every op's active path, for the FX graph cache key."""
    return ",".join(f"{name}={compile_path(name)}" for name in OPS)


def _check_op(op: str) -> str:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
    return op


# ---- the paths -------------------------------------------------------------------


def _kernel_is_the_better_path(spec: OpSpec, bound: dict[str, Any]) -> bool:
    """The ``"auto"`` rule: one call of the op's C++ / CUDA kernel where one is built for the
    params' device and it is the better path, else the lowering.

    - On CPU, always: the kernel steps a call as fast as generated loops or faster, lowered into
      a whole training step too, and the lowering multiplies the cold compile (docs/decisions.md,
      "The default compile path is the kernel where one is built").
    - On CUDA, where the launch model of :mod:`.cost` says the kernel's few launches beat the
      lowering's (every layer-wise call)."""
    params = bound["params"]
    if not params:
        return True
    device = params[0].get_device()
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(device.type)
    if key is None or not _private.has_kernel_for(spec.op.name(), key):
        return False
    if device.type == "cpu":
        return True
    V = _private.inductor_virtualized().V
    from . import cost

    numels = [V.graph.sizevars.optimization_hint(p.get_numel(), fallback=8192) for p in params]
    # (Inductor's own choice of a two-stage reduction for a tensor of n elements)
    splits = lambda n: V.choices.reduction_split_factor(device, n, 1, True) > 1  # noqa: E731
    return cost.prefer_engine(spec.step, numels, splits, float(bound.get("max_grad_norm") or 0.0))


def _lowering_lacks(bound: dict[str, Any]) -> str | None:
    """Why this torch's Inductor cannot take the lowering of these params, or None."""
    params = bound["params"]
    return _private.lacks("lowering_cuda") if params and params[0].get_device().type == "cuda" else None


def _install_lowering(name: str, *, auto: bool = False) -> None:
    lowering_module = _private.inductor_lowering()
    fallback_handler, lowerings, register_lowering = (lowering_module.fallback_handler, lowering_module.lowerings,
                                                      lowering_module.register_lowering)

    from .ir_backend import IRBackend

    spec, step = SPECS[name], step_functions()[name]
    external = fallback_handler(spec.op, add_to_fallback_set=False)

    def lowering(*args: Any, **kwargs: Any) -> Any:
        # (the fake implementation already ran the checks while tracing)
        bound = spec.bind(args, kwargs)
        old_torch = _lowering_lacks(bound)
        if old_torch and not (auto and _private.has_kernel_for(spec.op.name(), "CUDA")):
            raise RuntimeError(f"{spec.name}: the 'lowering' compile path of a CUDA step: {old_torch}; use "
                               "set_compile_path('auto') with the CUDA kernels built, or 'decomposition'")
        if auto and (old_torch or _kernel_is_the_better_path(spec, bound)):
            out = external(*args, **kwargs)
            return out if spec.phase == "reduce" else ()
        B = IRBackend()
        a = SimpleNamespace(**bound)
        B.device = a.params[0].get_device() if a.params else None
        shared = [x.name for x in spec.args if x.role in (Role.TENSOR, Role.OPT_TENSOR)
                  and getattr(a, x.name) is not None]
        for name, values in zip(shared, B.per_tensor([getattr(a, k) for k in shared], len(a.params))):
            setattr(a, name, values)
        B.found_inf = a.found_inf
        out = step(B, a)
        return out if spec.phase == "reduce" else ()

    register_lowering(spec.op, type_promotion_kind=None)(lowering)
    _state["lowered"][name] = spec.op
    assert spec.op in lowerings


def _install_decomposition(name: str) -> None:
    from .torch_backend import TorchBackend

    spec, step = SPECS[name], step_functions()[name]

    def decomposition(*args: Any, **kwargs: Any) -> Any:
        run_checks(spec.op, *args, **kwargs)  # (tracing runs the decomposition instead of the fake)
        a = spec.bind(args, kwargs)
        B = TorchBackend()
        B.found_inf = a["found_inf"]
        return step(B, SimpleNamespace(**a))

    lib = torch.library.Library("lamb", "IMPL")
    _state["libraries"][name] = lib
    lib.impl(name, decomposition, "CompositeImplicitAutograd")


def _uninstall(name: str) -> None:
    op = _state["lowered"].pop(name, None)
    if op is not None:
        _private.inductor_lowering().lowerings.pop(op, None)
    lib = _state["libraries"].pop(name, None)
    if lib is not None:
        lib._destroy()
    _state["paths"].pop(name, None)


_INSTALLERS = {"auto": lambda name: _install_lowering(name, auto=True), "lowering": _install_lowering,
               "decomposition": _install_decomposition}


def set_compile_path(path: str = "auto", *, ops: str | list[str] | tuple[str, ...] | None = None,
                     warn: bool = True) -> str:
    """Installs ``path`` for ``ops`` (op names such as ``"lamb16_step_"``; default
    all), or for each op the best path below it that installs, and returns the
    path those ops now share (``"mixed"`` if a fallback split them). Other ops keep
    their path. Graphs compiled before keep the code they were compiled with: call
    ``torch._dynamo.reset()`` afterwards."""
    if path not in PATHS:
        raise ValueError(f"unknown compile path {path!r}; expected one of {PATHS}")
    names = list(OPS) if ops is None else [_check_op(o) for o in ([ops] if isinstance(ops, str) else ops)]
    if not names:
        raise ValueError(f"ops is empty; name ops of {OPS}, or pass None for all")
    ensure_installed()
    return _set_path(path, names, warn=warn, named=ops is not None)


def _set_path(path: str, names: list[str], *, warn: bool, named: bool) -> str:
    errors: dict[str, list[str]] = {}
    for name in names:
        _uninstall(name)
        for candidate in PATHS[PATHS.index(path):]:
            if candidate == "external":
                _state["paths"][name] = "external"
                break
            try:
                _INSTALLERS[candidate](name)
                _state["paths"][name] = candidate
                break
            except Exception as e:  # noqa: BLE001  (moved internals: any error means "not available")
                _uninstall(name)
                errors.setdefault(f"{candidate}: {type(e).__name__}: {e}", []).append(name)
    active = {compile_path(name) for name in names}
    if warn and errors:
        reasons = "; ".join(f"{err} ({', '.join(n)})" for err, n in errors.items())
        warnings.warn(
            f"inductor_lamb: torch.compile uses the {active.pop() if len(active) == 1 else 'mixed'!r} path for "
            f"{', '.join(names) if named else 'torch.ops.lamb ops'} ({reasons}); compiled steps are slower "
            "than with the Inductor lowering.",
            RuntimeWarning,
            stacklevel=2,
        )
    cache_key.install(_paths_text)
    active = {compile_path(name) for name in names}
    return active.pop() if len(active) == 1 else "mixed"


def _parse_env(value: str) -> list[tuple[str, str | None]]:
    """``INDUCTOR_LAMB_COMPILE_PATH``: comma-separated ``path`` (every op) and
    ``op=path`` items, applied in order; bad items are ignored with a warning."""
    items: list[tuple[str, str | None]] = []
    for item in filter(None, (x.strip() for x in value.split(","))):
        op, _, path = item.rpartition("=")
        if path in PATHS and (not op or op in OPS):
            items.append((path, op or None))
        else:
            warnings.warn(f"inductor_lamb: ignoring {item!r} in INDUCTOR_LAMB_COMPILE_PATH "
                          f"(expected a path of {PATHS} or op=path with an op of {OPS})")
    return items


def install() -> None:
    """Called once on import: records the ``"auto"`` path for every op, then what
    ``INDUCTOR_LAMB_COMPILE_PATH`` asks for; :func:`ensure_installed` applies them when
    compiling first needs them. Imports nothing of Inductor; never raises."""
    try:
        items = _parse_env(os.environ.get("INDUCTOR_LAMB_COMPILE_PATH", ""))
    except Exception as e:  # noqa: BLE001  (import must never fail)
        warnings.warn(f"inductor_lamb: could not read INDUCTOR_LAMB_COMPILE_PATH ({e}); using the default path")
        items = []
    if not any(op is None for _, op in items):
        items.insert(0, ("auto", None))
    _state["pending"] = items
    from .. import ops

    ops.before_trace = ensure_installed  # (the fake implementations call it: the first trace installs)


def ensure_installed() -> None:
    """Installs the paths that :func:`install` recorded, once: from the first trace of
    an op, or the first :func:`set_compile_path` / :func:`compile_path` call. Never raises
    (an op whose path cannot install falls back, down to ``"external"``, with a warning)."""
    items = _state["pending"]
    if items is None:
        return
    _state["pending"] = None
    try:
        with _private.disable_current_modes():  # (a trace's fake mode must not see Inductor's import)
            for path, op in items:
                _set_path(path, list(OPS) if op is None else [op], warn=True, named=op is not None)
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"inductor_lamb: could not set up torch.compile support ({e}); ops stay external calls")
        for name in OPS:
            _state["paths"][name] = "external"
