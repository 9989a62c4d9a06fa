"""Sphinx configuration for the Iris documentation."""

from __future__ import annotations

project = "Iris"
author = "Iris developers"
copyright = "Iris developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# torch and triton are installed in the docs environment, so nothing is mocked.
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = True

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

nitpicky = False
suppress_warnings = [
    # Re-exported names (iris.mem.SymmetricHeap is also iris.mem.heap.SymmetricHeap) make
    # some Python cross-references ambiguous; either target is correct.
    "ref.python",
    # Links to torch/triton objects cannot resolve: there is no intersphinx (no network).
    "myst.xref_missing",
]

html_theme = "alabaster"
html_title = "Iris"
