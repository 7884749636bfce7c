"""The CPU kernels' machine code, read from the built module's symbol table (binutils' ``nm``):
every function compiled for a vector instruction set (AVX2, AVX512) is one of the loops that run
whole chunks of elements. No helper of an element loop (a load or store, a float8 codec, the
moments, the update, the rounding, torch's at::vec operations) may be left out of line: GCC then
passes the vectors through memory at every call, and LAMB16's CPU step took 2.6-3.2x fused AdamW's
time that way where the same code inlined takes 2.1x (docs/decisions.md, "Where LAMB16's CPU time
goes"). The helpers named INDUCTOR_LAMB_LOOP_INLINE cannot regress (GCC refuses to build them out
of line); this guards the ones left to GCC's judgement."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")

# The vector builds' namespaces (cpu/vec_engine.h: CPU_CAPABILITY), as mangled names spell them.
ISAS = ("AVX2", "AVX512")
# The functions that run whole chunks, a call per chunk or per pass (cpu/vec_engine.h, the
# *_kernel.cpp files): the only ones that may stand alone.
CHUNK_LOOPS = {"pass1", "pass1_chunk", "pass2", "pass2_loop", "pass2_chunk", "update", "sumsq", "one_state_update", "vec_range", "run_chunks",
               "for_each_chunk", "for_each_typed_chunk"}
# ... and torch's threading, which calls them once a thread (the OpenMP region's body).
THREADING = (["at", "internal", "invoke_parallel"], ["at", "parallel_for"])


def function_path(mangled: str) -> list[str]:
    """The qualified name of the function a mangled (Itanium C++ ABI) symbol names, as its source
    components; for a local entity (a lambda's call operator) that of the function it is in. The
    name's template arguments and parameters are not read."""
    name = mangled.split(".")[0]  # (clones: .cold, .constprop.0, .isra.0, ._omp_fn.0)
    i = 1
    while name[i] == "Z":  # _Z, then one Z a level of local entity
        i += 1
    if name[i] == "N":
        i += 1
        while name[i] in "KVrRO":  # cv- and ref-qualifiers of a member function
            i += 1
    path = []
    while i < len(name) and name[i].isdigit():
        j = i
        while name[j].isdigit():
            j += 1
        length = int(name[i:j])
        path.append(name[j:j + length])
        i = j + length
    return path


def isa_functions() -> dict[str, list[str]]:
    """The built module's functions that involve a vector build (defined in its namespace, or
    instantiated on its types), by instruction set: mangled names."""
    spec = importlib.util.find_spec("inductor_lamb._C")
    assert spec is not None and spec.origin is not None
    module = spec.origin
    out = subprocess.run(["nm", "--defined-only", module], check=True, capture_output=True, text=True).stdout
    found: dict[str, list[str]] = {isa: [] for isa in ISAS}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) != 3 or fields[1] not in "TtWw" or not fields[2].startswith("_Z"):
            continue
        for isa in ISAS:
            if re.search(rf"\d(cpu|vec){len(isa)}{isa}", fields[2]):
                found[isa].append(fields[2])
    return found


def test_function_path_reads_nested_and_local_names():
    assert function_path("_ZN13inductor_lamb3cpu6AVX51212_GLOBAL__N_15pass1ERKNS0_10Lamb16ArgsE.cold") == [
        "inductor_lamb", "cpu", "AVX512", "_GLOBAL__N_1", "pass1"]
    assert function_path("_ZZN13inductor_lamb3cpu4AVX212_GLOBAL__N_15pass1ERKNS0_8LambArgsEENKUlT_E_clIfEEDaS6_")[-1] \
        == "pass1"
    assert function_path("_ZNK13inductor_lamb6lamb164ElemIN2at3vec6AVX51210VectorizedIfEEE6updateERKS6_") == [
        "inductor_lamb", "lamb16", "Elem"]
    assert function_path("_ZZZN13inductor_lamb3cpu6AVX51216one_state_updateIZNS1_12_GLOBAL__N_16updateERKNS0_11"
                         "AdagradArgsEEUlRKNS0_5ChunkEE_EEvNS0_9ChunkSpanEPKNS0_10TensorPtrsERKT_ENKUlSF_lRSD_S9_E_"
                         "clIfEEDaSF_lSI_S9_ENKUlllE_clEll") == ["inductor_lamb", "cpu", "AVX512", "one_state_update"]


def test_vector_builds_keep_every_element_helper_inline():
    found = isa_functions()
    for isa in ISAS:
        loops, helpers = [], []
        for symbol in found[isa]:
            path = [c for c in function_path(symbol) if c != "_GLOBAL__N_1"]
            is_loop = (path[:3] == ["inductor_lamb", "cpu", isa] and len(path) == 4 and path[3] in CHUNK_LOOPS
                       or path in THREADING)
            (loops if is_loop else helpers).append(symbol)
        # (no loops at all would mean this reads the wrong names, and could not fail)
        assert loops, f"no {isa} chunk loops found in the module's symbols"
        demangled = subprocess.run(["c++filt"], input="\n".join(helpers), capture_output=True, text=True).stdout
        assert not helpers, f"{isa} element-loop helpers compiled out of line:\n{demangled or helpers}"


def test_vector_builds_inline_every_loop_body():
    """vec_range's body, the lambda (i, n) that does one loop step, is compiled into its loop. The
    test above lets local entities of the chunk loops stand alone, and LAMB16's pass 2 body did:
    a call per 32 elements that reloaded its constants and tested the tail's length at run time
    (pass 2 took 1.3x its inlined time; INDUCTOR_LAMB_LOOP_BODY now forces it)."""
    found = isa_functions()
    for isa in ISAS:
        # a lambda(long, long)'s call operator: ...UlllE[n]_clEll (clones add a .suffix)
        bodies = [s for s in found[isa] if re.search(r"UlllE\d*_clEll(\.|$)", s)]
        demangled = subprocess.run(["c++filt"], input="\n".join(bodies), capture_output=True, text=True).stdout
        assert not bodies, f"{isa} loop bodies compiled out of line:\n{demangled or bodies}"
