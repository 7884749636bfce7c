"""How ``torch.compile`` sees the ``torch.ops.lamb`` ops.

Three paths, best first; :func:`compile_path` says which one is active:

``"lowering"``
    An Inductor lowering per op (``register_lowering``) writes the step in
    Inductor IR with ``mutate_to`` on the list arguments, so the compiled graph
    runs the whole step, all params, in one generated C++ function on CPU (a few
    Triton kernels on GPU) fused with the rest of the graph.
``"decomposition"``
    When the lowering cannot be installed (Inductor internals moved), the same
    math as ``torch._foreach_*`` ops, registered as a ``CompositeImplicitAutograd``
    kernel that tracing applies (eager still runs the C++ kernel). Fused by
    Inductor, slower than the lowering.
``"external"``
    The op stays one opaque external call in the compiled code: correct, eager speed.

Both fused paths come from one description of each step (``lamb.py``,
``lamb16.py``, ``lars.py``, ``adagrad.py`` over the vocabulary of ``backends.py``).

Each op has its own path. Installing never raises: a failure falls to the next
path with one warning. ``INDUCTOR_LAMB_COMPILE_PATH`` sets paths at import (a
path for every op, and/or ``op=path`` items, comma-separated, e.g.
``lowering,lamb16_step_=external``), :func:`set_compile_path` at run time (call
``torch._dynamo.reset()`` after it).

Cache safety: lowerings and decompositions are not part of Inductor's FX graph
cache key, so a warm cache could serve code compiled on another path or an
older lowering. :class:`CacheKeyPass` is a no-op post-grad pass whose ``uuid``
carries :data:`LOWERING_VERSION`, a hash of this package's sources and the active paths; installing appends it to
``torch._inductor.config.post_grad_custom_post_pass`` (keeping any pass the
user set there). That entry is the only Inductor config this package touches.
"""

from __future__ import annotations

import functools
import hashlib
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["LOWERING_VERSION", "CacheKeyPass", "compile_path", "set_compile_path", "install"]

# Bump whenever the IR/decomposition of any op changes: it keys Inductor's caches.
LOWERING_VERSION = "3"

PATHS = ("lowering", "decomposition", "external")
OPS = ("lamb_step_", "lamb16_step_", "lars_step_", "adagrad_step_")

# Per op name: its active path, its lowered OpOverload, its decomposition's Library.
_state: dict[str, Any] = {"paths": {}, "lowered": {}, "libraries": {}}


def _step_functions() -> dict[str, Callable[..., None]]:
    from .adagrad import adagrad_step
    from .lamb import lamb_step
    from .lamb16 import lamb16_step
    from .lars import lars_step

    return {"lamb_step_": lamb_step, "lamb16_step_": lamb16_step, "lars_step_": lars_step,
            "adagrad_step_": adagrad_step}


def compile_path(op: str | None = None) -> str:
    """The active path of ``op`` (``"lamb_step_"``, ``"lamb16_step_"``, ...):
    ``"lowering"``, ``"decomposition"`` or ``"external"``. Without ``op``: the
    path all ops share, or ``"mixed"`` when they differ."""
    if op is not None:
        return _state["paths"].get(_check_op(op), "external")
    paths = {_state["paths"].get(name, "external") for name in OPS}
    return paths.pop() if len(paths) == 1 else "mixed"


def _check_op(op: str) -> str:
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
    return op


# ---- the paths -------------------------------------------------------------------


def _install_lowering(name: str) -> None:
    from torch._inductor.lowering import lowerings, register_lowering

    from ..ops import bind
    from .backends import IRBackend

    op, step = getattr(torch.ops.lamb, name).default, _step_functions()[name]

    def lowering(*args: Any, **kwargs: Any) -> tuple[()]:
        _mark_graph()
        step(IRBackend(), **bind(op, args, kwargs))
        return ()

    register_lowering(op, type_promotion_kind=None)(lowering)
    _state["lowered"][name] = op
    assert op in lowerings
    _lift_arg_cap_for_our_graphs()


# ---- one generated function per step on CPU ------------------------------------------
#
# Inductor's C++ scheduler starts a new function once the current one has 500
# arguments (``CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM``, a class constant guarding
# ctypes' 1024-argument limit). A step passes ~12 buffers per param (p, g, m, v,
# step and 0-d per-tensor scalars), so it would split every ~40 params. CPU kernels
# are called through ``cpp_pybinding`` (arguments in a Python tuple, no ctypes) or
# from C++ (cpp_wrapper / AOTInductor), where the limit does not apply, so while
# Inductor generates code for a graph that contains one of our ops the cap is
# lifted; every other graph still reads Inductor's own value.

_GRAPH_FLAG = "_inductor_lamb_lowered"


