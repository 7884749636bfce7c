"""An eager step's op calls, built once per param group and reused while nothing they depend on
has changed.

Building a step's buckets is per-param Python (the state of each param, its lists, the op's
arguments by name); on many small params it took twice as long as the op calls themselves. A
:class:`GroupPlan` keeps, per bucket of a group, each op call's arguments in the order the op
takes them, and before every step checks, exactly, what they were built from:

- the group: the same param objects in the same order, and every other entry the same object
  (a hyper-parameter written into the group, a scheduler's tensor swapped for another, the
  ``max_tensors_per_call`` of the optimizer);
- each param: whether it has a grad, its dtype and device, and each grad a plain dense tensor
  (a sparse or DTensor grad takes another path, or its error): checked in C++ when the step's
  grads are bound to the prepared calls;
- the state: each param's state dict and every tensor in it the same objects
  (``load_state_dict``, a tensor replaced by hand, state made for a param that gained its
  first grad).

Any of these changing rebuilds the plan from scratch (the same code as an unplanned step), so a
planned step is the unplanned one, bit for bit. Per step it re-reads the grads (an engine or
``zero_grad(set_to_none=True)`` replaces them) and the per-step values (GradScaler's scale and
inf flag, the clip factor) and runs the calls prepared on the C++ side
(``torch.classes.lamb.PreparedCalls``, csrc/common/prepared_calls.cpp): only the grads and those values
cross from Python, not every list of every call. The prepared calls go through the dispatcher
as any op call: the kernels' checks, version counters and grad-mode checks are as strict.
Groups of DTensor, sparse, float64 or engine-partitioned params are not planned. Eager steps
only: a compiled step reads the groups through ``_init_group`` under Dynamo's guards.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from itertools import chain
from typing import Any

import torch
from torch import Tensor

from .. import _private, ops
from ._buckets import bucket_call
from ._layout import Stepped
from ._scheduled import follows

__all__ = ["GroupPlan"]

# (C-level maps and comparisons: a planned step's checks cost tens of nanoseconds a param)
_is = operator.is_
_grad = operator.attrgetter("grad")
_values = dict.values


def _plain(p: Tensor) -> bool:
    """A param and its grad are plain strided tensors, as the prepared calls take them (no tensor
    subclass or fake tensor: the Python dispatch key; a step under ``FakeTensorMode`` is a trace,
    not a step to repeat)."""
    return all(t is None or (t.layout == torch.strided and not _private.dispatch_keys(t).has(_private.PYTHON_KEY))
               for t in (p, p.grad))




def _picker(at: list[int]) -> Callable[[list[Any]], list[Any]]:
    """The entries ``at`` of a list, as a C-level slice where they follow each other."""
    if at and at == list(range(at[0], at[0] + len(at))):
        return operator.itemgetter(slice(at[0], at[0] + len(at)))
    return lambda values: [values[i] for i in at]


class GroupPlan:
    """One param group's buckets (as ``_buckets.group_buckets`` made them) and op calls."""

    __slots__ = ("params", "keys", "values", "tensors_per_call", "mask", "state", "state_count", "state_at",
                 "states", "state_lens", "state_tensors", "buckets", "grads_of", "prepared")

    def __init__(self, opt: Stepped, group: dict[str, Any], buckets: dict[tuple[Any, ...], Any]) -> None:
        params = group["params"]
        self.params = list(params)
        self.keys = tuple(k for k in group if k != "params")
        self.values = tuple(group[k] for k in self.keys)
        self.tensors_per_call = opt.max_tensors_per_call
        grads = list(map(_grad, params))
        self.mask = [g is not None for g in grads]
        # The state dicts of the group's params, found by position in the optimizer's state (its
        # values in order: no hashing of a param per step), and every tensor in them.
        self.state, self.state_count = opt.state, len(opt.state)
        everything = list(opt.state.values())
        position = {id(s): i for i, s in enumerate(everything)}
        mine = [opt.state[p] for p in params if p in opt.state]
        at = [position[id(s)] for s in mine]
        self.state_at: Callable[[list[Any]], list[Any]] = _picker(at)
        self.states = mine
        self.state_lens = list(map(len, mine))
        self.state_tensors = list(chain.from_iterable(map(_values, mine)))
        self.buckets = buckets
        index = {id(p): i for i, p in enumerate(params)}
        # The op calls, prepared on the C++ side, which keeps their arguments as the dispatcher
        # takes them (csrc/common/prepared_calls.cpp): per step only the grads and the per-step values
        # cross. Every call's C++ checks run first: bad input raises before any op of any group
        # writes anything.
        self.prepared = torch.classes.lamb.PreparedCalls(self.params, self.mask)
        self.grads_of: list[Callable[[list[Tensor]], list[Tensor]]] = []  # per bucket, among the group's
        for k, bucket in enumerate(buckets.values()):
            at = [index[id(p)] for p in bucket.params]
            self.grads_of.append(_picker(at))
            op, args, slots = bucket_call(opt, group, bucket)
            ops.run_checks(op, *args)
            self.prepared.add_call(str(op._schema.name), [None if a == [] else a for a in args], at, k,
                                   slots["grads"], slots.get("grad_scale", -1), slots.get("found_inf", -1),
                                   slots.get("max_grad_norm", -1))
        if not self.prepared.bind(grads):
            raise RuntimeError(f"{type(opt).__name__}: a new step plan does not hold for its own grads")

    @staticmethod
    def plannable(opt: Stepped, group: dict[str, Any], buckets: dict[tuple[Any, ...], Any]) -> bool:
        """Whether a group's buckets can be planned: the group's own params (not an engine's
        pieces of them), plain tensors of the ops' dtypes, and scheduled tensors the ops take
        as they are (a call prepared with a converted copy would not follow the original)."""
        own = {id(p) for p in group["params"]}
        scheduled = [t for key in opt._layout.scheduled if key in group
                     for t in (group[key] if isinstance(group[key], tuple) else (group[key],))]
        return all(b.sharding is None and not b.sparse and b.params
                   and b.params[0].dtype != torch.float64 and all(id(p) in own for p in b.params)
                   and all(follows(t, b.device) for t in scheduled)
                   for b in buckets.values()) and all(map(_plain, group["params"]))


    def holds(self, opt: Stepped, group: dict[str, Any]) -> list[Tensor] | None:
        """The group's grads when the plan still holds for it, else None."""
        params = group["params"]
        if len(params) != len(self.params) or not all(map(_is, params, self.params)):
            return None
        if opt.max_tensors_per_call != self.tensors_per_call or len(group) != len(self.keys) + 1:
            return None
        try:
            if not all(map(_is, map(group.__getitem__, self.keys), self.values)):
                return None
        except KeyError:
            return None
        if opt.state is not self.state or len(opt.state) != self.state_count:
            return None
        states = self.state_at(list(opt.state.values()))
        if not all(map(_is, states, self.states)) or list(map(len, states)) != self.state_lens or \
                not all(map(_is, chain.from_iterable(map(_values, states)), self.state_tensors)):
            return None
        grads = list(map(_grad, params))
        if not self.prepared.bind(grads):  # (which have grads, dense and plain; dtypes, devices)
            return None
        return grads

    def refresh(self, grads: list[Tensor]) -> None:
        """This step's grads into the buckets (what clipping across buckets reads)."""
        for bucket, grads_of in zip(self.buckets.values(), self.grads_of):
            bucket.lists["grads"] = grads_of(grads)

    def run(self, per_bucket: list[tuple[Tensor | None, Tensor | None, float]]) -> None:
        """The prepared calls with the bound grads and each bucket's (grad_scale, found_inf,
        max_grad_norm), in bucket order."""
        grad_scales, found_infs, max_grad_norms = map(list, zip(*per_bucket))
        self.prepared.run(grad_scales, found_infs, max_grad_norms)

    def release(self) -> None:
        """Drops this step's grads (the plan must not keep a freed grad alive until the next step)."""
        for bucket in self.buckets.values():
            bucket.lists["grads"] = None
        self.prepared.bind([])  # (a list of the wrong length: binds nothing, drops what was bound)
