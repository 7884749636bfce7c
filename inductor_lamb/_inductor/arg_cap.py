"""One generated C++ function per compiled step, at any param count.

Inductor's C++ scheduler starts a new function once the current one has 500
arguments (``CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM``, a class constant guarding
ctypes' 1024-argument limit). A step passes ~12 buffers per param (p, g, m, v,
step and 0-d per-tensor scalars), so it would split every ~40 params. CPU kernels
are called through ``cpp_pybinding`` (arguments in a Python tuple, no ctypes) or
from C++ (cpp_wrapper / AOTInductor), where the limit does not apply, so while
Inductor generates code for a graph that contains one of our lowered ops the cap
is lifted; every other graph still reads Inductor's own value.

Installed with the first lowering (:func:`lift_for_our_graphs`), restored when
no lowering is left (:func:`restore`); the lowerings call :func:`mark_graph`.
"""

from __future__ import annotations

from typing import Any

_GRAPH_FLAG = "_inductor_lamb_lowered"
_saved: dict[str, int] = {}


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


def lift_for_our_graphs() -> None:
    try:
        from torch._inductor.codegen.cpp import CppScheduling
    except Exception:  # noqa: BLE001  (moved: the lowering still works, a step may span several functions)
        return
    current = CppScheduling.__dict__.get("MAX_FUSED_KERNEL_ARGS_NUM")
    if isinstance(current, _ArgCap) or not isinstance(current, int):
        return  # already lifted, or Inductor changed: keep its behaviour
    _saved["arg_cap"] = current
    CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM = _ArgCap(current)


def restore() -> None:
    if "arg_cap" not in _saved:
        return
    from torch._inductor.codegen.cpp import CppScheduling

    CppScheduling.MAX_FUSED_KERNEL_ARGS_NUM = _saved.pop("arg_cap")


def mark_graph() -> None:
    """Called by a lowering: the graph Inductor is compiling contains a lowered step."""
    from torch._inductor.virtualized import V

    setattr(V.graph, _GRAPH_FLAG, True)