class _ArgCap:
    """Stands in for ``CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM``: Inductor's own
    value, or no cap while the graph being compiled contains a lowered step."""

    def __init__(self, default: int) -> None:
        self.default = default

    def __get__(self, obj: Any, owner: Any = None) -> int | float:
        from torch._inductor.virtualized import V

        try:
            lifted = getattr(V.graph, _GRAPH_FLAG, False)
        except Exception:  # noqa: BLE001  (no graph being compiled)
            lifted = False
        return float("inf") if lifted else self.default


def _lift_arg_cap_for_our_graphs() -> None:
    try:
        from torch._inductor.codegen.cpp import CppScheduling
    except Exception:  # noqa: BLE001  (moved: the lowering still works, a step may span several functions)
        return
    current = CppScheduling.__dict__.get("MAX_FUSED_KERNEL_ARGS_NUM")
    if isinstance(current, _ArgCap):
        return
    if not isinstance(current, int):
        # Inductor changed: keep its behaviour (a step may span several functions).
        return
    _state["arg_cap"] = current
    CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM = _ArgCap(current)


def _restore_arg_cap() -> None:
    if _state.get("arg_cap") is None:
        return
    from torch._inductor.codegen.cpp import CppScheduling

    CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM = _state.pop("arg_cap")


def _mark_graph() -> None:
    from torch._inductor.virtualized import V

    setattr(V.graph, _GRAPH_FLAG, True)


def _install_decomposition(name: str) -> None:
    from ..ops import bind, check_fake
    from .backends import TorchBackend

    op, step = getattr(torch.ops.lamb, name).default, _step_functions()[name]

    def decomposition(*args: Any, **kwargs: Any) -> None:
        a = bind(op, args, kwargs)
        check_fake(name, a)  # same errors as the fake kernel, at trace time
        step(TorchBackend(), **a)

    lib = torch.library.Library("lamb", "IMPL")
    _state["libraries"][name] = lib
    lib.impl(name, decomposition, "CompositeImplicitAutograd")


def _uninstall(name: str) -> None:
    op = _state["lowered"].pop(name, None)
    if op is not None:
        from torch._inductor.lowering import lowerings

        lowerings.pop(op, None)
    if not _state["lowered"]:
        try:
            _restore_arg_cap()
        except Exception:  # noqa: BLE001
            pass
    lib = _state["libraries"].pop(name, None)
    if lib is not None:
        lib._destroy()
    _state["paths"].pop(name, None)


_INSTALLERS = {"lowering": _install_lowering, "decomposition": _install_decomposition}


def set_compile_path(path: str = "lowering", *, ops: str | list[str] | tuple[str, ...] | None = None,
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
            f"{'torch.ops.lamb ops' if ops is None else ', '.join(names)} ({reasons}); compiled steps are slower "
            "than with the Inductor lowering.",
            RuntimeWarning,
            stacklevel=2,
        )
    _install_cache_key_pass()
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


def install() -> str:
    """Called once on import: the lowering for every op, then what
    ``INDUCTOR_LAMB_COMPILE_PATH`` asks for, falling back as needed. Never raises."""
    try:
        items = _parse_env(os.environ.get("INDUCTOR_LAMB_COMPILE_PATH", ""))
        if not any(op is None for _, op in items):
            items.insert(0, ("lowering", None))
        for path, op in items:
            set_compile_path(path, ops=op, warn=True)
        return compile_path()
    except Exception as e:  # noqa: BLE001  (import must never fail)
        warnings.warn(f"inductor_lamb: could not set up torch.compile support ({e}); ops stay external calls")
        for name in OPS:
            _state["paths"][name] = "external"
        return "external"


# ---- cache key ---------------------------------------------------------------------

try:
    from torch._inductor.custom_graph_pass import CustomGraphPass as _PassBase
except Exception:  # noqa: BLE001
    _PassBase = object  # type: ignore[assignment,misc]


class CacheKeyPass(_PassBase):  # type: ignore[misc,valid-type]
    """A post-grad pass that changes nothing; its ``uuid`` puts the lowering
    version and the active path into Inductor's FX graph cache key."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        return None

    def uuid(self) -> str:
        paths = ",".join(f"{name}={compile_path(name)}" for name in OPS)
        return f"inductor_lamb-lowering-v{LOWERING_VERSION}-{_sources_hash()}-{paths}"


@functools.lru_cache(maxsize=None)
def _sources_hash() -> str:
    """Hash of the files that generate the IR: an edit changes the key even if
    nobody bumps LOWERING_VERSION."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_CACHE_KEY_PASS = CacheKeyPass()


def _install_cache_key_pass() -> None:
    if _PassBase is object:
        return
    from torch._inductor import config

    current = config.post_grad_custom_post_pass
    passes = list(current) if isinstance(current, (list, tuple)) else ([current] if current else [])
    if any(isinstance(p, CacheKeyPass) for p in passes):
        return  # already chained; its uuid follows compile_path()
    if not passes:
        config.post_grad_custom_post_pass = _CACHE_KEY_PASS
    else:
        config.post_grad_custom_post_pass = [*passes, _CACHE_KEY_PASS]
