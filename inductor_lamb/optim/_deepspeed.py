"""DeepSpeed ZeRO (stages 1, 2 and 3, ZeRO-Offload included): the flat partitions that
DeepSpeed hands a client optimizer, mapped back to pieces of the model's tensors, so that a
layer-wise step (LAMB, LAMB16, LARS) takes each tensor's norms over the whole tensor.

How ZeRO drives a client optimizer (DeepSpeed 0.19, ``runtime/zero/stage_1_and_2.py`` and
``stage3.py``): it builds its own flat groups from the optimizer's param groups, then puts
one flat float32 tensor in each group, this rank's partition, and calls ``step()`` with that
tensor and its flat grad. The partition cuts across the model's tensors, so a per-tensor
norm taken over it would be a per-partition norm: silently wrong. Where each piece lies:

- **Stages 1 and 2**: every model param carries ``_hp_mapping`` (``utils/tensor_fragment.py``)
  with ``hp_fragment``, a view into this rank's flat partition, and ``hp_fragment_address``
  (its start and length there), or ``None`` where no piece of it is on this rank; and
  ``_dp_group``, the data-parallel group.
- **Stage 3**: every model param carries ``_z3_optimizer``, the ZeRO-3 optimizer, whose
  ``grad_position[get_param_id(p)] = [sub_group, offset, partition_numel]`` locates the param's
  slot in the flat tensor of its sub-group; rank r holds elements ``[r, r + 1) *
  partition_numel`` of the flattened param (the last rank's slot ends in padding).

A step over a flat partition becomes a step over its pieces (views into the partition, its
grad and its state), in two buckets whose sharding is :class:`Pieces`. The pieces that are
whole tensors (every tensor of a one-rank ZeRO-Offload, most tensors at any world size) have
their norms on this rank: one op call steps them, as it steps a model's own tensors (on the CPU,
cache-blocked, LAMB's and LAMB16's updates stashed between the passes). The pieces cut between
ranks take the two phases: the reduce op's per-piece partials are placed at their tensor's
index in a table of every model tensor, combined across the data-parallel group by one
collective (an ``all_reduce``, or an ``all_gather`` combined in rank order when some columns
take a max: LAMB16's amaxes), and read back per piece for the apply op. A rank with no piece of
a tensor adds nothing to it; a rank with no cut piece at all still takes part in the
collective. Global gradient clipping, when the optimizer does it, sums both buckets' grads
over the group.

The state of a flat partition is kept as DeepSpeed expects of a client optimizer: one
tensor like the partition per state key (``exp_avg`` ...), which DeepSpeed's checkpoints
and its fragment API read, plus per-piece vectors for what is one value per tensor (the step
counts; LAMB16's scales). Element-wise optimizers (Adagrad) step the partition as it is:
they need nothing per tensor.

A layer-wise optimizer handed flat tensors it cannot map (FSDP1's ``FlatParameter``, another
engine's, a DeepSpeed whose layout differs) refuses with an error that says what to do.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch import Tensor

from ._layout import Bucket, Stepped
from ._model_tensors import ModelTensors  # noqa: F401  (where pickles of 0.3 find it)

__all__ = ["Pieces", "PartitionMap", "check_model_params", "flat_buckets", "release_replaced_state"]


@dataclass(eq=False)
class Pieces:
    """The sharding of a bucket of pieces of the model's tensors (a ZeRO partition): piece i
    is part of model tensor ``index[i]`` of ``count``; the other pieces of those tensors are
    on the other ranks of ``group``."""

    group: Any
    index: Tensor  # int64 [pieces], on the partition's device
    count: int
    # (combined along one group, as one mesh dimension; () for whole tensors: nothing to combine,
    # one op call steps them, and only the global clip's sum runs over the group)
    dims: tuple[int, ...] = field(default=(0,))

    def _on_comm_device(self, t: Tensor) -> Tensor:
        # NCCL carries device tensors only (an offloaded partition is on the CPU)
        import torch.distributed as dist

        if t.device.type == "cpu" and dist.get_backend(self.group) == "nccl":
            return t.to(torch.device("cuda", torch.cuda.current_device()))
        return t

    def all_reduce_sum(self, t: Tensor) -> Tensor:
        """``t`` (one value for the whole partition) summed over the group."""
        import torch.distributed as dist

        out = self._on_comm_device(t.clone())
        dist.all_reduce(out, group=self.group)
        return out.to(t.device)

    def combine(self, partials: Tensor, combines: list[str]) -> Tensor:
        """Per-piece partial reductions ``[pieces, k]`` combined into each whole tensor's
        values (column j summed or maxed as ``combines[j]``), read back per piece."""
        import torch.distributed as dist

        table = partials.new_zeros(self.count, partials.shape[1]).index_copy_(0, self.index, partials)
        table = self._on_comm_device(table)
        if all(c == "sum" for c in combines):
            dist.all_reduce(table, group=self.group)
        else:
            size = dist.get_world_size(self.group)
            gathered = table.new_empty(size * table.shape[0], table.shape[1])
            # (all_gather_into_tensor's new name; older torch has only the old one)
            (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(gathered, table, group=self.group)
            gathered = gathered.view(size, *table.shape)
            table = torch.stack([gathered[:, :, j].sum(0) if c == "sum" else gathered[:, :, j].amax(0)
                                 for j, c in enumerate(combines)], dim=1)
        return table.to(partials.device).index_select(0, self.index)


@dataclass
class PartitionMap:
    """Where the pieces of one flat partition lie: (model tensor index, start, length)."""

    flat: weakref.ref
    pieces: list[tuple[int, int, int]]
    group: Any
    # per bucket (its pieces' positions js): how to cut the partition into them (_Cut)
    cuts: dict[tuple[int, ...], _Cut] = field(default_factory=dict)
    whole: list[bool] | None = None  # per piece: whether it is a whole model tensor (flat_buckets)

    def cut(self, js: list[int]) -> _Cut:
        key = tuple(js)
        if key not in self.cuts:
            self.cuts[key] = _Cut([self.pieces[j] for j in js], js)
        return self.cuts[key]


class _Cut:
    """Pieces of a partition as views of any tensor shaped like it, made each step by one
    ``split_with_sizes`` (the partition's pieces and the gaps between them, in order) where a
    ``narrow`` a piece took 4x as long: 412 of them a step on the BERT-like list, 8% of LAMB's
    ZeRO-Offload step. Views are not kept between steps: a view would keep alive a grad or a
    state tensor that DeepSpeed or a user replaces or frees."""

    __slots__ = ("where", "sizes", "covered", "picks", "js")

    def __init__(self, where: list[tuple[int, int, int]], js: list[int]) -> None:
        self.where, self.js = where, js
        order = sorted(range(len(where)), key=lambda k: where[k][1])
        self.sizes: list[int] | None = []
        self.picks = [0] * len(where)
        end = 0
        for k in order:
            _, start, length = where[k]
            if start < end:  # (overlapping pieces: no engine makes them; each is narrowed)
                self.sizes = None
                break
            if start > end:  # (a gap: another bucket's pieces, or padding)
                self.sizes.append(start - end)
            self.picks[k] = len(self.sizes)
            self.sizes.append(length)
            end = start + length
        self.covered = end

    def views(self, t: Tensor) -> list[Tensor]:
        """The pieces of ``t`` (shaped like the partition), in bucket order."""
        if self.sizes is None:
            return [t.narrow(0, start, length) for _, start, length in self.where]
        parts = t.split_with_sizes(self.sizes + [t.shape[0] - self.covered])
        return [parts[k] for k in self.picks]

    def entries(self, t: Tensor) -> list[Tensor]:
        """Each piece's entry of a per-piece vector ``t``, in bucket order."""
        rows = t.unbind(0)
        return [rows[j] for j in self.js]


def _is_foreign(opt: Stepped, params: list[Tensor]) -> bool:
    """Whether a param group holds tensors the optimizer was not given (an engine's flat
    partitions): none of them is one of the model params it was built with."""
    known = opt._model.index
    return bool(known) and bool(params) and all(id(p) not in known for p in params)


def release_replaced_state(opt: Stepped) -> None:
    """Drops the state made at construction for model params that an engine has since
    replaced by its flat partitions (they are in no param group any more): unused, it would
    hold a full copy of the optimizer state on every rank, and torch.optim's ``state_dict``
    cannot pack state of a tensor that is in no group."""
    if not opt._model.index:
        return
    current = {id(p) for g in opt.param_groups for p in g["params"]}
    for p in opt._model.params:
        if id(p) not in current and p in opt.state:
            del opt.state[p]


def _refuse(opt: Stepped, what: str) -> NoReturn:
    raise RuntimeError(
        f"{type(opt).__name__}: {what}. Its trust ratios need each tensor's norms, which a step over "
        "flat partitions that cut across tensors cannot take (it would be a per-partition ratio, silently "
        "wrong). Supported: DeepSpeed ZeRO stages 1-3 (pass the optimizer to deepspeed.initialize), "
        "FSDP2 / DTensor (fully_shard), DDP. An element-wise optimizer (inductor_lamb.Adagrad) steps any "
        "flat layout exactly.")


def check_model_params(opt: Stepped, params: list[Tensor]) -> None:
    """Refuses, when the optimizer is built, flat params it could only step per partition."""
    if not opt._layout.spec.reductions:
        return
    for p in params:
        if getattr(p, "_is_flat_param", False):
            _refuse(opt, "it is given FSDP1's FlatParameter (FullyShardedDataParallel flattens a module's "
                    "params into one tensor); use FSDP2 (torch.distributed.fsdp.fully_shard) instead")


def _map_zero12(opt: Stepped, flat: Tensor) -> PartitionMap | None:
    storage = flat.untyped_storage().data_ptr()
    pieces, groups = [], []
    for index, p in enumerate(opt._model.params):
        if not hasattr(p, "_dp_group"):
            continue
        groups.append(p._dp_group)
        mapping = getattr(p, "_hp_mapping", None)
        if mapping is None or mapping.hp_fragment.untyped_storage().data_ptr() != storage:
            continue
        address = mapping.hp_fragment_address
        pieces.append((index, int(address.start), int(address.numel)))
    if not groups:
        return None
    if any(g is not groups[0] for g in groups):
        _refuse(opt, "its params are in several DeepSpeed data-parallel groups (expert parallelism?), which "
                "it does not map")
    return PartitionMap(weakref.ref(flat), pieces, groups[0])


def _map_zero3(opt: Stepped, flat: Tensor) -> PartitionMap | None:
    import torch.distributed as dist

    params = opt._model.params
    zero3 = next((p._z3_optimizer for p in params if hasattr(p, "_z3_optimizer")), None)
    if zero3 is None:
        return None
    flats = getattr(zero3, "fp32_partitioned_groups_flat", None)
    sub_group = next((i for i, f in enumerate(flats or ()) if f is flat), None)
    if sub_group is None:
        _refuse(opt, f"DeepSpeed ZeRO-3 handed it a flat tensor of {flat.numel()} elements that is not one of "
                "its fp32 partitions (a DeepSpeed version whose layout this release does not know)")
    index_of = opt._model.index
    group = zero3.dp_process_group
    rank = dist.get_rank(group)
    pieces = []
    for p in zero3.fp16_groups[sub_group]:
        if id(p) not in index_of:
            _refuse(opt, "DeepSpeed ZeRO-3 steps a param that was not given to this optimizer")
        _, offset, slot = zero3.grad_position[zero3.get_param_id(p)]
        length = max(0, min(slot, p.ds_numel - rank * slot))  # (the rest of the slot is padding)
        if length:
            pieces.append((index_of[id(p)], int(offset), int(length)))
    return PartitionMap(weakref.ref(flat), pieces, group)


def _partition_map(opt: Stepped, flat: Tensor) -> PartitionMap:
    cache = opt._model.partition_maps
    where = cache.get(id(flat))
    if where is not None and where.flat() is flat:
        return where
    where = _map_zero12(opt, flat) or _map_zero3(opt, flat)
    if where is None:
        _refuse(opt, f"a param group holds a tensor of shape {tuple(flat.shape)} that is not one of the params "
                "it was built with, and that no engine it knows made (another engine's flat partition?)")
    for _, start, length in where.pieces:
        if start < 0 or start + length > flat.numel():
            _refuse(opt, "DeepSpeed's map of its flat partition points outside it (a DeepSpeed version whose "
                    "layout this release does not know)")
    cache[id(flat)] = where
    return where


def _piece_state(opt: Stepped, flat: Tensor, group: dict[str, Any], pieces: int) -> dict[str, Any]:
    """The state of a flat partition: a tensor like it per state key, and per-piece vectors
    of the per-tensor values (step counts, LAMB16's scales), made or resized to ``pieces``."""
    state = opt.state[flat]
    layout = opt._layout
    for key in layout.state_keys:
        if key not in state:
            state[key] = torch.full_like(flat, opt._state_fill(key, group), dtype=layout.state_dtype(key, flat.dtype))
    vectors = (["step"] if layout.has_step else []) + list(layout.scalar_state_keys)
    for key in vectors:
        fill = 0.0 if key == "step" else opt._state_fill(key, group)
        v = state.get(key)
        if v is None or v.numel() != pieces:
            # (a count of another layout, from a checkpoint: every piece has taken the same steps)
            if v is not None and v.numel():
                fill = float(v.max()) if key == "step" else fill
            v = torch.full((pieces,), fill, dtype=torch.float32, device=flat.device)
        state[key] = v.reshape(-1)
    return state


def flat_buckets(opt: Stepped, group: dict[str, Any]) -> dict[tuple[Any, ...], Bucket] | None:
    """The buckets of a param group that holds flat partitions, one per partition, each of
    the pieces of the model's tensors in it (:class:`Pieces`); None when the group holds
    the model's own tensors (or when the optimizer is element-wise: a flat partition is
    then stepped as it is). Raises when a layer-wise optimizer cannot map what it holds."""
    params = group["params"]
    if not _is_foreign(opt, params):
        return None
    release_replaced_state(opt)
    if not opt._layout.spec.reductions:
        return None
    buckets: dict[tuple[Any, ...], Bucket] = {}
    for flat in params:
        if flat.grad is None:
            continue
        if flat.dim() != 1 or flat.dtype != torch.float32:
            _refuse(opt, f"a param group holds a {flat.dtype} tensor of shape {tuple(flat.shape)} that is not "
                    "one of the params it was built with")
        partition = _partition_map(opt, flat)
        state = _piece_state(opt, flat, group, len(partition.pieces))
        if partition.whole is None:
            partition.whole = [_numel(opt._model.params[i]) == n for i, _, n in partition.pieces]
        whole = partition.whole
        for kind in ("whole", "cut"):
            # (in a group of several ranks both buckets exist on every rank, empty or not: each
            # rank joins the same collectives, the clip's sums and the cut pieces' combine)
            js = [j for j, w in enumerate(whole) if w == (kind == "whole")]
            if not js and _world(partition.group) == 1:
                continue
            buckets[(flat.device, flat.dtype, id(flat), kind)] = _pieces_bucket(opt, flat, state, partition, js,
                                                                                dims=() if kind == "whole" else (0,))
    return buckets


def _numel(p: Tensor) -> int:
    """A model tensor's whole size (ZeRO-3 leaves a partitioned param empty: ``ds_numel``)."""
    return int(getattr(p, "ds_numel", p.numel()))


def _world(group: Any) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group) if dist.is_initialized() else 1


def _pieces_bucket(opt: Stepped, flat: Tensor, state: dict[str, Any], partition: PartitionMap, js: list[int],
                   dims: tuple[int, ...]) -> Bucket:
    """The bucket of pieces ``js`` of ``partition``: views into the partition, its grad and its
    state (per-tensor values: piece j's entry of the per-piece vectors)."""
    where = [partition.pieces[j] for j in js]
    grad = flat.grad
    assert grad is not None  # (flat_buckets steps partitions with grads)
    cut = partition.cut(js)
    lists = {"params": cut.views(flat), "grads": cut.views(grad)}
    layout = opt._layout
    for key, arg in layout.lists.items():  # (state like the partition; per-tensor values per piece)
        t = state[key]
        lists[arg] = cut.entries(t) if key in layout.scalar_state_keys else cut.views(t)
    if layout.has_step:
        lists["steps"] = cut.entries(state["step"])
    index = torch.tensor([i for i, _, _ in where], dtype=torch.int64, device=flat.device)
    return Bucket(flat.device, lists, [opt._model.names[i] for i, _, _ in where],
                  Pieces(partition.group, index, len(opt._model.params), dims))
