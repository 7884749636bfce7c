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


def test_steps_reuse_their_pieces_until_a_checkpoint_replaces_the_state(tmp_path):
    spawn("same_engine", 2, ["lamb", "lamb16", "novograd"], [1, 2], str(tmp_path))


def test_unmappable_flat_params_are_refused():
    spawn("refusals", 1)
