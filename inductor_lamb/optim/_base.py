"""What every inductor_lamb optimizer shares: the param groups with their
scheduled hyper-parameters (lr, betas, momentum) as 0-d tensors (``_scheduled``),
state created with the params, GradScaler support and clipping, and a ``step``
that never graph-breaks. Bucketing and the op calls are in ``_buckets``, state
dicts and checkpoint compatibility in ``_checkpoint``.
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable, Hashable, Iterable
from itertools import chain
from typing import Any, ClassVar, TypedDict

import torch
from torch import Tensor
from torch.optim import Optimizer

from .. import _private, ops
from ..spec import Arg, Role
from . import _buckets, _deepspeed, _sharding
from ._checkpoint import CheckpointState, param_states
from ._layout import Bucket, Buckets, OpFamily, StateLayout
from ._model_tensors import ModelTensors
from ._plan import GroupPlan
from ._route import Route, conditions, route
from ._scheduled import (
    OpGroup,
    as_lr_tensor,
    check_betas,
    check_lr,
    check_momentum,
    check_nonnegative,
    check_seed,
    decoupled_decay_options,
    decoupled_decay_own_options,
    group_device,
    group_dtype,
    static_address,
)

__all__ = ["Bucket", "FusedOptimizer", "FusedOptions", "OpFamily", "OpGroup", "OpView", "as_lr_tensor", "check_betas", "check_lr",
           "check_momentum", "check_nonnegative", "check_seed", "decoupled_decay_options",
           "decoupled_decay_own_options"]

_LOW_PRECISION = (torch.bfloat16, torch.float16)
# Param dtypes the optimizers take: the ops' three, and float64, which steps
# through the float64 reference math (OpFamily).
_PARAM_DTYPES = (torch.float32, *_LOW_PRECISION, torch.float64)


# Argument docs the optimizers share, written once (as torch.optim shares its
# ``_foreach_doc``): a subclass docstring names each by its placeholder.
_SHARED_ARG_DOCS = {
    "{param_rounding_args}": """\
stochastic_rounding: write bfloat16/float16 params that have no master copy
            rounded stochastically (default): up or down with the probabilities that
            make the stored param right on average, so that updates below the
            format's spacing are not lost; ``False`` rounds them to nearest even.
        seed: seed of the rounding's random bits (any int); the same on every rank
            of a sharded run.""",
    "{unscale_in_step_arg}": """\
