"""Bucketing and the op calls, as functions over :class:`Bucket`: each param group's params with
a grad, grouped by (device, dtype, sharding) with their state as the op's argument lists, and
the op calls of one bucket (the one-call op, or reduce, combine across shards, apply), by
reference to the optimizer's op functions (:class:`OpFamily`)."""

from __future__ import annotations

import enum
from typing import Any

import torch
from torch import Tensor

from ..spec import OpSpec, Role
from . import _sharding
from ._layout import BUCKET_LISTS, GROUP_KEYS, OPTION_ROLES, Bucket, Buckets, OpFamily, Stepped
from ._scheduled import follows

__all__ = ["OpFamily", "Bucket", "BUCKET_LISTS", "BucketKind", "bucket_kind", "init_group", "group_buckets",
           "make_buckets", "hypers", "bucket_call", "step_bucket"]


def init_group(opt: Stepped, group: dict[str, Any], index: int, *lists: list[Tensor]
               ) -> tuple[tuple[Any, ...], ...] | None:
    """``_init_group`` of the optimizer's ``OpView``: the buckets of param group ``index`` (its view) when all its params
    are plain tensors (no DTensor, no sparse grad): fills ``lists`` (empty, one per entry of
    ``opt._layout.flat_lists``) with every bucket's tensors, bucket after bucket, and returns each
    bucket's (number of params, has master copies, param names); None, with nothing filled,
    otherwise (the traced :func:`make_buckets` then handles the group and its errors).

    Why there: dynamo runs a ``torch.optim.Optimizer``'s ``_init_group`` eagerly instead of
    tracing it, and installs the guards on its ``param_groups`` (here the views) and ``state``
    itself (torch/_dynamo/variables/optimizer.py). Traced, this per-param Python was most of dynamo's
    time on a compiled step (docs/decisions.md, "Bucketing outside the trace"). The result depends only on what those
    guards check: which params have grads, their devices and dtypes, and the state's keys."""
    dtensor = _sharding.dtensor_type() or ()  # (isinstance(x, ()) is False: no DTensor exists)
    for p in group["params"]:
        g = p.grad
        if g is None:
            continue
        if g.is_sparse or isinstance(p, dtensor) or isinstance(g, dtensor):
            return None
        for t in opt.state.get(p, {}).values():  # (state made later is like its param)
            if isinstance(t, dtensor):
                return None
    buckets = make_buckets(opt, group, index, unsharded=True)
    if any(len(b.master_params) not in (0, len(b.params)) for b in buckets.values()):
        return None
    flat_lists = opt._layout.flat_lists
    out = dict(zip(flat_lists, lists))
    for b in buckets.values():
        for key in flat_lists:
            out[key].extend(b.lists.get(key, ()))
    return tuple((len(b.params), len(b.master_params) > 0, tuple(b.names)) for b in buckets.values())


def group_buckets(opt: Stepped, group: dict[str, Any], index: int) -> Buckets:
    """Param group ``index``'s buckets: from ``_init_group`` when it takes the group (under
    Dynamo: run eagerly, outside the trace), else from :func:`make_buckets`."""
    flat_lists = opt._layout.flat_lists
    lists: list[list[Tensor]] = [[] for _ in flat_lists]
    layout = opt._op_view._init_group(index, *lists)
    if layout is None:
        return make_buckets(opt, group, index)
    flat = dict(zip(flat_lists, lists))
    buckets: Buckets = {}
    lo = lo_master = 0
    for n, has_master, names in layout:
        b = Bucket(flat["params"][lo].device, {k: v[lo:lo + n] for k, v in flat.items() if k != "master_params"},
                   list(names))
        if has_master:
            b.lists["master_params"] = flat["master_params"][lo_master:lo_master + n]
            lo_master += n
        buckets[(b.device, b.params[0].dtype, None)] = b
        lo += n
    return buckets


