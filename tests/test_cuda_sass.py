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
from inductor_lamb.spec import STEPS

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
    from tools.cuda_sass import CUDA_SOURCES

    for arch in {r["arch"] for r in rows}:
        kernels = {r["kernel"] for r in rows if r["arch"] == arch}
        for source in CUDA_SOURCES:  # every op's chunk kernels (and the engine's), in all six param variants
            passes = {k.split("<")[0] for k in kernels if k.startswith(f"{source}.")}
            # (a layer-wise op: a reduction pass and an update pass; an element-wise one, its update)
            expected = 1 if source == "engine" or not spec_of(source).reduce_op else 2
            assert len(passes) == expected, (arch, source, passes)
            for p in passes:
                assert len({k for k in kernels if k.startswith(f"{p}<")}) == 6, (arch, p)
    for r in rows:
        assert not r["problems"], r
        assert r["occupancy"] >= 0.5 and r["stack"] == r["local"] == 0, r
        widths = {k.split()[2] for k in r["accesses"] if "global" in k}
        assert widths == {"128-bit"}, r
        if r["kernel"].startswith("lamb16") and r["arch"] >= 89:  # paired hardware conversions
            assert r["fp8_per_element"] == (1.0 if ".pass1" in r["kernel"] else 2.0), r


def spec_of(family: str):
    return next(s for s in STEPS if s.family == family)


def _launch_cases():
    """Per op: a layer-wise one-call step launches its reduction pass, the per-tensor totals and
    its update (3; with global clipping 2 more: the grads' sum of squares and its total), each
    phase 2; an element-wise step its update and the step counts (2)."""
    for spec in STEPS:
        if spec.reduce_op:
            yield spec.name, False, 3
            if "max_grad_norm" in spec.names:
                yield spec.name, True, 5
            yield spec.reduce_op, False, 2
            yield spec.apply_op, False, 2
        else:
            yield spec.name, False, 2


@pytest.mark.parametrize("op, clipped, launches", list(_launch_cases()))
def test_launches_per_call(op, clipped, launches):
    assert torch.ops.lamb._cuda_launches(op, clipped) == launches
    with pytest.raises(RuntimeError, match="unknown op 'sgd_step_'"):
        torch.ops.lamb._cuda_launches("sgd_step_")
