"""The optimizers under DeepSpeed ZeRO stages 1, 2 and 3 (real engines: CPU, gloo, ranks
spawned on localhost, each run bounded in time): the unsharded trajectory within float32
rounding, with uneven partitions (tensors cut between ranks, ranks with no piece of a tensor
or of a whole param group), param groups, a scheduler, gradient accumulation and clipping,
ZeRO-Offload, bf16, and checkpoints that resume bit for bit (deepspeed_cases.py)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")

sys.path.insert(0, os.path.dirname(__file__))
import conftest  # noqa: E402
import deepspeed_cases  # noqa: E402

ALL = sorted(deepspeed_cases.OPTIMIZERS)


def spawn(case: str, world: int, *args, timeout: float = 240.0) -> None:
    conftest.spawn(deepspeed_cases, case, world, *args, timeout=timeout)


def test_every_stage_and_optimizer_matches_unsharded_at_two_ranks():
    spawn("exact", 2, ALL, [1, 2, 3])


def test_layer_wise_optimizers_at_three_ranks():
    spawn("exact", 3, ["lamb_clip", "lamb16", "lars", "novograd"], [1, 2, 3])


def test_accumulation_clipping_offload_and_bf16():
    spawn("features", 2, ["lamb", "lamb16", "lars", "novograd"], timeout=400)


def test_checkpoints_resume_bit_for_bit(tmp_path):
    spawn("checkpoint", 2, ["lamb", "lamb16", "lars", "novograd"], [1, 2, 3], str(tmp_path))


def test_steps_follow_replaced_state_and_keep_no_freed_grad(tmp_path):
    spawn("same_engine", 2, ["lamb", "lamb16", "lars", "novograd"], [1, 2], str(tmp_path))


def test_unmappable_flat_params_are_refused():
    spawn("refusals", 1)


@pytest.mark.parametrize("pieces", [
    [(0, 0, 5), (1, 5, 3)],                      # the whole partition
    [(3, 10, 4), (0, 2, 3), (7, 20, 0)],         # out of order, gaps, an empty piece, padding after
    [(0, 0, 6), (1, 4, 5)],                      # overlapping (no engine makes them): narrowed
])
def test_pieces_are_cut_as_views_of_the_partition(pieces):
    from inductor_lamb.optim._deepspeed import _Cut

    flat = torch.arange(24.0)
    cut = _Cut(pieces, list(range(len(pieces))))
    views = cut.views(flat)
    for (_, start, length), v in zip(pieces, views):
        assert torch.equal(v, flat[start:start + length]) and (length == 0 or v.data_ptr() == flat[start:].data_ptr())
    for v in views:
        v.add_(100.0)  # (writes land in the partition)
    touched = {k for _, start, length in pieces for k in range(start, start + length)}
    assert all((flat[k] >= 100) == (k in touched) for k in range(24))
    vector = torch.arange(float(len(pieces)))
    assert [float(x) for x in cut.entries(vector)] == list(range(len(pieces)))


def test_no_group_key_collides_with_what_deepspeed_writes():
    spawn("group_keys", 2, sorted(conftest.our_group_keys()))
