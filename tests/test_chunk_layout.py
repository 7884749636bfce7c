"""The CUDA engine's index math (csrc/cuda/chunk_layout.h), checked on the CPU: every element of every
tensor visited exactly once by the threads of its chunks' blocks, every 16-byte access of a pack
aligned in every stream, for every alignment of the streams (views at any offset), tensor size
(0, 1, 3, 4, 5, a chunk +- 1, several chunks) and pack width; aligned tensors take the vector
path for all but a chunk's head and tail."""

from __future__ import annotations

import ctypes
import itertools

import pytest
from conftest import host_library
from hypothesis import given
from hypothesis import strategies as st

CHUNK = 16384  # kChunkElems
THREADS = 256  # kThreads
BASE = 1 << 20  # a 16-byte aligned address (the allocator's)
SIZES = [0, 1, 3, 4, 5, 15, 16, 17, 255, 4096, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17]
# The engine's streams and packs: (param size, grad size, master?, state sizes, pack elements)
KERNELS = {
    "lamb fp32": (4, 4, False, (4, 4), 4),
    "lamb bf16": (2, 2, False, (4, 4), 8),
    "lamb bf16 + master": (2, 2, True, (4, 4), 8),
    "lamb16 fp32": (4, 4, False, (1, 1), 16),
    "lamb16 fp16 + master": (2, 2, True, (1, 1), 16),
    "lars fp32": (4, 4, False, (4,), 4),
    "adagrad bf16": (2, 2, False, (4,), 8),
}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = host_library(tmp_path_factory, "chunk_layout.cpp")
    u64p, intp = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_int)
    lib.head_of.argtypes = [u64p, intp, ctypes.c_int]
    lib.head_of.restype = ctypes.c_int
    lib.coverage_errors.argtypes = [ctypes.c_int64, u64p, intp, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                    ctypes.POINTER(ctypes.c_int64)]
    lib.coverage_errors.restype = ctypes.c_int64
    return lib


def streams(kernel: str, offsets: list[int]) -> tuple[list[int], list[int]]:
    """Addresses (each stream a view `offsets[s]` elements into its own aligned buffer) and sizes."""
    p, g, master, states, _ = KERNELS[kernel]
    sizes = [p, g, *([4] if master else []), *states]
    return [BASE * (s + 1) + o * size for s, (o, size) in enumerate(zip(offsets, sizes))], sizes


def head(lib, addrs, sizes) -> int:
    n = len(addrs)
    return lib.head_of((ctypes.c_uint64 * n)(*addrs), (ctypes.c_int * n)(*sizes), n)


def coverage(lib, numel, addrs, sizes, elems) -> tuple[int, int]:
    n, packed = len(addrs), ctypes.c_int64(0)
    errors = lib.coverage_errors(numel, (ctypes.c_uint64 * n)(*addrs), (ctypes.c_int * n)(*sizes), n, elems, THREADS,
                                 ctypes.byref(packed))
    return errors, packed.value


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("numel", SIZES)
def test_every_element_once_aligned_views(lib, kernel, numel):
    """All streams at the same element offset (a view of every list at the same index, or none):
    one common head, and everything but each chunk's head and tail goes through packs."""
    elems = KERNELS[kernel][4]
    nstreams = len(streams(kernel, [0] * 8)[1])
    for offset in range(16):
        addrs, sizes = streams(kernel, [offset] * nstreams)
        errors, packed = coverage(lib, numel, addrs, sizes, elems)
        assert errors == 0, (kernel, numel, offset)
        chunks = -(-numel // CHUNK)
        assert packed >= numel - chunks * (15 + elems - 1), (kernel, numel, offset, packed)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_every_element_once_differently_offset_views(lib, kernel):
    """Streams offset by different amounts: a common head where their offsets agree on 16 bytes,
    else the scalar path; every element still visited once."""
    elems = KERNELS[kernel][4]
    nstreams = len(streams(kernel, [0] * 8)[1])
    for offsets in itertools.product([0, 1, 2, 5, 8], repeat=nstreams):
        addrs, sizes = streams(kernel, list(offsets))
        h = head(lib, addrs, sizes)
        if h >= 0:
            assert all((a + h * s) % 16 == 0 for a, s in zip(addrs, sizes)), (offsets, h)
        for numel in (5, CHUNK + 1):
            errors, packed = coverage(lib, numel, addrs, sizes, elems)
            assert errors == 0, (kernel, offsets, numel)
            assert (packed == 0) == (h < 0 or numel < h + elems), (kernel, offsets, numel, h)


def test_head_of_streams(lib):
    assert head(lib, [BASE, BASE], [4, 4]) == 0
    assert head(lib, [BASE + 4, BASE + 4], [4, 4]) == 3  # three floats to the next 16 bytes
    assert head(lib, [BASE + 2, BASE + 4], [2, 4]) == 7  # a bf16 view one element in, a float32 one: both at 7
    assert head(lib, [BASE + 1, BASE + 4], [1, 4]) == 15  # a float8 code stream decides
    assert head(lib, [BASE + 4, BASE + 8], [4, 4]) == -1  # offsets that never meet
    assert head(lib, [BASE + 2, BASE], [4, 4]) == -1  # a float32 view not on its own size
    assert head(lib, [0, BASE + 4], [4, 4]) == 3  # an absent stream does not count


@given(numel=st.integers(0, 3 * CHUNK + 40), offsets=st.lists(st.integers(0, 31), min_size=4, max_size=4),
       kernel=st.sampled_from(["lamb bf16", "lamb16 fp32", "lars fp32"]))
def test_random_layouts(lib, numel, offsets, kernel):
    addrs, sizes = streams(kernel, offsets[:len(streams(kernel, [0] * 8)[1])])
    assert coverage(lib, numel, addrs, sizes, KERNELS[kernel][4])[0] == 0
