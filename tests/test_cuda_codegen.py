"""The compiled optimizer step on CUDA, generated and compiled without a GPU: Inductor's
Triton code for a described H100 (``tools/cuda_codegen.py``, in a process of its own:
its shims of torch and Triton are process-wide), every kernel compiled to an sm_90 cubin.

Counts, not timings: the default path's launches per step against torch's compiled AdamW on
the same tensors, and the lowering's launches against the model the ``"auto"`` rule decides
by (``inductor_lamb/_inductor/cost.py``); and the generated kernels' results, run on CPU
tensors by Triton's interpreter. Needs a CUDA build of torch with Triton; no GPU.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inductor_lamb.spec import STEPS

ROOT = Path(__file__).resolve().parents[1]



def _refused() -> str | None:
    """Why the described-GPU tool refuses this torch / Triton pair (its shims are checked per
    release: CI runs these tests on the release they were checked with), or None."""
    if torch.version.cuda is None or importlib.util.find_spec("triton") is None:
        return "needs a CUDA build of torch with Triton (no GPU needed)"
    sys.path.insert(0, str(ROOT))
    try:
        from tools.described_gpu import check_versions

        check_versions()
    except RuntimeError as e:
        return str(e)
    finally:
        sys.path.remove(str(ROOT))
    return None


_REFUSED = _refused()
pytestmark = pytest.mark.skipif(_REFUSED is not None, reason=_REFUSED or "")

NS = (10, 100)
LOWERED_NS = (10,)  # (the lowering's launches at N = 100 and 1000: RESULTS, "CUDA code generation")


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The default path and torch's compiled AdamW at every N, the lowering (the longest
    compile) at the smaller; each kernel compiled for its first autotuning config (the CI's
    time; the benchmark's default compiles them all)."""
    out, rows = tmp_path_factory.mktemp("codegen"), []
    for i, (ns, opts, paths) in enumerate([(NS, ["AdamW", "Lamb", "Lamb16"], ["auto"]),
                                           (LOWERED_NS, ["Lars", "Adagrad"], ["auto"]),
                                           (LOWERED_NS, ["Lamb", "Lamb16"], ["lowering"])]):
        subprocess.run([sys.executable, "-m", "tools.cuda_codegen", "--n", *map(str, ns), "--opt", *opts,
                        "--paths", *paths, "--configs", "1", "--json", str(out / f"{i}.json")],
                       check=True, timeout=1500, cwd=ROOT)
        rows += json.loads((out / f"{i}.json").read_text())
    return rows


def _row(rows: list[dict], opt: str, path: str, n: int) -> dict:
    (row,) = [r for r in rows if r["optimizer"] == opt and r["path"] in (path, "-") and r["n"] == n]
    return row


def test_every_kernel_compiles_to_a_cubin(rows: list[dict]) -> None:
    assert len(rows) == len(NS) * 3 + len(LOWERED_NS) * 4
    for r in rows:
        assert "error" not in r, r
        assert r["cubins_missing"] == [], r
    for n in LOWERED_NS:
        for opt in ("Lamb", "Lamb16"):
            assert _row(rows, opt, "lowering", n)["kernels"] > 0  # (the step really was lowered)


@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("opt", ["Lamb", "Lamb16"])
def test_default_step_launches_at_most_twice_adamw(rows: list[dict], opt: str, n: int) -> None:
    """torch.compile(opt.step) on the default path: launches per step, the CUDA kernel's
    included, at most twice those of torch's compiled AdamW on the same tensors, plus two."""
    adamw = _row(rows, "AdamW", "-", n)["launches"]
    auto = _row(rows, opt, "auto", n)
    assert auto["launches"] + auto["engine_launches"] <= 2 * adamw + 2, (auto, adamw)


def test_compiled_opt_step_on_cuda_writes_only_static_inputs(rows: list[dict]) -> None:
    """``torch.compile(opt.step)`` on CUDA params (its op calls traced with their tensors, for
    CUDA graphs) writes no graph input that is not a static address: Inductor's CUDA-graph
    mutation check, on the graphs compiled for the described GPU, finds nothing to skip for."""
    ours = [r for r in rows if r["optimizer"] != "AdamW"]
    assert {r["optimizer"] for r in ours} == {"Lamb", "Lamb16", "Lars", "Adagrad"}
    for r in ours:
        assert r["cudagraph_blockers"] == [], r


@pytest.mark.parametrize("n", LOWERED_NS)
@pytest.mark.parametrize("opt", ["Lamb", "Lamb16"])
def test_lowering_launches_against_the_model(rows: list[dict], opt: str, n: int) -> None:
    """The model's count is a lower bound of what the lowering generates, and close to it
    (element-wise work in foreach groups: the rest is one kernel per tensor reduction); by
    it, one call of the CUDA kernel is the cheaper path, which "auto" takes."""
    row = _row(rows, opt, "lowering", n)
    model = row["model"]
    assert model["lowering"] <= row["launches"] <= 2 * model["lowering"], row
    assert model["engine"] < model["lowering"]
    assert n <= row["launches"]  # (the reductions: at least one kernel per tensor)


def test_generated_kernels_run_by_the_interpreter_match_the_reference(tmp_path) -> None:
    """Each op's lowered step, generated for an H100, run on CPU tensors by Triton's interpreter
    (mixed, transposed, 0-d and empty tensors; three steps with a changing lr): the float64
    reference's params and state to float32 rounding."""
    out = tmp_path / "interpret.json"
    ops = [spec.name for spec in STEPS]  # every step op
    subprocess.run([sys.executable, "-m", "tools.cuda_codegen", "--interpret", *ops,
                    "--json", str(out)], check=True, timeout=900, cwd=ROOT)
    rows = json.loads(out.read_text())
    assert [r["op"] for r in rows] == ops
    for r in rows:
        assert "params" in r["max_rel_error"], r
        for name, error in r["max_rel_error"].items():
            assert error < 1e-5, (r["op"], name, error)


FLOAT64_STEP = """
import sys, torch
import tools.described_gpu as dg
import inductor_lamb
for name in sys.argv[1:]:
    with dg.described_gpu(dg.GPUS["h100"], 1), dg.fake_mode():
        params = [torch.nn.Parameter(torch.randn(s, dtype=torch.float64, device="cuda")) for s in [(33, 17), (), (7,)]]
        opt = getattr(inductor_lamb, name)(params, lr=0.01)
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()  # (state first, as a training loop makes it)
        out = dg.generate(opt.step)
    assert out.kernels > 0 and not out.cubins_missing, (name, out.cubins_missing)
    print(name, out.kernels)
"""


def test_float64_steps_compile_for_cuda() -> None:
    """float64 params step through the reference math, which Inductor lowers to Triton:
    LAMB16's float8 moments then convert to and from float64, which Triton does only
    through float32 (on an H100, a direct conversion failed to compile)."""
    done = subprocess.run([sys.executable, "-c", FLOAT64_STEP, "Lamb16", "Lamb"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["Lamb16", "Lamb"], done.stdout
