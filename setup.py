"""Build of ``inductor_lamb._C``.

* Ops are registered with ``TORCH_LIBRARY`` (csrc/ops.cpp); the module has no
  pybind11 and is built against the stable Python ABI (abi3).
* CPU kernels (``csrc/cpu/*_kernel.cpp``) are compiled once per ISA (generic,
  AVX2, AVX512) with that ISA's flags and a distinct ``CPU_CAPABILITY``
  namespace; the glue picks one at run time, so one build runs on any x86-64.
* The CUDA part (``csrc/cuda``: the kernels' ``.cu`` files and the
  ``TORCH_LIBRARY_IMPL(lamb, CUDA)`` glue) is added only when the installed
  torch has CUDA and a CUDA toolkit is found (``INDUCTOR_LAMB_NO_CUDA=1`` skips
  it); the CPU torch wheel builds CPU only. Without ``TORCH_CUDA_ARCH_LIST``
  the kernels are built for the visible GPUs, or with none visible (a build
  node, a CUDA torch on a CPU machine) for ``DEFAULT_CUDA_ARCHS``.
* The C++ standard is the installed torch's own (torch's ``BuildExtension``
  picks the one its headers need: C++17 up to torch 2.13's, C++20 from 2.14).
* The module carries the torch it was built against (``build_info.h``), so that
  importing it under another torch says so clearly.

Build with ``pip install --no-build-isolation .`` so the installed torch is used.
"""

from __future__ import annotations

import glob
import os
import platform
import shutil
import subprocess
import sys

from setuptools import setup


