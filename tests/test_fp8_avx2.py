"""The AVX2 float8 codec of the LAMB16 kernels (csrc/cpu/fp8_avx2.h) against
c10's scalar conversions, exhaustively: every code decodes, and every float32
bit pattern encodes, to c10's value and code (e4m3 saturating past 448, as c10
does from torch 2.13 on; tests/cpp/fp8_avx2_check.cpp, built here with the host
compiler; torch's header-only float8 code is the oracle). The op-level tests (test_lamb16_op.py) check the same kernels through
the op on in-range values."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import torch
from torch.utils.cpp_extension import include_paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _has_avx2_f16c() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx2" in flags and "f16c" in flags


@pytest.mark.skipif(not _has_avx2_f16c(), reason="this CPU has no AVX2 + F16C")
def test_avx2_float8_codec_equals_c10_on_every_float32(tmp_path):
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    exe = tmp_path / "fp8_avx2_check"
    incs = [f"-I{p}" for p in include_paths()]
    subprocess.run([cxx, "-std=c++17", "-O2", "-mavx2", "-mf16c", "-fopenmp", "-Wall", "-Werror",
                    "-I", os.path.join(ROOT, "csrc"), *incs, os.path.join(ROOT, "tests", "cpp", "fp8_avx2_check.cpp"),
                    "-o", str(exe)], check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))
    run = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split() == ["e4m3fn:", "ok", "e5m2:", "ok"]
