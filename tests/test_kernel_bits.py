"""The CPU kernels give exactly the bits recorded in tests/fixtures/kernel_bits.json
(see tests/bit_cases.py): refactoring the kernels or their shared math headers
must not change one bit of any op's results, on any CPU capability and at any
thread count (the fixture was recorded at 2 threads)."""

from __future__ import annotations

import json

import pytest
import torch
from bit_cases import FIXTURE, VARIANTS, available_capabilities, case_id, cases, run_case

import inductor_lamb

RECORDED = json.load(open(FIXTURE))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("cap", ["default", "avx2", "avx512"])
def test_kernel_bits_unchanged(cap, threads):
    if cap not in available_capabilities():
        pytest.skip(f"this CPU has no {cap}")
    if cap not in RECORDED:
        pytest.skip(f"no {cap} bits recorded (regenerate on such a CPU: tests/bit_cases.py)")
    inductor_lamb.set_cpu_capability(cap)
    torch.set_num_threads(threads)
    recorded = [c for c in cases() if case_id(*c) in RECORDED[cap]]  # cases added later: on the CPUs that had them
    assert len(recorded) >= len(cases()) - 5 * len(VARIANTS), "most cases must be recorded"
    changed = [case_id(*c) for c in recorded if run_case(*c) != RECORDED[cap][case_id(*c)]]
    assert not changed, f"{len(changed)} of {len(recorded)} cases changed bits at {cap}: {changed}"
