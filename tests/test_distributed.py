"""Sharded optimizers on real process groups: gloo on CPU, ranks spawned on
localhost with a file store, each run bounded in time. Every rank checks its
sharded run against the whole-tensor run of the same problem (dist_cases.py)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")

sys.path.insert(0, os.path.dirname(__file__))
import conftest  # noqa: E402
import dist_cases  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"


def spawn(case: str, world: int, *args, timeout: float = 120.0) -> None:
    conftest.spawn(dist_cases, case, world, *args, timeout=timeout)


@pytest.mark.parametrize("world", [2, 3])
def test_dtensor_params_match_whole_tensors(world):
    """1-D mesh: Shard(0), Shard(1), Replicate, uneven shards, a rank with an empty shard."""
    names = sorted(dist_cases.OPTIMIZERS) if world == 2 else ["lamb_clip", "lamb16", "lars"]
    spawn("dtensor_exact", world, names, [(world,)])


def test_dtensor_params_on_2d_meshes():
    """HSDP (replicate, shard) and 2-D sharding (shard, shard)."""
    spawn("dtensor_exact", 2, ["lamb_clip", "lamb16", "lars"], [(1, 2), (2, 1)])


@pytest.mark.parametrize("world, shapes", [(2, [(2,)]), (4, [(2, 2)])], ids=["2 ranks", "4 ranks 2x2"])
def test_strided_and_2d_layouts_match_whole_tensors(world, shapes):
    """_StridedShard (FSDP2 over tensor parallel), Shard x Shard, Replicate x Shard and uneven
    shards: every optimizer's step equals the whole-tensor one (norms, amaxes, the clip)."""
    names = ["lamb", "lamb_clip", "lamb16", "lars_plain", "adagrad", "novograd", "lamb_sr_bf16"]
    spawn("dtensor_layouts", world, names, shapes, timeout=300)


def test_fsdp2_matches_single_process_and_grad_scaler():
    """FSDP2 at world size 2 (world size 3: the DTensor test above and the DCP resume);
    GradScaler with an inf in one rank's shard skips the step on every rank."""
    spawn("fsdp_exact", 2, ["lamb_clip", "lamb16", "lars", "adagrad", "novograd"], ["lamb", "lamb16", "lars", "novograd"])


def test_fsdp2_frozen_and_gradless_groups():
    spawn("fsdp_gaps", 2, ["lamb_clip", "lamb16", "lars", "adagrad", "novograd"])


def test_dcp_checkpoint_of_steps_in_the_backward_resumes_at_another_world_size(tmp_path):
    """Saved from FSDP2 stepping in the backward at 2 ranks, resumed at 3 (ordinary, then in the
    backward again): the uninterrupted whole-model run's."""
    names = ["lamb", "lamb16"]
    spawn("dcp_save", 2, names, str(tmp_path / "a"), True)
    spawn("dcp_resume", 3, names, str(tmp_path / "a"), False)
    spawn("dcp_save", 2, names, str(tmp_path / "b"), False)
    spawn("dcp_resume", 3, names, str(tmp_path / "b"), True)


def test_fsdp2_and_tensor_parallel_step_in_the_backward_and_ddp_is_refused():
    """step_in_backward on FSDP2's sharded params: the whole model's ordinary run, one batch and
    one collective of partial norms a fully_shard group; on tensor-parallel params, by
    bucket_bytes; plain params in several ranks (DDP's, or one among DTensors) refused."""
    spawn("fsdp_in_backward", 2, ["lamb", "lamb16", "lars", "adagrad", "novograd", "lamb16_sr_bf16"])


def test_bad_sharding_raises_naming_the_param():
    """Partial placements, mixed meshes, grads or state sharded unlike their param,
    a plain grad of a DTensor param; and fuse_optimizer on DTensors."""
    spawn("bad_input", 2)


def test_dcp_checkpoint_resumes_at_another_world_size(tmp_path):
    names = ["lamb", "lamb16", "lars", "novograd"]
    spawn("dcp_save", 2, names, str(tmp_path))
    spawn("dcp_resume", 3, names, str(tmp_path))


def step_skeleton(code: str) -> str:
    """The kernels and collectives a generated step calls, in order (kernel numbers dropped).
    A kernel that reads no tensor of the model (params, grads, state: the graph inputs of
    one dimension or more), only 0-d inputs and small buffers (each param's packet of lr and
    betas), is left out: Inductor schedules those anywhere (torch 2.14 runs one before the
    collective's wait, overlapping it), and they are no pass over the data."""
    shapes = dict(re.findall(r"^\s+(arg\d+_1) = rand_strided\(\(([^)]*)\)", code, re.M))
    body = code[code.index("    def call(self, args):"):]
    out = []
    for kernel, kernel_args, op, extern in re.findall(
            r"^\s+(?:\w+ = )?(cpp_fused_\w+?)_\d+\(([^)]*)\)|(torch\.ops\.[\w.]+)\(|(extern_kernels\.\w+)\(", body, re.M):
        if kernel and not any(shapes.get(a.strip(), "") for a in kernel_args.split(",")):
            continue
        out.append(kernel or op or extern)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("path", ["auto", "lowering"])
def test_compiled_fsdp2_step_compiles_once_and_matches_eager(tmp_path, path):
    """The compiled step under FSDP2: clip sum of squares, all_reduce, the reduce phase,
    all_reduce of the reductions, the apply phase (snapshots in fixtures/). The local
    shards are graph inputs (the clip rides on grad_scale), so the default "auto"
    path calls the kernels; "lowering" fuses each phase into a generated kernel."""
    names = ["lamb", "lamb_clip"]
    spawn("fsdp_compiled", 2, names, str(tmp_path), path, timeout=300)
    for name in names:
        got = step_skeleton((tmp_path / f"{name}.py").read_text())
        snapshot = FIXTURES / f"fsdp2_{name}{'_lowered' if path == 'lowering' else ''}_step.txt"
        if os.environ.get("UPDATE_SNAPSHOTS"):
            snapshot.write_text(got)
        assert got == snapshot.read_text(), f"{name}: the compiled step now calls\n{got}"
        assert got.count("all_reduce") == (2 if name == "lamb_clip" else 1)


def test_ddp_and_zero_redundancy_optimizer_match_single_process():
    spawn("ddp_and_zero", 2, ["lamb_clip", "lamb", "lamb16", "lars_plain", "adagrad", "novograd"])
