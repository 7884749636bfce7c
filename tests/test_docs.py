"""The Markdown pages (README, CONTRIBUTING, CHANGELOG, docs/): every relative link points to a
file that exists, and every ``#anchor`` to a heading of that file (GitHub's and MyST's slugs).
The site build (``python -m sphinx -W``, in CI) checks docs/ again; this also covers the pages
outside the site."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub and MyST make it: lower case, punctuation dropped, spaces -."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [t for t in _LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{page.name}: link to {target}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name}: link to {target}: no such heading in {dest.name}"


def test_slugs():
    assert slug("DeepSpeed ZeRO") == "deepspeed-zero"
    assert slug("bfloat16 params without master copies") == "bfloat16-params-without-master-copies"
    assert slug("Two-phase form (sharded params)") == "two-phase-form-sharded-params"
    assert slug("Lightning and HF Trainer") == "lightning-and-hf-trainer"
