"""DTensor params (FSDP2, HSDP, tensor parallel) in the optimizers.

The kernels run on the local shards. Every per-tensor quantity a step needs
(LAMB/LARS norms, LAMB16's amax scales, the global grad norm for clipping) is
one of the full logical tensor: the two-phase ops return local partials, which
are combined across the mesh dimensions the tensor is sharded on, then the
apply op finishes the step (protocol: :mod:`inductor_lamb.spec`). A bucket's
params share one :class:`Sharding`, so one collective per bucket (per sharded
mesh dimension) suffices: an ``all_reduce`` when every column sums, an
``all_gather`` combined locally when some take a max (LAMB16's amaxes), which
is still one collective and gives every rank the same bits. Collectives are
the traceable functional ones: a compiled step keeps them in its graph, and
nothing syncs the host.

Along a ``Replicate()`` mesh dimension each rank already holds the whole
extent, so nothing is combined there. How a sharded dimension lays the elements out does not
matter: ``Shard(d)`` with even or uneven shards (a rank may hold none), and ``_StridedShard``
(FSDP2 on top of tensor parallel: TorchTitan's 2-D layouts) alike put each element on exactly one
rank along that mesh dimension, so the partial sums and maxima of the local shards combine into
the whole tensor's. Only ``Partial`` (values still to be reduced) is refused.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .. import _private

__all__ = ["Sharding", "sharding_of", "local", "combine", "all_reduce_sum", "is_dtensor", "dtensor_type",
           "same_mesh"]


def dtensor_type() -> type | None:
    """The DTensor class, or None while ``torch.distributed.tensor`` is not imported: no
    DTensor can exist before it is, and importing it costs about a second, which a process
    that never shards (a DataLoader worker, an eager script) should not pay."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


@dataclass(frozen=True)
class Sharding:
    """Where the shards of a bucket's tensors live: the mesh, and the mesh
    dimensions along which the partials of one tensor's shards combine."""

    mesh: Any                 # torch.distributed.device_mesh.DeviceMesh
    dims: tuple[int, ...]     # mesh dims with a Shard placement


def is_dtensor(t: Any) -> bool:
    cls = dtensor_type()
    return cls is not None and isinstance(t, cls)


def _describe(t: Any) -> str:
    return f"DTensor on mesh {tuple(t.device_mesh.mesh.shape)} with placements {tuple(t.placements)}"


def sharding_of(p: Any, grad: Any, state: dict[str, Any], name: str, who: str) -> Sharding | None:
    """The sharding of param ``p`` (None for a plain tensor), after checking that
    its grad and state tensors are laid out like it. Raises ``ValueError``
    naming the param otherwise (before any tensor is touched)."""
    if not is_dtensor(p):
        for key, t in (("grad", grad), *state.items()):
            if is_dtensor(t):
                raise ValueError(f"{who}: {key} of param {name} is a {_describe(t)} but the param is a plain "
                                 "tensor; param, grad and optimizer state must be sharded alike")
        return None
    from torch.distributed.tensor import Replicate

    for pl in p.placements:
        if not (_is_shard(pl) or isinstance(pl, Replicate)):
            raise ValueError(f"{who}: param {name} has placement {type(pl).__name__} ({pl}); only Shard(d), "
                             "_StridedShard and Replicate() are supported (reduce Partial tensors first)")
    items: list[tuple[str, Any]] = [("grad", grad), *state.items()]
    for key, t in items:
        if not isinstance(t, Tensor) or (t.dim() == 0 and not is_dtensor(t)):
            continue  # per-tensor scalars (step, LAMB16's scales) are plain tensors, equal on every rank
        dt: Any = t  # (a DTensor's attributes)
        if not is_dtensor(dt) or not same_mesh(dt.device_mesh, p.device_mesh) or dt.placements != p.placements:
            what = _describe(t) if is_dtensor(t) else "plain tensor"
            raise ValueError(f"{who}: {key} of param {name} is a {what} but the param is a {_describe(p)}; "
                             "param, grad and optimizer state must be sharded alike")
    return Sharding(p.device_mesh, tuple(i for i, pl in enumerate(p.placements) if _is_shard(pl)))


def _is_shard(placement: Any) -> bool:
    """A placement that splits the tensor's elements among the ranks of its mesh dimension:
    ``Shard(d)``, or ``_StridedShard`` (not a subclass of ``Shard``)."""
    from torch.distributed.tensor import Shard

    return isinstance(placement, (Shard, _private.strided_shard()))


def same_mesh(a: Any, b: Any) -> bool:
    return a is b or a == b  # (DeviceMesh.__eq__ compares the rank layouts: skip it for the same object)


def local(t: Any) -> Tensor:
    """The local shard of a DTensor (the tensor itself otherwise); in-place
    updates of it update the DTensor."""
    return t.to_local() if is_dtensor(t) else t


def all_reduce_sum(t: Tensor, sharding: Any) -> Tensor:
    """``t`` summed across the ranks that hold shards of the same tensors (``sharding``: a
    :class:`Sharding`, or the pieces of flat partitions, ``_deepspeed.Pieces``)."""
    if sharding is not None and not isinstance(sharding, Sharding):
        return sharding.all_reduce_sum(t)
    if sharding is not None:
        funcol = _private.functional_collectives()
        for d in sharding.dims:
            t = _done(funcol.all_reduce(t, "sum", (sharding.mesh, d)))
    return t


def sums_alike(a: Any, b: Any) -> bool:
    """Whether :func:`all_reduce_sum` over ``a`` and over ``b`` is one collective: the same
    sharding, or pieces of flat partitions of one process group (``_deepspeed.Pieces``; a
    partition's whole and cut pieces), so that their sums can be added before it."""
    if a is b:
        return True
    pieces = a is not None and b is not None and not isinstance(a, Sharding) and not isinstance(b, Sharding)
    return pieces and a.group is b.group


def _all_gather(t: Tensor, dim: int, group: Any) -> Tensor:
    funcol = _private.functional_collectives()
    # (all_gather_single is all_gather_tensor's new name; older torch has only the old one)
    return (getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor)(t, dim, group)


def _done(t: Tensor) -> Tensor:
    """A functional collective's result as a plain tensor. Eagerly it is an
    AsyncCollectiveTensor, whose Python dispatch would cost every op that reads it;
    traced, it is a plain tensor already (the graph holds the wait)."""
    funcol = _private.functional_collectives()
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def combine(partials: Tensor, combines: Sequence[str], sharding: Any) -> Tensor:
    """Per-tensor partial reductions ``[n, k]`` of the local shards, combined over
    ``sharding``'s mesh dims column by column (``combines[j]``: "sum" or "max")
    into the full tensors' values: one collective per sharded mesh dimension."""
    if sharding is None:
        return partials
    if not isinstance(sharding, Sharding):  # (_deepspeed.Pieces)
        return sharding.combine(partials, list(combines))
    if all(c == "sum" for c in combines):
        return all_reduce_sum(partials, sharding)
    for d in sharding.dims:
        size = sharding.mesh.size(d)
        gathered = _done(_all_gather(partials, 0, (sharding.mesh, d))).view(size, *partials.shape)
        partials = torch.stack(
            [gathered[:, :, j].sum(0) if c == "sum" else gathered[:, :, j].amax(0) for j, c in enumerate(combines)],
            dim=1)
    return partials
