"""Which way an optimizer step goes: one decision, made here, from named conditions.

A step takes one of five routes (:class:`Route`), decided by :func:`route` from
:class:`Conditions` alone; ``FusedOptimizer``'s step wrapper asks once per call and follows
the answer. Within a route, each param group's buckets step the same way in all of them
(:func:`inductor_lamb.optim._buckets.bucket_kind`: one op call, sharded two phases, an
engine's pieces, sparse rows, float64 reference math).

======================  ===========================================================================
route                   when, and what runs
======================  ===========================================================================
``EAGER``               Not compiling. Each group's buckets and op calls come from its step plan
                        while the plan holds (``_plan``), else are built anew (same bits).
``IN_BACKWARD``         Not compiling, called by the autograd engine (:func:`~inductor_lamb.step_in_backward`)
                        for a batch of params whose grads are final: the batch's params only, as
                        sub-groups of their param groups (each sub-group's op calls planned as a
                        group's are), and their grads freed after the step.
``EAGER_UNDER_COMPILE`` Dynamo traces the step, every param is a plain CPU tensor, the compile
                        allows graph breaks (no ``fullgraph=True``) and no backward is traced into
                        the graph: the step graph-breaks and runs as ``EAGER``. Nothing is left to
                        fuse (the grads are graph inputs; the kernels already make one pass a
                        bucket), while a traced step pays Dynamo's guards and Inductor's input
                        checks on every tensor. torch's fused CPU optimizers do the same
                        (``torch._disable_dynamo``). Sound whatever surrounds the call: the graph
                        before the step is run, and what follows it is traced anew.
``TRACED``              Dynamo traces the step into the graph: CUDA params (CUDA graphs take the
                        step's tensors as static inputs), DTensor params (the collectives stay in
                        the graph), or ``fullgraph=True``. Buckets come from ``OpView._init_group``
                        (over the groups' views), which Dynamo runs eagerly under its own guards; the op calls are in the
                        graph, at most ``max_tensors_per_call`` params each.
``TRACED_WITH_BACKWARD`` Dynamo traces the step with ``trace_autograd_ops`` on and the route
                        would otherwise trace: a backward in the same graph may make the grads,
                        which Dynamo keeps as pending side effects that an eager ``_init_group``
                        cannot see, so the buckets are traced too (and the step records itself
                        in a tensor flag: :meth:`Route.records_in_graph`). A step in the backward
                        under compiled autograd takes it too: the hooks' batches are traced into
                        the backward graph, which made their grads.
======================  ===========================================================================

``torch.compile(opt.step)``, ``opt.step = torch.compile(opt.step)`` (GradScaler's ``step``
reaches it), and a compiled function that calls ``opt.step()`` (PyTorch's tutorials) all take
the same route for the same conditions: the decision never looks at which frame is compiled.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from .. import _private

__all__ = ["Route", "Conditions", "route", "conditions"]


class Route(enum.Enum):
    EAGER = "eager"
    IN_BACKWARD = "eager, inside the backward"
    EAGER_UNDER_COMPILE = "eager under torch.compile"
    TRACED = "traced"
    TRACED_WITH_BACKWARD = "traced with its backward"

    @property
    def eager(self) -> bool:
        """The step runs as eager code (its op calls are not in any graph)."""
        return self in (Route.EAGER, Route.IN_BACKWARD, Route.EAGER_UNDER_COMPILE)

    @property
    def records_in_graph(self) -> bool:
        """Whether the step records that it ran (``_opt_called``, what LR schedulers read) in a
        tensor flag written by the graph: a traced ``_init_group`` is the eager code a traced step
        otherwise runs, and a step traced with its backward has none."""
        return self is Route.TRACED_WITH_BACKWARD


@dataclass(frozen=True)
class Conditions:
    """What the route depends on, each named."""

    compiling: bool        # Dynamo is tracing the call
    fullgraph: bool        # ... in a frame that refuses graph breaks
    backward_traced: bool  # ... with trace_autograd_ops: the graph may compute the grads
    host_params: bool      # every param of the optimizer is a plain CPU tensor
    in_backward: bool = False  # the autograd engine's hooks step a batch of params (step_in_backward)


def route(c: Conditions) -> Route:
    """The route of a step taken under conditions ``c`` (the table above)."""
    if not c.compiling:
        return Route.IN_BACKWARD if c.in_backward else Route.EAGER
    if c.in_backward or c.backward_traced:
        return Route.TRACED_WITH_BACKWARD
    if c.host_params and not c.fullgraph:
        return Route.EAGER_UNDER_COMPILE
    return Route.TRACED


def conditions(host_params: bool, in_backward: bool = False) -> Conditions:
    """The conditions of a step being called now (traced code under Dynamo: everything but
    ``host_params`` is a constant of the compile, ``host_params`` an attribute guard)."""
    if not torch.compiler.is_compiling():
        return Conditions(False, False, False, host_params, in_backward)
    return Conditions(True, _private.compiling_fullgraph(), _private.backward_traced(), host_params, in_backward)