def make_buckets(opt: Stepped, group: dict[str, Any], index: int, unsharded: bool = False,
                 at: list[int] | None = None) -> Buckets:
    """Params with a grad, with their state, grouped by (device, dtype, sharding); lists hold
    local shards of DTensors. Checks every DTensor's layout before anything runs. ``unsharded``: the
    caller found no DTensor and no sparse grad (the per-tensor sharding checks are skipped: the
    eager step's per-param Python). ``at``: ``group`` is a batch of param group ``index``'s params
    in the backward, these their places in it (what errors name)."""
    buckets: Buckets = {}
    meshes: dict[tuple[torch.device, torch.dtype], tuple[Any, str]] = {}
    names = group.get("param_names")  # set when built from model.named_parameters()
    who = type(opt).__name__

    def name(i: int) -> str:
        return repr(names[i]) if names else f"{i if at is None else at[i]} of param group {index}"

    def bucket(key: tuple[Any, ...], **fields: Any) -> Bucket:
        if key not in buckets:
            buckets[key] = Bucket(key[0], **fields)
        return buckets[key]

    dtensor = _sharding.dtensor_type() or ()  # (isinstance(x, ()) is False: no DTensor exists)
    layout = opt._layout
    for i, p in enumerate(group["params"]):
        g = p.grad
        if g is None:
            continue
        state = opt._init_state(p, group)
        param_name = names[i] if names else None
        tensors = layout.param_tensors(p, state)
        # A traced step runs this per param (recipe (a)): the common case, plain dense tensors,
        # calls no function (each call Dynamo traces costs compile time, docs/decisions.md,
        # "Compile time: what the scheduler and gcc see").
        plain = unsharded or not g.is_sparse
        if plain and not unsharded:
            for _, t in tensors:
                if isinstance(t, dtensor):
                    plain = False
        if plain:
            key = (p.device, p.dtype, None)
            b = buckets.get(key)
            if b is None:
                b = buckets[key] = Bucket(p.device)
            for arg, t in tensors:
                b.lists[arg].append(t)
            b.names.append(param_name)
            continue
        if g.is_sparse:
            opt._check_sparse(p, group, name(i))
            bucket((p.device, p.dtype, "sparse"), sparse=True).add(tensors, param_name)
            continue
        sharding = _sharding.sharding_of(p, p.grad, state, name(i), who)
        if sharding is not None:  # one mesh per (device, dtype) of a group: one collective per bucket
            first = meshes.setdefault((p.device, p.dtype), (sharding.mesh, name(i)))
            if not _sharding.same_mesh(first[0], sharding.mesh):
                raise ValueError(f"{who}: param {name(i)} is on a different device mesh than param {first[1]} "
                                 "of the same param group, device and dtype; put them in separate param groups")
        local = [(arg, _sharding.local(t)) for arg, t in tensors]
        bucket((p.device, p.dtype, sharding), sharding=sharding).add(local, param_name)
    return buckets


def on_bucket(value: Tensor, bucket: Bucket) -> Tensor:
    """A group's scheduled tensor as the bucket's op takes it: itself when it is a 0-d
    float32 tensor on the bucket's device (float64 buckets: any float dtype), else a
    converted copy, made at every step (a user's tensor on another device or of another
    dtype; a mixed-device group's)."""
    p = bucket.params[0]
    if p.dtype == torch.float64 and value.dim() == 0 and value.device == p.device and value.is_floating_point():
        return value
    if follows(value, p.device):
        return value
    return value.detach().reshape(()).to(device=p.device, dtype=torch.float32, non_blocking=True)


def hypers(opt: Stepped, group: dict[str, Any], bucket: Bucket) -> dict[str, Any]:
    """The op's hyper-parameters for one bucket: the entries of ``group`` that the op takes, by name (``betas``: ``beta1``,
    ``beta2``; ``GROUP_KEYS``: keys of other names), scheduled ones on the bucket's device (an
    optimizer's ``_hypers`` may add per-param options)."""
    layout = opt._layout
    values = dict(group)
    if "betas" in group:
        values["beta1"], values["beta2"] = group["betas"]
    out = {}
    for a in layout.spec.args:
        key = GROUP_KEYS.get(a.name, a.name)
        if key in values and (a.role is Role.TENSOR or a.role in OPTION_ROLES):
            v = values[key]
            out[a.name] = on_bucket(v, bucket) if isinstance(v, Tensor) and a.role is Role.TENSOR else v
    return out


def _bucket_args(opt: Stepped, group: dict[str, Any], bucket: Bucket, grad_scale: Tensor | None,
                 found_inf: Tensor | None, max_grad_norm: float) -> dict[str, Any]:
    """One bucket's op arguments by name, every param of it (:func:`_chunk` cuts them per call)."""
    op = opt._layout.spec
    args: dict[str, Any] = {a.name: bucket.lists[a.name] for a in op.args if a.role in BUCKET_LISTS}
    args.update(opt._hypers(group, bucket), grad_scale=grad_scale, found_inf=found_inf)
    if bucket.master_params:
        args["master_params"] = bucket.master_params
    if "max_grad_norm" in op.names:
        args["max_grad_norm"] = max_grad_norm
    return args


