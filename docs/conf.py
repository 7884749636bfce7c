"""Sphinx configuration of the documentation site (``python -m sphinx -W -b html docs build/docs``).

Sphinx rather than MkDocs: the API pages come from autodoc, which imports the package, and the
optimizers' docstrings are completed at import (shared argument docs filled in by
``FusedOptimizer.__init_subclass__``) while the typed op wrappers are generated from the op
schemas: a static reader of the sources would show neither.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python -m sphinx` puts the working directory first on sys.path: run from the checkout's root,
# that is the source tree, which holds the compiled module only after an editable install. With
# none there, the checkout leaves the path, so the installed package is documented (pip install .).
_ROOT = Path(__file__).resolve().parent.parent
if not any((_ROOT / "inductor_lamb").glob("_C*.so")):
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT]

import inductor_lamb  # noqa: E402

project = "inductor_lamb"
author = "the inductor_lamb developers"
copyright = "the inductor_lamb developers, BSD-3-Clause"
release = version = inductor_lamb.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "requirements.txt"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
html_theme = "furo"
html_title = f"inductor_lamb {release}"
