"""Runs PyTorch's own optimizer tests (``TestOptimRenewed`` in PyTorch's
``test/test_optim.py``) on inductor_lamb's optimizers, on CPU.

    python tests/run_torch_optim_suite.py path/to/pytorch/test/test_optim.py [-k PATTERN]

PyTorch's test file is not part of this project (take it from a PyTorch checkout
of the installed version). Its tests are generated from ``optim_db``; this script
replaces that list with the ``OptimizerInfo`` entries of ``optim_infos.py``, so
only our optimizers run, and prints each failing test with its error.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def load_suite(path: Path) -> unittest.TestSuite:
    from optim_infos import INFOS
    from torch.testing._internal import common_optimizers

    common_optimizers.optim_db[:] = INFOS  # before the test file's decorators read it
    for name in ("optim", "optim.test_lrscheduler", "optim.test_optim", "optim.test_swa_utils"):
        # the sibling test modules it imports classes from: none of them is wanted here
        stub = types.ModuleType(name)
        stub.__path__ = []
        stub.TestLRScheduler = stub.TestDifferentiableOptimizer = stub.TestSWAUtils = None
        sys.modules.setdefault(name, stub)
    spec = importlib.util.spec_from_file_location("torch_test_optim", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return unittest.defaultTestLoader.loadTestsFromName("TestOptimRenewedCPU", module)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("test_file", type=Path, help="PyTorch's test/test_optim.py")
    ap.add_argument("-k", default="", help="run only tests whose name contains this")
    args = ap.parse_args()
    suite = load_suite(args.test_file)
    tests = [t for t in suite if args.k in t.id()]
    result = unittest.TextTestRunner(verbosity=0, stream=open("/dev/null", "w")).run(unittest.TestSuite(tests))
    failed = {t.id(): err for t, err in (*result.failures, *result.errors)}
    by_optimizer: dict[str, list[int]] = {}
    from optim_infos import INFOS

    NAMES = [info.optim_cls.__name__ for info in INFOS]
    for t in tests:
        name = next((n for n in NAMES if f"_{n}_" in t.id()), "other")
        counts = by_optimizer.setdefault(name, [0, 0, 0])
        skipped = any(s.id() == t.id() for s, _ in result.skipped)
        counts[2 if skipped else 1 if t.id() in failed else 0] += 1
    for test_id, err in failed.items():
        print(f"FAILED {test_id.split('.')[-1]}\n    {err.strip().splitlines()[-1]}")
    for name, (ok, bad, skip) in sorted(by_optimizer.items()):
        print(f"{name}: {ok} passed, {bad} failed, {skip} skipped")
    print(f"{result.testsRun - len(failed) - len(result.skipped)} passed, {len(failed)} failed, "
          f"{len(result.skipped)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
