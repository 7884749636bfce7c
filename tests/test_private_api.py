"""Every private torch symbol the package uses is listed in ``inductor_lamb._private`` and still
exists in the installed torch (CI runs this under every supported torch release); no
module of the package reaches one any other way; a feature that must do without one warns."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import warnings
from pathlib import Path

import pytest
import torch

from inductor_lamb import _private

PACKAGE = Path(_private.__file__).parent


@pytest.mark.parametrize("name", sorted(_private.SYMBOLS))
def test_private_symbol_exists(name):
    """Fails naming the symbol and its use when a torch release moves it."""
    path, use = _private.SYMBOLS[name]
    try:
        obj = _private.resolve(name)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"torch {torch.__version__} lacks {path}, which inductor_lamb uses: {use} ({e})")
    assert obj is not None


@pytest.mark.parametrize("name", sorted(_private.PROTOCOLS))
def test_private_protocol_is_still_read_by_torch(name):
    """Each private attribute torch reads or writes on our objects is still named by the torch
    module that does so."""
    module, use = _private.PROTOCOLS[name]
    source = inspect.getsource(importlib.import_module(module))
    assert name in source, f"torch {torch.__version__}'s {module} no longer names {name} ({use})"


def _private_references(tree: ast.AST) -> list[str]:
    """Dotted names of torch's private symbols a module refers to (``torch._x``, ``torch.a._b``)
    and the private torch modules it imports."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = []
            n: ast.AST = node
            while isinstance(n, ast.Attribute):
                parts.append(n.attr)
                n = n.value
            if isinstance(n, ast.Name) and n.id == "torch":
                dotted = ".".join(["torch", *reversed(parts)])
                if re.search(r"\._[a-zA-Z]", dotted) and not dotted.startswith("torch.__"):
                    out.append(dotted)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("torch") and re.search(r"(^|\.)_[a-zA-Z]", node.module):
                out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names
                    if node.module.startswith("torch") and a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("torch") and re.search(r"\._", a.name)]
    return out


def test_no_module_reaches_a_private_symbol_but_private_py():
    found = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        if f.name == "_private.py":
            continue
        refs = [r for r in _private_references(ast.parse(f.read_text()))
                if not r.startswith("torch.ops.lamb._")]  # (this package's own ops)
        if refs:
            found[str(f.relative_to(PACKAGE))] = refs
    assert not found, f"private torch symbols reached outside inductor_lamb/_private.py: {found}"


def test_the_check_finds_a_private_reference():
    """(The scan above would see one.)"""
    tree = ast.parse("import torch\nfrom torch._inductor import ir\nx = torch._foreach_add\ny = torch.cuda.is_available")
    assert _private_references(tree) == ["torch._inductor", "torch._foreach_add"]


def test_a_missing_symbol_fails_loudly_and_a_fallback_warns_once(monkeypatch):
    monkeypatch.setitem(_private.SYMBOLS, "gone", ("torch._dynamo:no_such_thing", "a test"))
    with pytest.raises(AttributeError, match="torch._dynamo:no_such_thing"):
        _private.resolve("gone")
    monkeypatch.setattr(_private, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _private.warn_once("a feature", "what is lost")
        _private.warn_once("a feature", "what is lost")
    assert len(caught) == 1 and "a feature" in str(caught[0].message) and "what is lost" in str(caught[0].message)


def test_fullgraph_detection_falls_back_to_tracing_with_a_warning(monkeypatch):
    """Where Dynamo's tracer moved, a compile is taken as fullgraph (the step is traced: always
    sound), with a warning that says what is lost."""
    monkeypatch.setitem(_private.SYMBOLS, "InstructionTranslator.current_tx",
                        ("torch._dynamo.symbolic_convert:NoSuchTracer.current_tx", "a test"))
    monkeypatch.setattr(_private, "_warned", set())
    with pytest.warns(RuntimeWarning, match="traces its op calls"):
        assert _private.compiling_fullgraph() is True


def test_accessors_a_traced_step_calls_return_the_listed_symbols():
    """The accessors that traced code calls reach their symbols without importlib (which Dynamo
    cannot trace): the same objects :data:`SYMBOLS` lists."""
    assert _private.functional_collectives() is _private.resolve("functional_collectives")
    assert _private.strided_shard() is _private.resolve("_StridedShard")
    assert _private.foreach("norm") is _private.resolve("_foreach_norm")
    assert _private.global_step_hooks() == (_private.resolve("_global_optimizer_pre_hooks"),
                                            _private.resolve("_global_optimizer_post_hooks"))


def test_a_release_limit_names_the_release(monkeypatch):
    for feature, (first, why) in _private.LIMITS.items():
        monkeypatch.setattr(_private, "RELEASE", first)
        assert _private.lacks(feature) is None
        monkeypatch.setattr(_private, "RELEASE", (first[0], first[1] - 1))
        assert _private.lacks(feature) == f"torch {torch.__version__} cannot: {why}"


def test_a_forced_path_this_torch_cannot_take_is_refused_by_name_and_auto_avoids_it(monkeypatch):
    """Where a release cannot take the lowering (``LIMITS``: CUDA steps on torch 2.11), forcing
    it fails the compile with an error that names the release; ``auto`` takes the kernel. The
    CUDA rule's control flow, run on the CPU by declaring its params lacking."""
    from conftest import clone_lists, eager_call, op_args

    import inductor_lamb
    from inductor_lamb._inductor import paths

    monkeypatch.setattr(paths, "_lowering_lacks", lambda bound: f"torch {torch.__version__} cannot: (a test)")
    monkeypatch.setattr(_private, "has_kernel_for", lambda op, key: True)  # (as a CUDA build has)
    # (shapes of this test's own: Inductor's cache must not serve a graph another test lowered; the
    # real limit is the torch release, which is in the cache's key)
    name, args, kwargs = op_args("lamb", shapes=[(13, 3), (), (29,)])
    try:
        for path in ("lowering", "auto"):
            inductor_lamb.set_compile_path(path)
            torch._dynamo.reset()
            compiled, eager = clone_lists(args), clone_lists(args)
            step = torch.compile(eager_call, fullgraph=True)
            if path == "lowering":
                with pytest.raises(Exception, match=rf"lamb_step_: the 'lowering' compile path of a CUDA step: "
                                                    rf"torch {re.escape(torch.__version__)} cannot: \(a test\)"):
                    step(name, compiled, torch.tensor(0.1), kwargs)
                continue
            step(name, compiled, torch.tensor(0.1), kwargs)
            eager_call(name, eager, torch.tensor(0.1), kwargs)
            assert all(torch.equal(x, y) for a, b in zip(compiled, eager) for x, y in zip(a, b))
    finally:
        inductor_lamb.set_compile_path()
        torch._dynamo.reset()
