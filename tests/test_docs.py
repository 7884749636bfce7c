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


# ---- each fact has one owner: figures live in RESULTS.md, cited by heading ----------------------

SOURCES = [p for p in sorted(ROOT.rglob("*")) if p.is_file() and p.suffix in (".py", ".md", ".h", ".cpp", ".cu", ".cuh", ".sh")
           and not any(part in (".git", "build", "__pycache__") or part.endswith(".egg-info") for part in p.parts)
           and p.name != "RESULTS.md" and p != Path(__file__)]
# `RESULTS.md`, "Heading" (or docs/decisions.md, "A decision's title"): the quoted text is a heading
# of RESULTS.md / design.md, or the bold title a decision starts with
_CITATION = re.compile(r"(RESULTS|decisions|design)\.md`?\)?,\s*\"([A-Za-z][^\"]*)\"")


def titles(page: str) -> set[str]:
    text = (ROOT / page).read_text()
    out = {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}
    out |= set(re.findall(r"^- \*\*(.+?)\*\*", text, flags=re.M))  # (a decision's or design item's title)
    out = {t.rstrip(".") for t in out}
    # (also cited by the part before a colon or a parenthesis: "Compiled recipes" for "Compiled recipes (CPU)")
    return out | {t.split(":")[0].strip() for t in out} | {t.split(" (")[0].strip() for t in out}


CITED = {"RESULTS": "benchmarks/RESULTS.md", "decisions": "docs/decisions.md", "design": "docs/design.md"}


def test_every_cited_heading_exists() -> None:
    known = {k: titles(v) for k, v in CITED.items()}
    missing = []
    for path in SOURCES:
        for page, heading in _CITATION.findall(path.read_text(errors="replace")):
            heading = re.sub(r"\s+(?:#|//)?\s*", " ", heading).strip()  # (a citation across comment lines)
            if heading.rstrip(".") not in known[page]:
                missing.append(f"{path.relative_to(ROOT)}: {CITED[page]}, \"{heading}\"")
    assert not missing, "citations of headings that do not exist:\n" + "\n".join(missing)


def test_code_cites_results_by_heading() -> None:
    """Code never carries a figure of RESULTS.md: where it points there, it names the heading."""
    bare = []
    for path in SOURCES:
        if path.suffix == ".md" or path.parts[len(ROOT.parts)] == "benchmarks":  # (benchmarks write RESULTS.md)
            continue
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "RESULTS.md" in line and not _CITATION.search(line) and "RESULTS.md`, \"" not in line:
                bare.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bare, "code that points at RESULTS.md without a heading:\n" + "\n".join(bare)
