"""Loading the compiled module ``inductor_lamb._C``, with a clear error when it does not
belong to the installed torch.

A compiled PyTorch extension works only with the torch release it was built against (torch's
C++ ABI changes between releases): loaded under another one it fails with an undefined symbol,
or worse. ``setup.py`` compiles into the module a marked string naming that torch
(``build_info.h``); it is read from the module's file *before* the module is loaded, so a
module built for another torch release, or with CUDA kernels under a torch without CUDA, is
refused with an error that names both and the command that rebuilds.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import torch

from ._versions import release

__all__ = ["build_info", "load_extension", "mismatch"]

_MARKER = b"INDUCTOR_LAMB_BUILD_INFO:"

REBUILD = ("rebuild it against the installed torch: in the source checkout, "
           "`pip install --no-build-isolation -e .` (or make a new wheel there with "
           "`pip wheel --no-build-isolation --no-deps .`), or install the torch it was built for")


def _parse(text: str) -> dict[str, str]:
    items = dict(item.partition("=")[::2] for item in text.split(";") if item)
    return {k: v for k, v in items.items() if v}


def build_info() -> dict[str, str]:
    """What ``inductor_lamb._C`` was built against, read from its file without loading it:
    ``{"torch": "2.14.1+cu130", "cuda": "13.0", "cuda_archs": "8.0 9.0 10.0+PTX"}``
    (no ``cuda`` keys for a CPU-only build); empty if the module is missing or unmarked."""
    spec = importlib.util.find_spec(f"{__package__}._C")
    if spec is None or not spec.origin:
        return {}
    try:
        with open(spec.origin, "rb") as f:
            data = f.read()
    except OSError:
        return {}
    start = data.find(_MARKER)
    if start < 0:
        return {}
    start += len(_MARKER)
    return _parse(data[start:data.index(b"\0", start)].decode("ascii", "replace"))


def mismatch(info: dict[str, str], installed: str, installed_cuda: str | None) -> str | None:
    """Why a module built as ``info`` cannot load under torch ``installed`` (CUDA version
    ``installed_cuda``, None for a CPU build), or None."""
    built = info.get("torch")
    if not built:
        return None
    if release(built) != release(installed):  # (the part of a version the C++ ABI follows)
        return f"inductor_lamb was built against torch {built}, but torch {installed} is installed"
    if info.get("cuda") and not installed_cuda:
        return (f"inductor_lamb was built with CUDA kernels against torch {built}, but the installed torch "
                f"{installed} has no CUDA")
    return None


def _checkout() -> Path:
    return Path(__file__).resolve().parent.parent


def _in_checkout() -> bool:
    """Whether this package is the source tree of a checkout (setup.py beside it)."""
    return (_checkout() / "setup.py").is_file() and (_checkout() / "csrc").is_dir()


def load_extension() -> ModuleType:
    """Imports ``inductor_lamb._C`` (which registers ``torch.ops.lamb.*``), or raises an
    ImportError that says which torch it needs and how to rebuild it."""
    info = build_info()
    if importlib.util.find_spec(f"{__package__}._C") is None and _in_checkout():
        raise ImportError(f"inductor_lamb was imported from the source checkout at {_checkout()}, which has no "
                          "compiled module: an editable install (`pip install --no-build-isolation -e .`) builds "
                          "it there; to use a package installed with `pip install .`, run from outside the "
                          "checkout's root (`python -m` and `python -c` put the working directory first on "
                          "sys.path).")
    reason = mismatch(info, torch.__version__, torch.version.cuda)
    if reason is not None:
        raise ImportError(f"{reason}; {REBUILD}.")
    try:
        from . import _C
    except ImportError as e:  # undefined symbols, a missing library, no module at all
        built = f"torch {info['torch']}" if "torch" in info else "an unknown torch"
        raise ImportError(f"inductor_lamb's compiled module (built against {built}) does not load under torch "
                          f"{torch.__version__}: {e}; {REBUILD}.") from e
    return _C