unscale_in_step: GradScaler unscales the grads inside the step (see
            :class:`~inductor_lamb.optim._base.FusedOptimizer`; off: it unscales first).""",
}


# A sub-group's key: the places of a batch's params in their param group (_step_batch); at most
# this many batches' plans are kept (a backward's batches repeat; hooks that fire in another
# order each time would make new ones).
_BATCH = "_in_backward_batch"
_MAX_BATCH_PLANS = 1024

_VALIDATORS: dict[str, Callable[[Any], None]] = {"lr": check_lr, "betas": check_betas, "momentum": check_momentum}


def _host_param(p: Tensor) -> bool:
    """A plain CPU tensor (what a compiled ``opt.step`` may run eagerly: _route)."""
    return type(p) in (Tensor, torch.nn.Parameter) and p.device.type == "cpu"


class FusedOptions(TypedDict, total=False):
    """The keyword-only options every optimizer takes, passed through to
    :class:`FusedOptimizer` (documented in each optimizer's docstring)."""

    master_weights: bool
    stochastic_rounding: bool
    seed: int
    unscale_in_step: bool


class FusedOptimizer(CheckpointState):
    """Base of the optimizers whose step is one ``torch.ops.lamb`` call per
    (device, dtype, sharding) bucket of each param group (a traced step: per chunk of
    ``max_tensors_per_call`` params of a bigger bucket).

    Subclasses set ``_ops``, their op functions (:class:`~._buckets.OpFamily`), and ``_state_keys``
    (state tensors created like the param), optionally ``_scalar_state_keys``
    (0-d float32 per-param state, e.g. LAMB16's scales) and ``_state_fill``.
    The op call is derived from the spec: its state lists are the state keys in
    order (``steps`` last among the per-tensor scalars), its state dtypes are
    the spec's, and each hyper-parameter is the param group's entry of the same
    name (``betas``: ``beta1``, ``beta2``), unless ``_hypers`` says otherwise.

    DTensor params (FSDP2, HSDP, tensor parallel) step on their local shards
    with exact per-tensor norms: :mod:`._sharding`.

    ``unscale_in_step=True`` lets ``torch.amp.GradScaler`` hand its scale and inf
    flag to ``step`` (``grad_scale`` / ``found_inf`` attributes, like torch's fused
    Adam), which unscales inside the kernels: no separate pass over the grads and
    no host sync. Off by default: GradScaler then unscales first (``unscale_``),
    which gradient clipping by Lightning, HF ``Trainer`` or ``clip_grad_norm_``
    needs; Lightning refuses to clip for an optimizer that unscales itself.
    """

    # Params per op call of a step traced into a graph: a bucket with more takes several
    # calls. Why: Inductor's post-grad pass (decompose_auto_functionalized) is quadratic in
    # the tensors one mutating call writes (docs/decisions.md, "Compile time"). Eager steps
    # (the eager routes of _route) call each op once per bucket. Clipping inside the op is for
    # groups of one bucket of at most this many params, in both: the same bits.
    max_tensors_per_call: int = 32
    # Clip by the grads of every param group together, at ``defaults["max_grad_norm"]`` (timm's
    # and apex's LAMB), instead of each group by its own grads and ``max_grad_norm``.
    _clip_spans_groups: bool = False

    # What a subclass declares (CONTRIBUTING, "Adding an op"): its op functions and the keys of
    # its state, in the order of the op's state lists; everything else of the op call is derived
    # from the op's description into the class's ``_layout``.
    _ops: OpFamily
    _state_keys: tuple[str, ...] = ()
    _scalar_state_keys: tuple[str, ...] = ()
    # the group keys the optimizer reads itself (no op argument), converted and checked as the op's
    # options are: a group value of another type is refused by name, never a torch error
    _own_options: ClassVar[dict[str, Arg]] = {"master_weights": Arg("master_weights", Role.BOOL)}
    _layout: ClassVar[StateLayout]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__doc__:  # None under python -OO
            for placeholder, text in _SHARED_ARG_DOCS.items():
                cls.__doc__ = cls.__doc__.replace(placeholder, text)
        family = cls.__dict__.get("_ops")
        if family is not None:
            cls._layout = StateLayout.of(family, cls._state_keys, cls._scalar_state_keys, _VALIDATORS, cls.__name__,
                                         cls._own_options)

    _copied_attributes: tuple[str, ...] = ("_step_supports_amp_scaling", "_stepped", "_stepped_in_graph", "_model",
                          "max_tensors_per_call")

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], *, master_weights: bool = False,
                 stochastic_rounding: bool = True, seed: int = 0, unscale_in_step: bool = False) -> None:
        """``defaults``: the optimizer's own hyper-parameters; the options every optimizer
        shares (master copies, param rounding, GradScaler mode) are added here."""
        as_lr_tensor(defaults["lr"])  # validates
        defaults = {**defaults, "master_weights": master_weights, "stochastic_rounding": bool(stochastic_rounding),
                    "seed": check_seed(seed)}
        # (what GradScaler and Lightning read: see the class docstring)
        self._step_supports_amp_scaling = bool(unscale_in_step)
        # Whether step() ran, for LR schedulers' ``_opt_called`` (see there).
        self._stepped = False
        self._stepped_in_graph: Tensor | None = None  # (made with the first group, on its device)
        self._model = ModelTensors()  # every param given, in order (what engines map back to)
        self._host_params = True  # every param a plain CPU tensor (_route)
        self._plans: dict[Hashable, GroupPlan | None] = {}  # per param group index, or batch (_plan)
        self._batch_views: dict[Hashable, dict[str, Any]] = {}  # a batch in the backward's sub-group
        self._in_backward: Any = None  # the handle of step_in_backward (_in_backward)
        self._op_groups: list[OpGroup] = []  # per param group, the group as the ops take it
        self._op_view = OpView(self)  # those views, for a traced step (see OpView)
        super().__init__(params, defaults)

    def __getstate__(self) -> dict[str, Any]:
        out = super().__getstate__()
        if self._in_backward is not None:  # (a copy steps after its backward: the user's GradScaler mode)
            out["_copied"]["_step_supports_amp_scaling"] = self._in_backward._scaling
        return out

    def _rebuild(self) -> None:
        self._plans = {}
        self._batch_views = {}
        # (load_state_dict comes here too, and keeps its handle; a copy has none: hooks are not copied)
        self._in_backward = self.__dict__.get("_in_backward")
        self._op_groups = []
        self._op_view = OpView(self)
        self._sync_views()
        if not isinstance(self.__dict__.get("_model"), ModelTensors):  # (pickled before 0.4)
            self._model = ModelTensors()
            for g in self.param_groups:
                self._model.add(g["params"], g.get("param_names"))
        self._model.reindex()
        self._host_params = all(_host_param(p) for g in self.param_groups for p in g["params"])

    # ---- param groups and state -------------------------------------------------

    # ``param_groups`` is torch.optim's plain list of the groups as written (what users,
    # schedulers and frameworks read and write); every step reads each group's OpGroup view.

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if self._stepped_in_graph is None:  # (on the params' device: see _opt_called)
            self._stepped_in_graph = static_address(torch.zeros((), dtype=torch.bool, device=group_device(group)))
        self._sync_views()  # (a bad value raises now, naming the group)
        _deepspeed.check_model_params(self, group["params"])
        self._model.add(group["params"], group.get("param_names"))
        self._host_params = self._host_params and all(map(_host_param, group["params"]))
        for p in group["params"]:
            if p.dtype not in _PARAM_DTYPES:
                raise TypeError(
                    f"{type(self).__name__} supports float32, float64, bfloat16 and float16 params, got {p.dtype}"
                )
        # State is created now rather than at the first step (as torch.optim does): a
        # compiled training step then sees the same state from its first call and
        # compiles once. Master copies stay lazy (they copy the param's value, which
        # may still be loaded after the optimizer is built).
        for p in group["params"]:
            if p.requires_grad:
                self._init_state(p, group, master=False)

    def _sync_views(self, strict: bool = True) -> list[dict[str, Any]]:
        """Every param group's view (:class:`OpGroup`), synced with what was written into the
        groups; a group that is not the one a view was made from (``param_groups`` replaced or
        edited as a list) gets a new view. ``strict=False``: see :meth:`OpGroup.sync`."""
        groups, ops = self.param_groups, self._op_groups
        if len(ops) != len(groups) or not all(map(operator.is_, (o.group for o in ops), groups)):
            self._op_groups = ops = [ops[i] if i < len(ops) and ops[i].group is g else self._op_group(g, i, strict)
                               for i, g in enumerate(groups)]
            self._op_view.views[:] = [o.view for o in ops]
        for i, op in enumerate(ops):
            op.sync(self._where(i), strict)
        return self._op_view.views

    def _op_group(self, group: dict[str, Any], index: int, strict: bool) -> OpGroup:
        layout = self._layout
        return OpGroup(group, self.defaults, layout.scheduled, layout.options, group_device(group), group_dtype(group),
                       self._where(index), strict)

    def _where(self, index: int) -> str:
        """How an error names param group ``index``."""
        return f"{type(self).__name__}: param_groups[{index}]"

    def _init_state(self, p: Tensor, group: dict[str, Any], master: bool = True) -> dict[str, Any]:
        state = self.state[p]
        layout = self._layout
        if len(state) == 0:
            # step on the param's device, as the op reads it there (no host sync on GPU)
            if layout.has_step:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            for key in layout.state_keys:
                state[key] = torch.full_like(
                    p, self._state_fill(key, group), dtype=layout.state_dtype(key, p.dtype),
                    memory_format=torch.preserve_format,
                )
            for key in layout.scalar_state_keys:
                state[key] = torch.full((), self._state_fill(key, group), dtype=torch.float32, device=p.device)
        if master and "master_param" not in state and group.get("master_weights", False) and p.dtype in _LOW_PRECISION:
            state["master_param"] = p.detach().to(torch.float32, memory_format=torch.preserve_format)
        if not torch.compiler.is_compiling():
            for t in state.values():
                static_address(t)
        return state

    def _state_fill(self, key: str, group: dict[str, Any]) -> float:
        """Initial value of state tensor ``key``."""
        return 0.0

    def state_bytes_per_param(self) -> float:
        """Bytes of optimizer state (every tensor in ``self.state``: moments,
        scales, steps, master copies) per optimized parameter element; 0.0 when
        no state exists yet."""
        nbytes = numel = 0
        for p, state in param_states(self.state):
            numel += p.numel()
            nbytes += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, Tensor))
        return nbytes / numel if numel else 0.0

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Resets the gradients of all optimized tensors, like
        ``torch.optim.Optimizer.zero_grad``; unlike it (``@torch._disable_dynamo``)
        dynamo can trace it, so a whole training step compiles as one graph (traced, it reads the
        groups' views, whose params are the groups' own lists: see OpView)."""
        if self._in_backward is not None:
            self._in_backward.boundary(self)
        for group in self._op_view.param_groups if torch.compiler.is_compiling() else self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    # ---- step ----------------------------------------------------------------------

    def _route(self) -> Route:
        """The route of a step called now (:mod:`._route`: the one decision)."""
        return route(conditions(self._host_params))

    @staticmethod
    def profile_hook_step(func: Callable[..., Any]) -> Callable[..., Any]:
        """torch.optim's wrapper of ``step`` (step hooks inside a profiler range), following the
        step's route (:mod:`._route`): an eager step runs it as torch.optim does; a step that
        runs eagerly under ``torch.compile`` runs it behind a graph break; a traced step runs
        the hooks without the range (Dynamo drops a profiler range in a graph with a warning on
        the first compile, which every compiled training step would print; a profiler still
        sees the compiled graph's own)."""
        hooked = Optimizer.profile_hook_step(func)
        # (Dynamo is imported by its first call, which only a compile makes)
        eagerly = _private.disable_dynamo(hooked)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self = args[0]
            way = self._route()
            if way is Route.EAGER:
                return hooked(*args, **kwargs)
            if way is Route.EAGER_UNDER_COMPILE:
                return eagerly(*args, **kwargs)
            global_pre, global_post = _private.global_step_hooks()
            for pre_hook in chain(global_pre.values(), self._optimizer_step_pre_hooks.values()):
                result = pre_hook(self, args, kwargs)
                if result is not None:
                    args, kwargs = result
            out = func(*args, **kwargs)
            for post_hook in chain(self._optimizer_step_post_hooks.values(), global_post.values()):
                post_hook(self, args, kwargs)
            return out

        return wrapper

    def _amp_args(self, device: torch.device) -> tuple[Tensor | None, Tensor | None]:
        """grad_scale / found_inf set by torch.amp.GradScaler for this step, on ``device``."""
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if grad_scale is not None:
            grad_scale = grad_scale.to(device=device, dtype=torch.float32, non_blocking=True)
        if found_inf is not None:
            found_inf = found_inf.to(device=device, dtype=torch.float32, non_blocking=True)
        return grad_scale, found_inf

    def state_dict(self) -> dict[str, Any]:
        _deepspeed.release_replaced_state(self)  # (an engine may save before the first step)
        return super().state_dict()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Performs a single optimization step.

        Args:
            closure: a closure that re-evaluates the model and returns the loss.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        way = self._route()
        if self._in_backward is not None:
            self._in_backward.boundary(self)  # (what stepped in the backward: its checks)
        self._record_step(way)
        self._step_groups(way, [(i, i, group) for i, group in enumerate(self._step_views(way))])
        return loss

    def _step_groups(self, way: Route, groups: list[tuple[int, Hashable, dict[str, Any]]]) -> None:
        """The op calls of ``groups``: (param group index, plan key, the group as the ops take it:
        a whole group's view, or a batch of its params in the backward)."""
        # Every bucket of every group first: bad input raises before any tensor is touched.
        stepped = [(group, *self._buckets_of(group, index, key, way)) for index, key, group in groups]
        # (GradScaler's found_inf is already the same on every rank with DTensor grads: DTensor
        # maxes it across the mesh when checking the grads, found_inf_reduce_handler)
        try:
            spanning = None  # the clip factor of every group's grads together (_clip_spans_groups)
            if self._clip_spans_groups and float(self.defaults.get("max_grad_norm") or 0.0) > 0:
                every = [b for _, buckets, _ in stepped for b in buckets.values()]
                if every:
                    spanning = self._clip_factor(every, float(self.defaults["max_grad_norm"]))
            for group, buckets, plan in stepped:
                if not buckets:  # a frozen group, or no grads in this step: nothing to do (as torch.optim)
                    continue
                # Clipping by the group's global grad norm: the op does it when the
                # group is one unsharded bucket; otherwise the clip folds into grad_scale.
                max_norm = 0.0 if self._clip_spans_groups else float(group.get("max_grad_norm", 0.0))
                only = next(iter(buckets.values()))
                whole = len(buckets) == 1 and only.sharding is None and len(only.params) <= self.max_tensors_per_call
                clip = self._clip_factor(buckets.values(), max_norm) if max_norm > 0 and not whole else spanning
                per_bucket = []
                for bucket in buckets.values():
                    device = bucket.device
                    grad_scale, found_inf = self._amp_args(device)
                    if clip is not None:
                        clip_d = clip.to(device)
                        grad_scale = clip_d if grad_scale is None else grad_scale * clip_d
                    mgn = max_norm if clip is None else 0.0
                    if plan is None:
                        _buckets.step_bucket(self, group, bucket, grad_scale, found_inf, mgn)
                    else:
                        per_bucket.append((grad_scale, found_inf, mgn))
                if plan is not None:  # (the prepared calls, in bucket order: see _plan)
                    plan.run(per_bucket)
        finally:
            for _, _, plan in stepped:
                if plan is not None:
                    plan.release()

    def _step_views(self, way: Route) -> list[dict[str, Any]]:
        """The param groups as this step's ops take them, with what was written into the groups
        taken (checked first: a bad value raises here, naming the group and key, on every
        route). A traced step reads them through :class:`OpView`, whose guards synced them."""
        if way.eager:
            return self._sync_views()
        views = self._op_view.param_groups
        if way is Route.TRACED_WITH_BACKWARD or not _private.compiling_fullgraph():
            # (raised in traced code: Dynamo breaks the graph and the eager step raises it; under
            # fullgraph=True it wraps it. A traced step's OpView._init_group raises it first.)
            for op in self._op_groups:
                op.check()
        return views

    def _buckets_of(self, group: dict[str, Any], index: int, key: Hashable, way: Route
                    ) -> tuple[Buckets, GroupPlan | None]:
        """The buckets of ``group`` (of param group ``index``) on route ``way``, and their op calls
        when it is planned under ``key`` (an eager step of plain params: :mod:`._plan`)."""
        batch = group.get(_BATCH)  # (a batch in the backward: its params' places in the group)
        if not way.eager:
            if way is Route.TRACED_WITH_BACKWARD:
                # A backward traced into the same graph sets the grads as pending side effects,
                # which an eager _init_group cannot see: Dynamo refuses it ("pending mutation on
                # parameter"), so the buckets are traced.
                return _buckets.make_buckets(self, group, index, at=batch), None
            return _buckets.group_buckets(self, group, index), None
        plan = self._plans.get(key)
        grads = plan.holds(self, group) if plan is not None else None
        if plan is not None and grads is not None:
            plan.refresh(grads)
            return plan.buckets, plan
        buckets = _deepspeed.flat_buckets(self, group)  # (a group of an engine's flat partitions)
        if buckets is None:
            buckets = (_buckets.group_buckets(self, group, index) if batch is None
                       else _buckets.make_buckets(self, group, index, at=batch))
        plan = GroupPlan(self, group, buckets) if GroupPlan.plannable(self, group, buckets) else None
        self._plans[key] = plan
        return buckets, plan

    def _step_batch(self, batch: dict[int, list[int]], params: list[Tensor] | None = None) -> None:
        """Steps a batch of params whose grads the backward has made (param group index: the
        params' places in the group, in order), then frees their grads: what
        :func:`~inductor_lamb.step_in_backward`'s hooks call (:mod:`._in_backward`). Each group's
        share steps as a sub-group of the group's view, with the same values, so with the same
        bits as a whole step (the ops' math and rounding are per tensor); its op calls are
        planned under the batch's places, which the next backward repeats. ``params``: the batch's
        params as given (one group's; a traced hook's, which are graph inputs)."""
        way = route(conditions(self._host_params, in_backward=True))
        self._record_step(way)
        views = self._step_views(way)
        groups: list[tuple[int, Hashable, dict[str, Any]]] = []
        for index, at in batch.items():
            view = views[index]
            key = (index, tuple(at))
            # (reused while the view's values are the same objects, the plan's check of the group;
            # a traced step, whose buckets are traced, makes it anew)
            sub = self._batch_views.get(key) if way.eager else None
            if sub is None or len(sub) != len(view) + 1 or \
                    not all(sub[k] is v for k, v in view.items() if k not in ("params", "param_names")):
                group_params, names = view["params"], view.get("param_names")
                sub = {**view, "params": params if params is not None else [group_params[i] for i in at],
                       _BATCH: list(at)}
                if names:
                    sub["param_names"] = [names[i] for i in at]
                if way.eager:
                    if len(self._batch_views) >= _MAX_BATCH_PLANS:  # (batches that vary: keep the newest)
                        for old in [k for k in self._plans if isinstance(k, tuple)]:
                            del self._plans[old]
                        self._batch_views.clear()
                    self._batch_views[key] = sub
            groups.append((index, key, sub))
        self._step_groups(way, groups)  # (raising, it leaves the grads: opt.step() may still step them)
        for _, _, sub in groups:
            for p in sub["params"]:
                p.grad = None

    def _record_step(self, way: Route) -> None:
        """Records that a step ran, for LR schedulers' ``_opt_called`` (read once, eagerly, on a
        scheduler's first step).

        LR schedulers wrap ``opt.step`` in a function of lr_scheduler.py only to set
        ``_opt_called``; Dynamo refuses to trace that file, so a fullgraph compile of a training
        step would fail. ``step._wrapped_by_lr_sched`` tells schedulers to leave our step
        unwrapped, and ``_opt_called`` is derived instead, one way per route: an eager step sets
        ``_stepped`` here; a traced step sets it in ``_init_group``, which Dynamo runs eagerly
        (it drops attribute writes on optimizers inside compiled code); a step traced with its
        backward, which runs no eager code, writes a tensor flag in the graph. Only there: a
        tensor written in every compiled step would be one more generated kernel, a large part of
        a cold compile (docs/decisions.md, "No counter kernel in a compiled step"). The flag lives
        on the params' device, a static address (a CPU tensor written in a CUDA step makes Inductor skip CUDA
        graphs), and is read back (one sync) only when a scheduler finds no eager record."""
        if way.eager:
            self._stepped = True
        elif way.records_in_graph and self._stepped_in_graph is not None:
            self._stepped_in_graph.fill_(True)

    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]

    @property
    def _opt_called(self) -> bool:
        # Read by LR schedulers once, on their first step (eagerly).
        return self._stepped or bool(self._stepped_in_graph)

    @_opt_called.setter
    def _opt_called(self, value: bool) -> None:
        pass  # derived from the state, see above

    # ---- buckets (the functions of _buckets; the hooks an optimizer may change) -------------

    def _hypers(self, group: dict[str, Any], bucket: Bucket) -> dict[str, Any]:
        """The op's hyper-parameters for one bucket (:func:`._buckets.hypers`; LARS adds its
        per-param options)."""
        return _buckets.hypers(self, group, bucket)

    def _check_sparse(self, p: Tensor, group: dict[str, Any], name: str) -> None:
        """Raises unless this optimizer steps param ``name`` with its sparse grad
        (``_step_sparse``); checked with every other argument, before any step."""
        raise RuntimeError(f"{type(self).__name__} does not support sparse gradients (param {name})")

    def _step_sparse(self, group: dict[str, Any], bucket: Bucket, grad_scale: Tensor | None,
                     found_inf: Tensor | None) -> None:
        raise NotImplementedError

    def _clip_factor(self, buckets: Iterable[Bucket], max_norm: float) -> Tensor:
        """max(1, ||all grads / grad_scale|| / max_norm) over ``buckets`` (a group's, or every
        group's) and every shard, on the first bucket's device (no host sync:
        device-to-device copies and collectives only)."""
        total: Tensor | None = None
        pending: tuple[Any, Tensor] | None = None  # (sharding, local sum): buckets summed by one collective

        def flush() -> None:
            nonlocal total
            if pending is not None:
                part = _sharding.all_reduce_sum(pending[1], pending[0])
                total = part if total is None else total + part.to(total.device, non_blocking=True)

        for bucket in buckets:
            grads = bucket.grads
            if grads:
                norms = _private.foreach("norm")(grads, 2,
                                                 dtype=None if grads[0].dtype == torch.float64 else torch.float32)
                part = torch.stack(norms).double().square().sum()
            else:  # (a rank with no piece of a sharded bucket)
                part = torch.zeros((), dtype=torch.float64, device=bucket.device)
            if pending is not None and pending[1].device == part.device and \
                    _sharding.sums_alike(pending[0], bucket.sharding):
                pending = (pending[0], pending[1] + part)
            else:
                flush()
                pending = (bucket.sharding, part)
        flush()
        if total is None:
            raise ValueError("no buckets to clip")
        grad_scale, _ = self._amp_args(total.device)
        return ops.clip_factor(total, max_norm, grad_scale)



