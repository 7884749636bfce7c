"""Build of ``inductor_lamb._C``.

* Ops are registered with ``TORCH_LIBRARY`` (csrc/ops.cpp); the module has no
  pybind11 and is built against the stable Python ABI (abi3).
* CPU kernels (``csrc/cpu/*_kernel.cpp``) are compiled once per ISA (generic,
  AVX2, AVX512) with that ISA's flags and a distinct ``CPU_CAPABILITY``
  namespace; the glue picks one at run time, so one build runs on any x86-64.
* The CUDA part (``csrc/cuda``: the kernels' ``.cu`` files and the
  ``TORCH_LIBRARY_IMPL(lamb, CUDA)`` glue) is added only when the installed
  torch has CUDA and nvcc is found (``INDUCTOR_LAMB_NO_CUDA=1`` skips it); the
  CPU torch wheel builds CPU only.

Build with ``pip install --no-build-isolation .`` so the installed torch is used.
"""

from __future__ import annotations

import glob
import os
import platform

import torch
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join("csrc")

COMMON_FLAGS = ["-O3", "-g0", "-fopenmp", "-std=c++17", "-Wno-unused-function"]

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
    import subprocess

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
    import shutil
    import subprocess
    import sys

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
    from torch.utils.cpp_extension import include_paths

    isa_macros = [(f"INDUCTOR_LAMB_HAVE_{isa}", "1") for isa in ISA_FLAGS if isa != "DEFAULT"]
    kwargs = dict(
        include_dirs=[os.path.join(ROOT, CSRC)] + include_paths(),  # CUDAExtension adds the CUDA ones
        define_macros=isa_macros,  # BuildExtension adds Py_LIMITED_API itself
        extra_compile_args={"cxx": COMMON_FLAGS},
        extra_link_args=["-fopenmp"],
        py_limited_api=True,
    )
    if with_cuda():
        kwargs["extra_compile_args"]["nvcc"] = ["-O3", "-std=c++17", "-lineinfo"]
        return [CUDAExtension("inductor_lamb._C", glue_sources() + cuda_sources(), **kwargs)]
    return [CppExtension("inductor_lamb._C", glue_sources(), **kwargs)]


setup(
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