def bucket_call(opt: Stepped, group: dict[str, Any], bucket: Bucket) -> tuple[Any, list[Any], dict[str, int]]:
    """An unsharded bucket's one op call, for a :class:`~._plan.GroupPlan`: the op, its arguments in
    schema order as the op takes them (the per-step values empty), and where the per-step
    arguments sit (grads, grad_scale, found_inf, max_grad_norm)."""
    spec = opt._layout.spec
    args = _bucket_args(opt, group, bucket, None, None, 0.0)
    slots = {a.name: i for i, a in enumerate(spec.args) if a.role is Role.GRADS
             or a.name in ("grad_scale", "found_inf", "max_grad_norm")}
    return spec.op, spec.to_op_args(spec.bind((), args)), slots


class BucketKind(enum.Enum):
    """How one bucket steps, on any route (``_route``); the math is the ops' for float32,
    bfloat16 and float16 params, the float64 reference functions' for float64 ones."""

    ONE_CALL = "one op call"                   # plain tensors (a traced step: per max_tensors_per_call)
    TWO_PHASE = "reduce, combine, apply"       # DTensor shards, an engine's pieces: exact per-tensor norms
    NO_PIECE = "its share of the collective"   # a rank that holds no piece of a sharded bucket
    SPARSE = "sparse rows"                     # sparse grads (Adagrad): the optimizer's own update


def bucket_kind(family: OpFamily, bucket: Bucket) -> BucketKind:
    """The one place that says how a bucket steps (the table of :class:`BucketKind`)."""
    if bucket.sparse:
        return BucketKind.SPARSE
    sharded = bucket.sharding is not None and bool(bucket.sharding.dims) and family.spec.reductions != ()
    if sharded and not bucket.params:
        return BucketKind.NO_PIECE
    return BucketKind.TWO_PHASE if sharded else BucketKind.ONE_CALL


def step_bucket(opt: Stepped, group: dict[str, Any], bucket: Bucket, grad_scale: Tensor | None,
                found_inf: Tensor | None, max_grad_norm: float) -> None:
    """The op calls of one bucket of ``group``, by its :func:`bucket_kind`."""
    family = opt._layout.family
    op = family.spec
    kind = bucket_kind(family, bucket)
    if kind is BucketKind.SPARSE:
        opt._step_sparse(group, bucket, grad_scale, found_inf)
        return
    if kind is BucketKind.NO_PIECE:
        _sharding.combine(torch.zeros((0, len(op.reductions)), device=bucket.device),
                          [c.combine for c in op.reductions], bucket.sharding)
        return
    if not bucket.params:
        return
    dtype = bucket.params[0].dtype
    args = _bucket_args(opt, group, bucket, grad_scale, found_inf, max_grad_norm)
    # One call per bucket eagerly; a traced step cuts it (max_tensors_per_call: Inductor's
    # compile time), with the same bits (per-tensor math; the clip rule in ``step``).
    n = len(bucket.params)
    size = opt.max_tensors_per_call if torch.compiler.is_compiling() else n
    if dtype == torch.float64:
        # 0-d params (and their grads and state) as 1-element views: torch 2.13's
        # dynamo drops in-place writes to 0-d float64 graph inputs (it takes them
        # for wrapped Python floats).
        shaped = {a.name for a in op.args if a.role in (Role.PARAMS, Role.GRADS, Role.STATE)}
        args = {k: [t.view(1) if t.dim() == 0 else t for t in v] if k in shaped else v for k, v in args.items()}
    chunks = [_chunk(op, args, lo, min(lo + size, n), n) for lo in range(0, n, size)]
    step, *phases = family.functions(dtype)
    if kind is BucketKind.ONE_CALL:
        for chunk in chunks:
            step(**chunk)
        return
    # one collective for the bucket, whatever its number of op calls
    reduce, apply = phases
    partials = [reduce(**chunk) for chunk in chunks]
    totals = _sharding.combine(torch.cat(partials) if len(partials) > 1 else partials[0],
                               [c.combine for c in op.reductions], bucket.sharding)
    lo = 0
    for chunk in chunks:
        hi = lo + len(chunk["params"])
        apply(reductions=totals[lo:hi], **chunk)
        lo = hi


def _chunk(op: OpSpec, args: dict[str, Any], lo: int, hi: int, n: int) -> dict[str, Any]:
    """The op arguments of params ``lo:hi`` of a bucket of ``n``: its lists and per-param options
    sliced, everything else shared."""
    if lo == 0 and hi == n:
        return args
    out = dict(args)
    for a in op.args:
        value = args.get(a.name)
        if isinstance(value, (list, tuple)) and (a.role in BUCKET_LISTS or a.role is Role.MASTER
                                                 or (a.role in (Role.FLOATS, Role.BOOLS) and len(value) == n)):
            out[a.name] = value[lo:hi]
    return out
