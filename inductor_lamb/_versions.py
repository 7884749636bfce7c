"""The torch releases inductor_lamb supports: the one statement of the range.

``setup.py`` reads this file by path (before the package can be imported), so it imports nothing
but the standard library. ``pyproject.toml``'s ``torch>=`` dependency is the same floor
(``tests/test_install.py`` checks that they agree), so pip never replaces a supported torch.
"""

from __future__ import annotations

import re

__all__ = ["FLOOR", "TESTED", "release", "range_text", "refusal", "untested"]

# The oldest supported release: the oldest CI tests (the GPU images' torch); nothing older is
# built or tested, so nothing older is accepted.
FLOOR = (2, 11)
# The releases CI tests, each in its own virtualenv (docs/install.md: what each runs).
TESTED = ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")


def release(version: str) -> tuple[int, int]:
    """The (major, minor) of a torch version string (``2.11.0+cu130``, ``2.16.0.dev20261201``)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(found.group(1)), int(found.group(2))


def range_text() -> str:
    return f"torch {FLOOR[0]}.{FLOOR[1]} or newer (tested: {', '.join(TESTED)})"


def refusal(version: str) -> str | None:
    """Why the package cannot be built for or used with torch ``version``, or None."""
    if release(version) < FLOOR:
        return (f"inductor_lamb supports {range_text()}, but torch {version} is installed. Upgrade torch "
                f"yourself (pip install 'torch>={FLOOR[0]}.{FLOOR[1]}'), or install an older inductor_lamb; "
                f"this install does not replace your torch.")
    return None


def untested(version: str) -> bool:
    """A release newer than every tested one (it is built and used, with a warning at build time)."""
    return release(version) > release(TESTED[-1])
