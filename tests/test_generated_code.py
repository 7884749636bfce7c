"""The code Inductor generates for the ops (expected inline with expecttest):
kernels, external calls and tensor-sized temporaries per step."""

from __future__ import annotations

import expecttest
import pytest
from conftest import code_summary, use_path

from inductor_lamb.spec import STEPS

pytestmark = pytest.mark.usefixtures("lowering_path")


class TestGeneratedCode(expecttest.TestCase):
    def test_one_kernel_for_the_whole_step(self):
        """One generated function per step (per ~40 params at Inductor's argument cap),
        no external call, no tensor-sized temporary."""
        lines = [
            f"{name} x{n}: {code_summary(name, n)}"
            for name in (spec.name for spec in STEPS)
            for n in (3, 12)
        ]
        # 100 LAMB params: Inductor starts a new C++ function every 500 arguments (faster
        # to compile and to run than one function, CONTRIBUTING.md), still no external call.
        lines.append(f"lamb_step_ x100: {code_summary('lamb_step_', 100)}")
        self.assertExpectedInline("\n".join(lines), """\
lamb_step_ x3: 1 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)
lamb_step_ x12: 1 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)
lamb16_step_ x3: 1 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)
lamb16_step_ x12: 1 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)
lars_step_ x3: 1 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)
lars_step_ x12: 1 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)
adagrad_step_ x3: 1 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)
adagrad_step_ x12: 1 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)
novograd_step_ x3: 1 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)
novograd_step_ x12: 1 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)
lamb_step_ x100: 3 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)""")

    def test_fallback_paths_code(self):
        lines = []
        for path in ("decomposition", "external"):
            use_path(path)
            lines.append(f"{path}: {code_summary('lamb_step_', 12)}")
        self.assertExpectedInline("\n".join(lines), """\
decomposition: 1 kernel(s), 0 external lamb call(s), 0 temporary buffer(s)
external: 0 kernel(s), 1 external lamb call(s), 0 temporary buffer(s)""")