def _torch_range():
    """inductor_lamb/_versions.py, by path (the package itself needs the module being built)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_inductor_lamb_versions", os.path.join(os.path.dirname(os.path.abspath(__file__)), "inductor_lamb", "_versions.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The supported torch, checked before anything is built or resolved: pip prepares the metadata
# (this file, in the user's environment under --no-build-isolation) before it resolves the
# dependencies, so an unsupported torch fails here at once and is never replaced.
_RANGE = _torch_range()
try:
    import torch
except ImportError:
    sys.exit(f"inductor_lamb builds against the installed torch, and none is: install {_RANGE.range_text()} "
             "first, then build with pip install --no-build-isolation")
if _RANGE.refusal(torch.__version__):
    sys.exit(_RANGE.refusal(torch.__version__))
if _RANGE.untested(torch.__version__):
    print(f"inductor_lamb: torch {torch.__version__} is newer than the tested releases ({', '.join(_RANGE.TESTED)}); "
          "building against it", file=sys.stderr)


def find_cuda_home() -> str | None:
    """The CUDA toolkit's folder. torch guesses it from ``CUDA_HOME`` or the folder above the
    ``nvcc`` on PATH, which is wrong where that ``nvcc`` is a wrapper script or a link farm
    (``/usr/local/bin/nvcc``: torch then looks for ``cuda_runtime_api.h`` under ``/usr/local``).
    A guess without the runtime headers falls back to the usual install folders."""
    def is_toolkit(path: str | None) -> bool:
        return bool(path) and os.path.isfile(os.path.join(path, "include", "cuda_runtime_api.h")) and \
            os.path.isfile(os.path.join(path, "bin", "nvcc"))

    given = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if given:
        return given  # the user's choice, right or wrong (torch then says what is missing)
    nvcc = shutil.which("nvcc")
    candidates = [os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))] if nvcc else []
    if torch.version.cuda:
        candidates.append(f"/usr/local/cuda-{torch.version.cuda}")
    candidates.append("/usr/local/cuda")
    return next((c for c in candidates if is_toolkit(c)), None)


# Before torch.utils.cpp_extension reads it at import.
_CUDA_HOME = find_cuda_home() if torch.version.cuda else None
if _CUDA_HOME is not None:
    os.environ["CUDA_HOME"] = _CUDA_HOME

from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension, include_paths  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("csrc")

# No -std: torch's BuildExtension adds the standard its own headers need (and nvcc takes one -std only).
COMMON_FLAGS = ["-O3", "-g0", "-fopenmp", "-Wno-unused-function"]

# The CUDA architectures of a build that sees no GPU and has no TORCH_CUDA_ARCH_LIST: A100
# (sm_80), H100/H200 (sm_90), B200 (sm_100), with PTX of the newest for later GPUs (JIT-compiled
# by the driver on first use). Architectures the found nvcc cannot build are left out.
DEFAULT_CUDA_ARCHS = ["8.0", "9.0", "10.0"]

# Per-ISA flags, as ATen uses for its own CPU_CAPABILITY kernels.
IS_X86 = platform.machine().lower() in ("x86_64", "amd64")
ISA_FLAGS = {"DEFAULT": []}
if IS_X86 and os.environ.get("INDUCTOR_LAMB_NO_ISA", "0") != "1":
    ISA_FLAGS["AVX2"] = ["-mavx2", "-mfma", "-mf16c"]
    ISA_FLAGS["AVX512"] = [
        "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c",
    ]

# GCC builds a vector constant from an immediate (mov, vmovd, vpbroadcastd) each
# time it is needed in a loop short of registers, as LAMB16's pass 2 is: 20-odd
# instructions a loop step. Turned off, constants are loaded from memory (about
# 10% off LAMB16's stochastic-rounding step on AVX2 and AVX512). GCC only: the
# flag is tried on the compiler first.
VECTOR_FLAGS_IF_SUPPORTED = ["-mtune-ctrl=^inter_unit_moves_to_vec"]


def supported_flags(compiler: list[str], flags: list[str]) -> list[str]:

    ok = []
    for flag in flags:
        probe = subprocess.run(compiler + [flag, "-x", "c++", "-fsyntax-only", "-"], input=b"int x;\n",
                               capture_output=True)
        if probe.returncode == 0 and not probe.stderr:
            ok.append(flag)
    return ok


def kernel_sources() -> list[str]:
    return sorted(glob.glob(os.path.join(CSRC, "cpu", "*_kernel.cpp")))


def with_cuda() -> bool:
    return torch.version.cuda is not None and CUDA_HOME is not None and os.environ.get("INDUCTOR_LAMB_NO_CUDA", "0") != "1"


def cuda_arch_list() -> str:
    """``TORCH_CUDA_ARCH_LIST`` when set; the visible GPUs' when there are any (torch's own
    rule); else ``DEFAULT_CUDA_ARCHS`` that this nvcc supports, PTX on the newest."""
    given = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if given:
        return given
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
        return ";".join(f"{major}.{minor}" for major, minor in caps)
    listed = subprocess.run([os.path.join(CUDA_HOME, "bin", "nvcc"), "--list-gpu-arch"], capture_output=True,
                            text=True).stdout.split()
    archs = [a for a in DEFAULT_CUDA_ARCHS if f"compute_{a.replace('.', '')}" in listed] or DEFAULT_CUDA_ARCHS[:1]
    return ";".join(archs[:-1] + [archs[-1] + "+PTX"])


def build_info_header(folder: str, cuda_archs: str | None) -> str:
    """Writes ``build_info.h`` into ``folder``: what the module is built against, as one
    string that ``inductor_lamb/_build.py`` reads from the module's file before loading it."""
    archs = " ".join((cuda_archs or "").replace(";", " ").split())  # (";" separates the items)
    info = f"torch={torch.__version__};cuda={torch.version.cuda if cuda_archs else ''};cuda_archs={archs}"
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "build_info.h")
    text = f'#pragma once\n#define INDUCTOR_LAMB_BUILD_INFO "{info}"\n'
    if not os.path.exists(path) or open(path).read() != text:  # unchanged: no rebuild of ops.cpp
        with open(path, "w") as f:
            f.write(text)
    return folder


def cuda_sources() -> list[str]:
    return sorted(glob.glob(os.path.join(CSRC, "cuda", "*.cu")) + glob.glob(os.path.join(CSRC, "cuda", "*.cpp")))


