"""The shape of the op contract, kept as it was built: each op declared once
(csrc/ops.cpp), a hyper-parameter in a handful of files, no generated code at run
time, no import loops in the package."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from inductor_lamb.spec import SPECS

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for p in (*ROOT.joinpath("inductor_lamb").rglob("*.py"), *ROOT.joinpath("csrc").rglob("*"))
           if p.suffix in (".py", ".cpp", ".h", ".cu", ".cuh")]


@pytest.mark.parametrize("name", list(SPECS))
def test_each_schema_is_literal_text_in_one_file(name):
    schema = str(SPECS[name].op._schema).removeprefix("lamb::")
    # the declaration as written: adjacent C++ string literals joined
    texts = {p: re.sub(r'"\s*\n\s*"', "", p.read_text()) for p in SOURCES}
    head = schema[:schema.index("(") + 1]
    holders = [p.relative_to(ROOT).as_posix() for p, t in texts.items() if f'"{head}' in t]
    assert holders == ["csrc/ops.cpp"]
    declared = re.search(rf'"({re.escape(head)}[^"]*)"', texts[ROOT / "csrc" / "ops.cpp"]).group(1)
    assert torch._C.parse_schema(f"lamb::{declared}") == SPECS[name].op._schema


@pytest.mark.parametrize("hyper", ["trust_clip", "always_adapt", "grad_averaging", "amsgrad"])
def test_a_hyperparameter_lives_in_its_families_files(hyper):
    """Its declaration (csrc/ops.cpp), the math of reference.py, and per op family that takes it
    the optimizer's constructor and its use in the math of _inductor/<family>.py and
    csrc/common/<family>.h (the integrations with other frameworks aside: they map those
    frameworks' option names, such as timm's, to ours)."""
    integrations = ROOT / "inductor_lamb" / "integrations"
    files = sorted(p.relative_to(ROOT).as_posix() for p in SOURCES
                   if integrations not in p.parents and re.search(rf"\b{hyper}\b", p.read_text()))
    families = {s.family for s in SPECS.values() if hyper in s.names}
    assert families
    assert files == sorted(["csrc/ops.cpp", "inductor_lamb/reference.py",
                            *(f for fam in families for f in (f"csrc/common/{fam}.h", f"inductor_lamb/_inductor/{fam}.py",
                                                               f"inductor_lamb/optim/{fam}.py"))])


def test_no_exec_in_the_package():
    for p in ROOT.joinpath("inductor_lamb").rglob("*.py"):
        calls = [n for n in ast.walk(ast.parse(p.read_text()))
                 if isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("exec", "eval")]
        assert not calls, p


def _import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package modules its imports run (any import, also inside a
    function; a package's __init__ counts as imported with its modules), leaving
    out a module's own parent packages."""
    mods = {}
    for f in package.rglob("*.py"):
        parts = f.relative_to(package.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        here = m.split(".") if f.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                    if node.level else node.module
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                parts = t.split(".")
                for k in range(2, len(parts) + 1):
                    u = ".".join(parts[:k])
                    if u in mods and u != m and not m.startswith(u + "."):
                        edges[m].add(u)
    return edges


def test_no_import_loops():
    edges = _import_graph(ROOT / "inductor_lamb")
    assert edges["inductor_lamb.reference"] and edges["inductor_lamb._inductor.paths"]  # (the graph is read)
    # Tarjan-free check: a module reaching itself
    for start in edges:
        seen, todo = set(), list(edges[start])
        while todo:
            m = todo.pop()
            assert m != start, f"import loop through {start}"
            if m not in seen:
                seen.add(m)
                todo += edges[m]