class OpView(Optimizer):
    """The param groups as the ops take them (each group's :class:`OpGroup` view), as an
    optimizer of their own, which a traced step reads instead of its optimizer's groups.

    Dynamo's support for ``torch.optim.Optimizer`` realizes every entry of the ``param_groups``
    a traced step reads (or whose ``_init_group`` it runs), with a value guard on each float:
    the optimizer's own groups hold what users and schedulers wrote, floats that change every
    step, and a compiled step reading them would recompile at every lr. The views hold only the
    optimizer's own keys, the scheduled values as 0-d tensors that never change identity, so
    their guards hold. The guards read :attr:`param_groups` before every call of a compiled step,
    and that read syncs the views with what was written into the groups (leniently: a refused
    value fails a guard, and the step traced anew raises it). ``_init_group`` is Dynamo's
    name for what it runs eagerly: the buckets of a group of plain params
    (:func:`._buckets.init_group`), built outside the trace."""

    def __init__(self, opt: FusedOptimizer) -> None:  # (not Optimizer.__init__: it steps nothing)
        self._opt = weakref.ref(opt)  # (a reference cycle would keep the state alive until a GC pass)
        self.views: list[dict[str, Any]] = []
        self.defaults: dict[str, Any] = {}

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        # Every real call syncs: the guards' and Dynamo's own while it traces (its optimizer support
        # reads this eagerly before tracing the step); traced code (where Dynamo inlines this, and
        # is_dynamo_compiling is True) reads what they synced.
        opt = self._opt()
        if opt is not None and not torch.compiler.is_dynamo_compiling():
            opt._sync_views(strict=False)
        return self.views

    @property
    def state(self) -> Any:  # type: ignore[override]
        opt = self._opt()
        return opt.state if opt is not None else {}

    def _init_group(self, index: int, *lists: list[Tensor]) -> tuple[tuple[Any, ...], ...] | None:
        opt = self._opt()
        assert opt is not None
        opt._stepped = True  # (the traced route's record of a step: _record_step)
        opt._op_groups[index].check()  # (what the guards' sync refused, raised outside the trace: its message first)
        return _buckets.init_group(opt, self.views[index], index, *lists)


# Read by torch code that Dynamo does not trace (LR schedulers, GradScaler) inside a compiled
# function: run eagerly there rather than compiled as frames of their own (_private).
for _property in (FusedOptimizer.__dict__["_opt_called"], OpView.__dict__["param_groups"]):
    _private.run_eagerly_as_a_frame(_property.fget)