def glue_sources() -> list[str]:
    srcs = [os.path.join(CSRC, "ops.cpp")]
    srcs += sorted(glob.glob(os.path.join(CSRC, "common", "*.cpp")))
    srcs += sorted(
        s for s in glob.glob(os.path.join(CSRC, "cpu", "*.cpp")) if not s.endswith("_kernel.cpp")
    )
    return srcs


def check_shared_libstdcxx(path: str) -> None:
    """Refuses an extension that carries its own copy of libstdc++. torch's libraries
    use the shared one; with a second, static copy inside ``_C`` the process has two
    sets of locale facets, and the first error message ``_C`` formats crashes
    (SIGSEGV in ``std::ostream``, seen on a CUDA image whose ``CXX=/opt/gcc/bin/g++``
    links libstdc++ statically). Linux only, and only where ``readelf`` exists."""
    readelf = shutil.which("readelf")
    if not sys.platform.startswith("linux") or readelf is None:
        return
    dynamic = subprocess.run([readelf, "-d", path], capture_output=True, text=True).stdout
    if "libstdc++" not in dynamic:
        raise RuntimeError(
            f"{path} does not load the shared libstdc++: the C++ compiler ({os.environ.get('CXX', 'c++')}) linked "
            "it statically, and such an extension crashes on its first error message. Build with a compiler "
            "that links libstdc++ dynamically, e.g. CC=gcc CXX=g++ pip install --no-build-isolation .")


class BuildExt(BuildExtension):
    """Compiles the ISA kernel objects, then links them after the glue objects.

    Link order matters: an inline function from a header that both a generic
    and an AVX512 object contain is kept from the first object the linker sees,
    so the generic objects come first and no AVX512 code leaks into the
    generic path.
    """

    def build_extension(self, ext):
        archs = os.environ.get("TORCH_CUDA_ARCH_LIST") if with_cuda() else None
        ext.include_dirs = list(ext.include_dirs) + [build_info_header(os.path.abspath(os.path.join(self.build_temp, "generated")),
                                                                       archs)]
        isa_objects = []
        vector_flags = supported_flags(list(self.compiler.compiler_so[:1]), VECTOR_FLAGS_IF_SUPPORTED)
        for isa, flags in ISA_FLAGS.items():
            if isa != "DEFAULT":
                flags = flags + vector_flags
            out = os.path.join(self.build_temp, "isa_" + isa.lower())
            macros = [("CPU_CAPABILITY", isa), (f"CPU_CAPABILITY_{isa}", None)]
            isa_objects += self.compiler.compile(
                kernel_sources(),
                output_dir=out,
                macros=macros,
                include_dirs=ext.include_dirs,
                # ext's cxx args already carry what BuildExtension added (ABI macro, ...)
                extra_postargs={"cxx": list(ext.extra_compile_args["cxx"]) + flags},
            )
        ext.extra_objects = list(ext.extra_objects or []) + isa_objects
        super().build_extension(ext)
        check_shared_libstdcxx(self.get_ext_fullpath(ext.name))


def extensions():
    isa_macros = [(f"INDUCTOR_LAMB_HAVE_{isa}", "1") for isa in ISA_FLAGS if isa != "DEFAULT"]
    kwargs = dict(
        include_dirs=[os.path.join(ROOT, CSRC)] + include_paths(),  # CUDAExtension adds the CUDA ones
        define_macros=isa_macros,  # BuildExtension adds Py_LIMITED_API itself
        extra_compile_args={"cxx": COMMON_FLAGS},
        extra_link_args=["-fopenmp"],
        py_limited_api=True,
    )
    if with_cuda():
        # torch's BuildExtension reads the list from the environment when it compiles.
        os.environ["TORCH_CUDA_ARCH_LIST"] = cuda_arch_list()
        kwargs["extra_compile_args"]["nvcc"] = ["-O3", "-lineinfo"]
        return [CUDAExtension("inductor_lamb._C", glue_sources() + cuda_sources(), **kwargs)]
    return [CppExtension("inductor_lamb._C", glue_sources(), **kwargs)]


setup(
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
