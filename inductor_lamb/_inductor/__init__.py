"""How ``torch.compile`` sees the ``torch.ops.lamb`` ops.

Four paths, best first; :func:`compile_path` says which one is active:

``"auto"`` (the default)
    One external call of the op's C++ / CUDA kernel where one is built for the
    params' device and it is the better path (on CPU every call; on CUDA where the
    launch model of ``cost.py`` says so: every layer-wise call), else the lowering
    below (docs/decisions.md, "The default compile path is the kernel where one is
    built").
``"lowering"``
    An Inductor lowering per op (``register_lowering``) writes the step in
    Inductor IR with ``mutate_to`` on the list arguments, so the compiled graph
    runs the whole step, all params, in generated C++ on CPU (a function per ~40 params; a few
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

Importing the package imports neither Inductor nor Dynamo (about 2 s that an eager
process, a DataLoader worker included, would pay for nothing): the paths are
installed when first needed, that is when ``torch.compile`` first traces an op (its
fake implementation runs :func:`ensure_installed`), or at the first
:func:`set_compile_path` or :func:`compile_path` call.

Cache safety: lowerings and decompositions are not part of Inductor's FX graph
cache key, so a warm cache could serve code compiled on another path or an
older lowering. :class:`CacheKeyPass` is a post-grad pass whose ``uuid``
carries :data:`LOWERING_VERSION`, a hash of this package's sources and the active paths; installing appends it to
``torch._inductor.config.post_grad_custom_post_pass`` (keeping any pass the
user set there). That entry is the only Inductor config this package touches.
"""

from __future__ import annotations

from .cache_key import LOWERING_VERSION
from .paths import OPS, PATHS, compile_path, ensure_installed, install, set_compile_path

__all__ = ["LOWERING_VERSION", "CacheKeyPass", "OPS", "PATHS", "compile_path", "set_compile_path", "install",
           "ensure_installed"]


def __getattr__(name: str) -> object:
    if name == "CacheKeyPass":  # (a class made on first use: its base class lives in Inductor)
        from . import cache_key

        return cache_key.CacheKeyPass
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
