"""The CUDA kernels' machine code, read without a GPU (a CUDA build of the package; cuobjdump and
nvdisasm from a CUDA toolkit or PyPI): tools/cuda_sass.py finds in every chunk kernel of every
built architecture a main loop whose element accesses are all 16-byte and global, no local memory
(spills), occupancy of at least half an SM at its block size. And the launches a call of each op
makes, counted by the module's own launchers (what torch.compile's launch model reads)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inductor_lamb import _build

ROOT = Path(__file__).resolve().parents[1]
CUDA_BUILD = "cuda_archs" in _build.build_info()
pytestmark = pytest.mark.skipif(not CUDA_BUILD, reason="needs inductor_lamb built with its CUDA kernels")


def have_disassembler() -> bool:
    sys.path.insert(0, str(ROOT))
    try:
        from tools.cuda_sass import find_tool

        find_tool("cuobjdump", None), find_tool("nvdisasm", None)
        return True
    except FileNotFoundError:
        return False
    finally:
        sys.path.remove(str(ROOT))


@pytest.mark.skipif(not have_disassembler(), reason="needs cuobjdump and nvdisasm (pip install "
                                                    "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
def test_every_chunk_kernel_reads_and_writes_16_bytes_at_a_time(tmp_path):
    out = tmp_path / "sass.json"
    done = subprocess.run([sys.executable, "-m", "tools.cuda_sass", "--json", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())
    archs = {int(a.split("+")[0].replace(".", "")) for a in _build.build_info()["cuda_archs"].split()}
    assert {r["arch"] for r in rows} == archs & {80, 90, 100}
    for arch in {r["arch"] for r in rows}:
        kernels = {r["kernel"] for r in rows if r["arch"] == arch}
        for op, passes in {"lamb": ("pass1", "pass2"), "lamb16": ("pass1", "pass2"), "lars": ("norms", "update"),
                           "adagrad": ("update",), "novograd": ("norms", "update"), "engine": ("grad_sumsq",)}.items():
            for p in passes:  # every op's chunk kernels, in all six param variants
                assert len({k for k in kernels if k.startswith(f"{op}.{p}<")}) == 6, (arch, op, p)
    for r in rows:
        assert not r["problems"], r
        assert r["occupancy"] >= 0.5 and r["stack"] == r["local"] == 0, r
        widths = {k.split()[2] for k in r["accesses"] if "global" in k}
        assert widths == {"128-bit"}, r
        if r["kernel"].startswith("lamb16") and r["arch"] >= 89:  # paired hardware conversions
            assert r["fp8_per_element"] == (1.0 if ".pass1" in r["kernel"] else 2.0), r


@pytest.mark.parametrize("op, clipped, launches", [
    ("lamb_step_", False, 3), ("lamb_step_", True, 5), ("lamb_reduce_", False, 2), ("lamb_apply_", False, 2),
    ("lamb16_step_", False, 3), ("lamb16_reduce_", False, 2), ("lamb16_apply_", False, 2),
    ("lars_step_", False, 3), ("lars_reduce", False, 2), ("lars_apply_", False, 2), ("adagrad_step_", False, 2),
    ("novograd_step_", False, 3), ("novograd_reduce_", False, 2), ("novograd_apply_", False, 2),
])
def test_launches_per_call(op, clipped, launches):
    assert torch.ops.lamb._cuda_launches(op, clipped) == launches
    with pytest.raises(RuntimeError, match="unknown op 'sgd_step_'"):
        torch.ops.lamb._cuda_launches("sgd_step_")
