"""The FX graph cache must never serve code compiled on another path.

Lowerings and decompositions are not part of Inductor's FX graph cache key, so a
warm cache could serve code compiled on another path or by an older lowering.
:class:`CacheKeyPass` is a post-grad pass whose ``uuid`` carries
:data:`LOWERING_VERSION`, a hash of this folder's sources and every op's active
path (its one rewrite: :func:`call_ops_that_write_nothing`); :func:`install` appends it to
``torch._inductor.config.post_grad_custom_post_pass`` (keeping any pass the
user set there). That entry is the only Inductor config this package touches.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

import torch

from .. import _private

# Bump whenever the IR/decomposition of any op changes: it keys Inductor's caches.
LOWERING_VERSION = "11"


@functools.cache
def _pass_class() -> type:
    """:class:`CacheKeyPass`, made on first use: its base class lives in Inductor, which
    importing this package does not import (``object`` where Inductor lacks the hook, warned)."""
    base: type = object
    try:
        base = _private.custom_graph_pass()
    except (ImportError, AttributeError) as e:
        _private.warn_once("Inductor's CustomGraphPass", "graphs holding the ops may miss the FX graph cache, "
                           "or be served code of another compile path after set_compile_path", e)

    class CacheKeyPass(base):
        """A post-grad pass whose ``uuid`` puts the lowering version and the active path
        into Inductor's FX graph cache key. It changes one thing only: see
        :func:`call_ops_that_write_nothing`."""

        def __call__(self, graph: torch.fx.Graph) -> None:
            call_ops_that_write_nothing(graph)

        def uuid(self) -> str:
            return f"inductor_lamb-lowering-v{LOWERING_VERSION}-{_sources_hash()}-{_active_paths()}"

    CacheKeyPass.__module__ = __name__
    return CacheKeyPass


def call_ops_that_write_nothing(graph: torch.fx.Graph) -> None:
    """A ``lamb`` op whose written lists are all empty (a reduce op on no params) is traced
    as an ``auto_functionalized_v2`` node with no bases, which Inductor's decomposition of it
    turns into a graph it cannot run ("getitem is not an OpOverload", torch 2.13 and 2.14).
    Such a node writes nothing: it becomes a direct call of the op."""
    af = torch.ops.higher_order.auto_functionalized_v2
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not af or node.kwargs.get("_all_bases"):
            continue
        op = node.args[0]
        if not isinstance(op, _private.OpOverload) or op.namespace != "lamb":
            continue
        kwargs = {a.name: node.kwargs[a.name] if a.name in node.kwargs else
                  ([] if node.kwargs.get(f"_{a.name}_length") == 0 else None) for a in op._schema.arguments}
        with graph.inserting_before(node):
            call = graph.call_function(op, kwargs=kwargs)
        for user in list(node.users):  # getitem(node, 0): the op's result; the rest are the (empty) lists
            if user.args[1] == 0 and op._schema.returns:
                call.meta.update(user.meta)
                user.replace_all_uses_with(call)
            graph.erase_node(user)
        graph.erase_node(node)


def __getattr__(name: str) -> object:
    if name == "CacheKeyPass":
        return _pass_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _sources_hash() -> str:
    """Hash of the files that generate the IR: an edit changes the key even if
    nobody bumps LOWERING_VERSION."""
    digest = hashlib.sha256()
    for path in [*sorted(Path(__file__).parent.glob("*.py")), Path(__file__).parents[1] / "spec.py",
                 Path(__file__).parents[1] / "rounding.py"]:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_active_paths: Callable[[], str] = lambda: ""  # every op's active path (install() is given it)


def install(paths: Callable[[], str]) -> None:
    """Chains the pass into Inductor's config; ``paths()`` gives every op's active path."""
    global _active_paths
    _active_paths = paths
    cls = _pass_class()
    if cls.__bases__ == (object,):
        return
    config = _private.inductor_config()
    current = config.post_grad_custom_post_pass
    passes = list(current) if isinstance(current, (list, tuple)) else ([current] if current else [])
    if any(isinstance(p, cls) for p in passes):
        return  # already chained; its uuid follows compile_path()
    if not passes:
        config.post_grad_custom_post_pass = cls()
    else:
        config.post_grad_custom_post_pass = [*passes, cls()]
