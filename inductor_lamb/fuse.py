"""``fuse_optimizer()``: run any optimizer's step on a few contiguous buffers.

Element-wise optimizers written per parameter (BertAdam-style classes, research
optimizers) cost hundreds of tiny kernel calls a step. Flattening the
parameters, grads and optimizer state of each (param group, device, dtype)
set into one buffer turns that into one call per buffer (Bagua's generic
fused optimizer). Layer-wise optimizers must not see the concatenation (their
norms would span layers: BaguaSys/bagua#335), so they keep stepping per
parameter, now over views of the flat buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from .optim._sharding import is_dtensor

__all__ = ["fuse_optimizer", "mark_layerwise", "is_layerwise"]


def mark_layerwise(optimizer_or_class: Any) -> Any:
    """Marks an optimizer (instance or class) as layer-wise: ``fuse_optimizer``
    then never steps it on a concatenation of parameters."""
    optimizer_or_class._inductor_lamb_layerwise = True
    return optimizer_or_class


def is_layerwise(optimizer: Optimizer) -> bool:
    from .optim._base import FusedOptimizer

    # Ours step per parameter tensor in one op call already; they need no shadow optimizer.
    return isinstance(optimizer, FusedOptimizer) or bool(getattr(optimizer, "_inductor_lamb_layerwise", False))


class _FlatRun:
    """Parameters that are views of one flat buffer, with a flat gradient buffer laid out alike.
    (Not an optimizer's ``Bucket``: a run is what ``fuse_optimizer`` flattens, of any optimizer.)"""

    def __init__(self, params: list[Tensor], flat: Tensor) -> None:
        self.params = params
        self.flat = flat
        self.offsets = []
        off = 0
        for p in params:
            self.offsets.append(off)
            off += p.numel()
        self.flat_grad = torch.zeros_like(flat)
        for i, p in enumerate(params):
            g = self._slot(self.flat_grad, i)
            if p.grad is not None:
                g.copy_(p.grad)
            p.grad = g

    def _slot(self, buf: Tensor, i: int) -> Tensor:
        p = self.params[i]
        return buf[self.offsets[i] : self.offsets[i] + p.numel()].view_as(p)

    def gather_grads(self, zero_missing: bool) -> None:
        """Puts every param's grad into the flat gradient (after zero_grad(set_to_none=True)
        backward creates fresh grad tensors) and points ``p.grad`` back at its slot."""
        for i, p in enumerate(self.params):
            slot = self._slot(self.flat_grad, i)
            g = p.grad
            if g is None:
                if zero_missing:
                    slot.zero_()
                    p.grad = slot
                continue
            if g.is_sparse:
                raise RuntimeError("fuse_optimizer: sparse gradients cannot be fused")
            if g.data_ptr() != slot.data_ptr() or g.stride() != slot.stride():
                slot.copy_(g)
                p.grad = slot

    def split(self, flat: Tensor) -> list[Tensor]:
        return [self._slot(flat, i) for i in range(len(self.params))]


def _check_fusable(params: list[Tensor]) -> None:
    spans = []
    for i, p in enumerate(params):
        if not p.is_leaf:
            raise RuntimeError(f"fuse_optimizer: parameter {i} is not a leaf tensor")
        if is_dtensor(p):
            # (flattening would need one buffer per mesh and placement, and FSDP2 already keeps
            # each module's shards in one flat buffer)
            raise RuntimeError(f"fuse_optimizer: parameter {i} is a DTensor; sharded (FSDP2 / DTensor) parameters "
                               "cannot be fused: step the optimizer itself (this package's optimizers handle DTensors)")
        if p.grad is not None and p.grad.is_sparse:
            raise RuntimeError(f"fuse_optimizer: parameter {i} has a sparse gradient; sparse gradients cannot be fused")
        if p.numel():  # the bytes this param's elements span
            extent = 1 + sum((n - 1) * st for n, st in zip(p.shape, p.stride()))
            spans.append((p.data_ptr(), p.data_ptr() + extent * p.element_size(), i))
    spans.sort()
    for (s0, e0, i0), (s1, _, i1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise RuntimeError(f"fuse_optimizer: parameters {i0} and {i1} share storage; they cannot be fused")


def _neighbour_runs(params: list[Tensor]) -> list[list[Tensor]]:
    """Runs of params that are contiguous and directly follow each other in one storage."""
    runs: list[list[Tensor]] = []
    for p in params:
        if runs:
            q = runs[-1][-1]
            if (
                p.is_contiguous() and q.is_contiguous()
                and p.untyped_storage().data_ptr() == q.untyped_storage().data_ptr()
                and p.data_ptr() == q.data_ptr() + q.numel() * q.element_size()
            ):
                runs[-1].append(p)
                continue
        runs.append([p])
    return runs


def _flat_view(run: list[Tensor]) -> Tensor:
    p0 = run[0]
    total = sum(p.numel() for p in run)
    if len(run) == 1 and p0.is_contiguous():
        return p0.detach().view(-1)
    return p0.detach().new_empty(0).set_(p0.untyped_storage(), p0.storage_offset(), (total,), (1,))


class _Fused:
    def __init__(self, optimizer: Optimizer, do_flatten: bool, piece_numel: int) -> None:
        self.opt = optimizer
        self.do_flatten = do_flatten
        self.piece_numel = piece_numel
        self.layerwise = is_layerwise(optimizer)
        self.cls_state_dict = type(optimizer).state_dict
        self.cls_load_state_dict = type(optimizer).load_state_dict
        self.cls_add_param_group = type(optimizer).add_param_group
        self.build()

    # ---- layout ----------------------------------------------------------------------

    def build(self) -> None:
        """(Re)builds the runs, and for element-wise optimizers the shadow optimizer
        over the flat buffers, keeping any existing per-parameter state."""
        self.runs: list[tuple[int, _FlatRun]] = []  # (group index, run)
        for gi, group in enumerate(self.opt.param_groups):
            _check_fusable(group["params"])
            keyed: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
            for p in group["params"]:
                keyed.setdefault((p.device, p.dtype), []).append(p)
            for (device, dtype), params in keyed.items():
                if self.do_flatten:
                    runs = [params]
                    flat = torch.empty(sum(p.numel() for p in params), device=device, dtype=dtype)
                    flats = [flat]
                    off = 0
                    for p in params:
                        flat[off : off + p.numel()].copy_(p.detach().reshape(-1))
                        with torch.no_grad():
                            p.data = flat[off : off + p.numel()].view_as(p)
                        off += p.numel()
                else:
                    runs = _neighbour_runs(params)
                    flats = [_flat_view(r) for r in runs]
                for run, flat in zip(runs, flats):
                    self.runs.append((gi, _FlatRun(run, flat)))
        self.shadow: Any = None if self.layerwise else self._make_shadow()  # (an optimizer of the same class)

    def _make_shadow(self) -> Optimizer:
        """The same optimizer class over cache-sized pieces of the flat buffers: one
        piece per call keeps its temporaries in cache (one giant buffer is slower
        than the per-parameter loop it replaces), while the call count drops from
        one per parameter to one per ``piece_numel`` elements."""
        groups: dict[int, list[Tensor]] = {}
        self.pieces: list[tuple[int, int, Tensor]] = []  # (run index, start, shadow param)
        for bi, (gi, b) in enumerate(self.runs):
            n = b.flat.numel()
            for start in range(0, max(n, 1), self.piece_numel):
                end = min(n, start + self.piece_numel)
                sp = torch.nn.Parameter(b.flat[start:end], requires_grad=True)
                sp.grad = b.flat_grad[start:end]
                self.pieces.append((bi, start, sp))
                groups.setdefault(gi, []).append(sp)
        hyper = [{k: v for k, v in self.opt.param_groups[gi].items() if k not in ("params", "param_names")}
                 for gi in groups]
        self.shadow_groups = list(groups)  # original group index of each shadow group
        cls: Any = type(self.opt)
        shadow_groups = [{**h, "params": ps} for h, ps in zip(hyper, groups.values())]
        try:
            shadow = cls(shadow_groups, **self.opt.defaults)
        except TypeError:
            shadow = cls(shadow_groups)
        self._push_state(shadow)
        return shadow

    # ---- state: per-parameter (the optimizer's own format) <-> flat (the shadow's) ---

    def _push_state(self, shadow: Optimizer) -> None:
        """Per-parameter state of the wrapped optimizer -> state of the shadow's pieces."""
        flat_states = []
        for _, b in self.runs:
            states = [self.opt.state.get(p, {}) for p in b.params]
            flat_state = {}
            if states and states[0]:
                for key, v0 in states[0].items():
                    per_element = key != "step" and all(
                        isinstance(s.get(key), Tensor) and s[key].shape == p.shape for s, p in zip(states, b.params)
                    )
                    flat_state[key] = (torch.cat([s[key].reshape(-1).to(v0.dtype) for s in states]), True) \
                        if per_element else (v0, False)
            flat_states.append(flat_state)
        for bi, start, sp in self.pieces:
            if flat_states[bi]:
                shadow.state[sp] = {
                    k: v[start : start + sp.numel()].clone() if per_element else (v.clone() if isinstance(v, Tensor) else v)
                    for k, (v, per_element) in flat_states[bi].items()
                }

    def _pull_state(self) -> None:
        """State of the shadow's pieces -> per-parameter state (copies, as unfused would hold)."""
        for bi, (_, b) in enumerate(self.runs):
            pieces = [sp for pbi, _, sp in self.pieces if pbi == bi]
            states = [self.shadow.state.get(sp) for sp in pieces]
            if not states or not all(states):
                continue
            flat_state = {}
            for key, v in states[0].items():
                per_element = key != "step" and all(
                    isinstance(s.get(key), Tensor) and s[key].shape == sp.shape for s, sp in zip(states, pieces)
                )
                flat_state[key] = (torch.cat([s[key] for s in states]), True) if per_element else (v, False)
            for i, p in enumerate(b.params):
                self.opt.state[p] = {
                    k: b.split(v)[i].clone() if per_element else (v.clone() if isinstance(v, Tensor) else v)
                    for k, (v, per_element) in flat_state.items()
                }

    # ---- the wrapped optimizer's API -------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for _, b in self.runs:
            b.gather_grads(zero_missing=not self.layerwise)
        if self.layerwise:
            self.opt.step()
            return loss
        for gi, sg in zip(self.shadow_groups, self.shadow.param_groups):
            for k, v in self.opt.param_groups[gi].items():  # schedulers change the original groups
                if k not in ("params", "param_names"):
                    sg[k] = v
        self.shadow.step()
        return loss

    def state_dict(self) -> dict[str, Any]:
        if not self.layerwise:
            self._pull_state()
        return self.cls_state_dict(self.opt)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.cls_load_state_dict(self.opt, state_dict)
        if not self.layerwise:
            self.shadow = self._make_shadow()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if not self.layerwise:
            self._pull_state()
        self.cls_add_param_group(self.opt, param_group)
        self.build()


def fuse_optimizer(optimizer: Optimizer, do_flatten: bool = True, piece_numel: int = 1 << 16) -> Optimizer:
    """Makes ``optimizer`` step on contiguous buffers; returns it, with ``fuse_step``.

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        do_flatten: copy the parameters of each (param group, device, dtype) set
            into one new buffer and make them views of it (the module keeps working);
            if False, only parameters that already follow each other in memory are
            grouped.
        piece_numel: element-wise optimizers step the flat buffers in pieces of at
            most this many elements, so their temporaries stay in cache.

    After fusing, call ``optimizer.fuse_step(closure=None)`` instead of ``step``.
    Grads are laid out in a flat buffer too; after ``zero_grad(set_to_none=True)``
    the next ``fuse_step`` moves the new grads back into it. Element-wise optimizers
    take one step per flat buffer (a parameter without a grad counts as a zero grad
    there); layer-wise ones (this package's optimizers, or any marked with
    ``mark_layerwise``) keep stepping per parameter with exact per-tensor norms.
    ``state_dict()`` has the unfused format, so checkpoints move freely between
    fused and unfused runs; ``load_state_dict`` and ``add_param_group`` work.

    Raises:
        RuntimeError: sparse gradients, parameters sharing storage, non-leaf or DTensor parameters.
    """
    if getattr(optimizer, "_inductor_lamb_fused", None) is not None:
        return optimizer
    if piece_numel < 1:
        raise ValueError(f"fuse_optimizer: piece_numel must be positive, got {piece_numel}")
    fused = _Fused(optimizer, do_flatten, piece_numel)
    target: Any = optimizer  # (these attributes are the fused optimizer's own)
    target._inductor_lamb_fused = fused
    target.fuse_step = fused.step
    target.state_dict = fused.state_dict
    target.load_state_dict = fused.load_state_dict
    target.add_param_group = fused.add_param_group
    return optimizer
