"""A time-boxed property search with fresh seeds: CI's longer look for the inputs its fixed-seed
profile never draws.

    python tests/property_search.py [--seconds 360] [--seed N] [--examples 1000] [-- pytest args]

Runs the property tests (hypothesis: every op call eagerly and compiled on every path against the
float64 reference, whatever a param group holds, the CUDA chunk layout) in rounds, each with its own
seed and the "search" profile (``--examples`` a test; the compiled tests scale it down), until the
time is spent: a round starts only while the time left covers the last one. The first seed comes
from the commit (``git rev-parse HEAD``), so every commit explores inputs no earlier run did, and
a failure prints the command that replays it. Exits non-zero on the first failing round.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_properties.py::test_every_call_errors_cleanly_or_matches_the_reference",
         "tests/test_properties.py::test_every_compiled_call_errors_like_eager_or_matches_the_reference",
         "tests/test_group_values.py::test_whatever_a_group_holds_steps_or_is_refused_by_name",
         "tests/test_chunk_layout.py"]


def commit_seed() -> int:
    """The seed of this checkout's commit: its hash's first 8 hex digits (0 outside git)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        return int(head.stdout.strip()[:8], 16)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=360.0, help="time budget of the whole search")
    parser.add_argument("--seed", type=int, default=None, help="first seed (default: the commit's)")
    parser.add_argument("--examples", type=int, default=1000, help="hypothesis examples a test a round")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --), e.g. -n 2")
    args = parser.parse_args()
    seed = commit_seed() if args.seed is None else args.seed
    start = time.monotonic()
    last = 0.0
    rounds = 0
    env = {**os.environ, "INDUCTOR_LAMB_SEARCH_EXAMPLES": str(args.examples)}
    while rounds == 0 or time.monotonic() - start + last <= args.seconds:
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, "--hypothesis-profile",
               "search", f"--hypothesis-seed={seed}", *args.pytest_args]
        began = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, env=env)
        last = time.monotonic() - began
        rounds += 1
        print(f"property search: round {rounds}, seed {seed}: {'passed' if done.returncode == 0 else 'FAILED'} "
              f"in {last:.0f} s ({time.monotonic() - start:.0f} of {args.seconds:.0f} s)", flush=True)
        if done.returncode != 0:
            replay = " ".join(shlex.quote(c) for c in ["python", *cmd[1:]])
            print(f"replay it with: INDUCTOR_LAMB_SEARCH_EXAMPLES={args.examples} {replay}\n"
                  f"(hypothesis prints the failing example and a @reproduce_failure blob above)", flush=True)
            return 1
        seed += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
