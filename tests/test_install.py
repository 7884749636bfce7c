"""What the build records and registers: the torch the module was built against (read from
its file before loading), the CUDA kernels of a CUDA build, and the clear error for a module
built against another torch. (The wheel built and installed with no compiler: .ci/run and
tests/wheel_smoke.py.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import inductor_lamb
from inductor_lamb import _build, _versions
from inductor_lamb.spec import SPECS


def test_build_info_is_the_installed_torch():
    info = _build.build_info()
    assert info["torch"] == torch.__version__
    assert _build._parse(torch.ops.lamb._build_info()) == info  # the file's marker is the loaded module's


@pytest.mark.parametrize("key", ["CPU", "CUDA"])
def test_every_op_has_a_kernel_for_each_built_backend(key):
    """A CPU build registers CPU kernels only; a build with CUDA kernels (a CUDA torch with a
    toolkit, GPU or not) registers a CUDA kernel for every op too."""
    built = key == "CPU" or "cuda" in _build.build_info()
    for name in SPECS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"lamb::{name}", key) == built, (name, key)
    if key == "CUDA" and built:
        assert _build.build_info()["cuda"] == torch.version.cuda
        assert _build.build_info()["cuda_archs"]


@pytest.mark.parametrize("info, installed, cuda, says", [
    ({"torch": "2.13.0+cpu"}, "2.14.1+cu130", "13.0", "built against torch 2.13.0+cpu, but torch 2.14.1+cu130"),
    ({"torch": "2.14.1+cu130", "cuda": "13.0"}, "2.14.0+cpu", None, "built with CUDA kernels against torch 2.14.1"),
    ({"torch": "2.14.1+cu130", "cuda": "13.0"}, "2.14.0+cu128", "12.8", None),  # same release: loads
    ({"torch": "2.13.0+cpu"}, "2.13.1+cu130", "13.0", None),
    ({}, "2.13.0", None, None),  # unrecorded: the loader decides
])
def test_mismatch(info, installed, cuda, says):
    reason = _build.mismatch(info, installed, cuda)
    assert reason == says if says is None else says in reason


def test_a_module_for_another_torch_is_refused_before_loading(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.9.0+cpu")
    with pytest.raises(ImportError, match=r"built against torch .*, but torch 2\.9\.0\+cpu is installed; rebuild it "
                                          r"against the installed torch: .*pip install --no-build-isolation -e \."):
        _build.load_extension()
    assert inductor_lamb._C is not None


def test_ci_runs_the_test_command_of_the_readme_verbatim():
    root = Path(__file__).resolve().parents[1]
    readme, ci = (root / "README.md").read_text(), (root / ".ci" / "run").read_text()
    command = re.search(r"Install and run the tests.*?```bash\n(.*?)```", readme, re.S).group(1).strip()
    assert "hypothesis" in command and command in ci


def test_a_checkout_without_its_compiled_module_says_so(tmp_path):
    """The source tree of a checkout imported where the package was installed with `pip install .`
    (no module built in the tree; `python -m` from the checkout's root puts the tree first):
    an error that says why and what to do, not a partially initialized module."""
    import os
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "inductor_lamb", tmp_path / "inductor_lamb", ignore=shutil.ignore_patterns("_C*", "__pycache__"))
    (tmp_path / "csrc").mkdir()
    shutil.copy(root / "setup.py", tmp_path / "setup.py")
    # -S: no site initialization, so no editable install's import hook (its .pth) finds the real module
    torch_site = str(Path(torch.__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-S", "-c", "import inductor_lamb"], cwd=tmp_path, capture_output=True,
                          text=True, env={"PYTHONPATH": torch_site, "PATH": os.environ.get("PATH", "")})
    assert done.returncode != 0
    assert (f"inductor_lamb was imported from the source checkout at {tmp_path.resolve()}, which has no compiled "
            "module: an editable install") in done.stderr, done.stderr[-2000:]


def test_the_dependency_floor_is_the_supported_floor():
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    floor = "{}.{}".format(*_versions.FLOOR)
    assert re.findall(r'"torch>=([0-9.]+)"', text) == [floor, floor]  # (build-system and dependencies)
    assert _versions.release(_versions.TESTED[0]) == _versions.FLOOR
    assert _versions.refusal(torch.__version__) is None


@pytest.mark.parametrize("version, refused", [("2.10.2+cu128", True), ("1.13.1", True), ("2.11.0+cu130", False),
                                              ("2.16.0.dev20261201", False)])
def test_the_range(version, refused):
    message = _versions.refusal(version)
    assert (message is not None) == refused
    if refused:
        assert version in message and "torch 2.11 or newer" in message and "does not replace" in message
    assert _versions.untested(version) == (version.startswith("2.16"))


def test_installing_into_an_older_torch_fails_at_once_and_downloads_nothing(tmp_path):
    """pip prepares the metadata (setup.py, in the user's environment) before it resolves any
    dependency: under a torch older than the floor that step fails, naming the range, and pip
    never reaches an index (``--no-index`` would fail differently if it tried)."""
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "2.10.0+cpu"\n')
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--dry-run",
                           "--no-cache-dir", str(root)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "fake")}, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "supports torch 2.11 or newer" in out and "2.10.0+cpu is installed" in out, out
