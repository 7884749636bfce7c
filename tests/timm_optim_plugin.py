"""A pytest plugin that runs timm's own optimizer tests (``tests/test_optim.py`` of timm's source
distribution, never copied here) with this package's names in timm's registry:

    pip download --no-deps --no-binary :all: timm==1.0.31 && tar xzf timm-1.0.31.tar.gz
    PYTHONPATH=tests TORCH_DEVICE=cpu python -m pytest -p timm_optim_plugin \\
        timm-1.0.31/tests/test_optim.py -k inductor

Loaded before the test module is imported, it registers the names, so every registry-wide test
(``list_optimizers()``: the factory, common keyword arguments, copies, zero and tensor lr, resume,
low precision) takes them; and it adds each name that has a timm twin to the convergence table
with its twin's settings (Rosenbrock, the basic cases, the small model). ``-k inductor`` selects
the tests that take our names. Deliberate differences are listed in :data:`EXCEPTIONS`, with why,
the way timm lists its own.
"""

from __future__ import annotations

import pytest

from inductor_lamb.integrations import timm as il_timm

il_timm.register()

# our name -> timm's twin, whose convergence settings it takes
TWINS = {"inductorlamb": "lamb", "inductorlambc": "lambc", "inductorlars": "lars", "inductoradagrad": "adagrad",
         "inductornovograd": "novograd"}

# property -> {name pattern: why}, merged into timm's own _PROPERTY_EXCEPTIONS
EXCEPTIONS: dict[str, dict[str, str]] = {}

# Tests that fail by design (test id pattern: why), run as strict expected failures: one that
# starts passing fails the run, so this list stays true. (None today.)
DIFFERENCES: dict[str, str] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module
    if getattr(module, "__name__", "").rpartition(".")[2] != "test_optim":
        return
    for prop, reasons in EXCEPTIONS.items():
        module._PROPERTY_EXCEPTIONS.setdefault(prop, {}).update(reasons)
    if metafunc.function.__name__ != "test_optimizer_convergence":
        return
    for ours, theirs in TWINS.items():
        module._CONVERGENCE_CFGS[ours] = module._CONVERGENCE_CFGS[theirs]
    # (the parametrization's list of names was made at import, from the table as it was then)
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[1]
        if mark.args[0] == "optimizer" and isinstance(names, list):
            names.extend(n for n in TWINS if n not in names)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    import fnmatch

    for item in items:
        for pattern, why in DIFFERENCES.items():
            if fnmatch.fnmatchcase(item.name, pattern):
                item.add_marker(pytest.mark.xfail(reason=why, strict=True, raises=ValueError))
