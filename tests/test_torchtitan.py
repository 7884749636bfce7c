"""TorchTitan trains with this package's optimizers (inductor_lamb.integrations.torchtitan),
really: its llama3 debug model (two layers) on CPU ranks with gloo, launched by torchrun
(tests/titan_cases.py: the CPU shims and the configs). Under FSDP2 on 2 ranks, tensor parallel
on 2, and both at once on 4 (FSDP2 over tensor parallel lays params out as _StridedShard),
each step of ``Lamb`` is a plain LAMB's step on whole tensors (norms of full tensors), checked
in the run; a distributed checkpoint resumes to the same losses; Lamb16, Lars and Adagrad train under
FSDP2 x tensor parallel. TorchTitan 0.3.0 needs torch 2.14 or newer (CI's newest-release step)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import our_group_keys, torch_optim_group_keys

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="needs torchtitan (torch 2.14)")

TESTS = Path(__file__).resolve().parent
FSDP2 = ["--parallelism.data_parallel_shard_degree", "2"]
TP = ["--parallelism.tensor_parallel_degree", "2"]
_STEP = re.compile(r"step:\s+(\d+)\s+loss:\s+([\d.]+)")


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("titan_assets")
    sys.path.insert(0, str(TESTS))
    try:
        import titan_cases

        titan_cases.make_assets(str(folder))
    finally:
        sys.path.remove(str(TESTS))
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(assets: Path, folder: Path, world: int, optimizer: str, *args: str) -> dict[int, float]:
    """Losses by step of a TorchTitan run (rank 0's log), its outputs in ``folder``; with
    ``CheckedLamb``, every step's check passed (titan_cases.checked)."""
    env = {**os.environ, "TITAN_ASSETS": str(assets), "TITAN_OPTIMIZER": optimizer, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_port",
           str(free_port()), str(TESTS / "titan_cases.py"), "--module", "titan_cases", "--config", "debug_model",
           "--dump_folder", str(folder), *args]
    done = subprocess.run(cmd, cwd=folder.parent, env=env, capture_output=True, text=True, timeout=600)
    log = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
    assert done.returncode == 0, log[-4000:]
    losses = {int(k): float(v) for k, v in _STEP.findall(log)}
    assert losses, log[-4000:]
    if optimizer == "CheckedLamb":
        assert log.count("reference check: largest error") == len(losses), log[-4000:]
    return losses


def assert_same_losses(a: dict[int, float], b: dict[int, float]) -> None:
    assert a.keys() == b.keys()
    for k in a:  # (TorchTitan logs five decimals)
        assert abs(a[k] - b[k]) <= 3e-5 + 1e-5 * abs(b[k]), (k, a, b)


@pytest.mark.parametrize("world, layout", [(2, FSDP2), (2, TP), (4, FSDP2 + TP)], ids=["fsdp2", "tp", "fsdp2 x tp"])
def test_lamb_is_whole_tensor_lamb(assets, tmp_path, world, layout):
    """Each step of ``Lamb`` equals, in the run, a plain LAMB's step on whole tensors from the same
    params, grads and moments (its norms from DTensor.full_tensor()), to float32 rounding."""
    lamb = train(assets, tmp_path / "lamb", world, "CheckedLamb", *layout)
    assert len(lamb) == 4 and lamb[4] < lamb[1]
    if layout == FSDP2:  # resumed from the step-2 checkpoint: the same steps 3 and 4
        shutil.rmtree(tmp_path / "lamb" / "checkpoint" / "step-4")
        resumed = train(assets, tmp_path / "lamb", world, "CheckedLamb", *layout)
        assert sorted(resumed) == [3, 4]
        assert_same_losses(resumed, {k: lamb[k] for k in (3, 4)})


def test_checked_lamb_fails_on_shard_norms(assets, tmp_path):
    """The check catches what it is for: a LAMB taking each shard's norms for the tensor's."""
    env = {**os.environ, "TITAN_ASSETS": str(assets), "TITAN_OPTIMIZER": "CheckedLamb", "TITAN_SHARD_NORMS": "1"}
    folder = tmp_path / "wrong"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(TESTS / "titan_cases.py"), "--module", "titan_cases", "--config", "debug_model", "--dump_folder",
           str(folder), "--training.steps", "1", *FSDP2]
    done = subprocess.run(cmd, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode != 0 and "away from a whole-tensor LAMB's step" in done.stdout + done.stderr


def test_every_optimizer_trains_under_fsdp2_x_tensor_parallel(assets, tmp_path):
    """Lamb16 on the attention, Lars on the feed-forward layers, NovoGrad on the norms, Adagrad on
    the rest: one container of four optimizers, as TorchTitan's param group patterns make it."""
    losses = train(assets, tmp_path / "mixed", 4, "mixed", *FSDP2, *TP)
    # (four steps on changing batches: the later losses below the first, not each below the last)
    assert len(losses) == 4 and all(v == v for v in losses.values()) and min(losses[3], losses[4]) < losses[1], losses


def test_example_config_module_names_our_container():
    """examples/torchtitan_lamb.py, as TorchTitan's trainer reads it (--module, --config)."""
    from torchtitan.config import ConfigManager

    from inductor_lamb.integrations.torchtitan import OptimizersContainer

    config = ConfigManager().parse_args(["--module", "examples.torchtitan_lamb", "--config", "llama3_8b_lamb",
                                         "--parallelism.tensor_parallel_degree", "2"])
    assert isinstance(config.optimizer, OptimizersContainer.Config)
    assert [g.optimizer_name for g in config.optimizer.param_groups] == ["Lamb"]
    assert config.parallelism.tensor_parallel_degree == 2


def test_no_group_key_collides_with_what_torchtitan_writes():
    """The param-group keys TorchTitan's optimizers container (its AdamW config) and its LR
    schedulers add to a torch optimizer's groups, learned by stepping them: none is a key of ours
    (torch.optim's own keys mean the same)."""
    import torch
    from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer, default_adamw

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    container = OptimizersContainer(default_adamw(lr=1e-3), model_parts=[model])
    made = {k for o in container for g in o.param_groups for k in g}
    scheds = LRSchedulersContainer.Config(warmup_steps=1).build(optimizers=container, training_steps=4)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        container.step()
        scheds.step()
        container.zero_grad()
    written = (made - torch_optim_group_keys()) | ({k for o in container for g in o.param_groups for k in g} - made)
    assert "initial_lr" in written, written  # (what its LambdaLR writes)
    assert not written & our_group_keys(), written
