"""Sphinx configuration for the asyncopt documentation (``make docs``)."""
import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "asyncopt"
author = "the asyncopt developers"
copyright = "2026, the asyncopt developers"
release = version = "0.1.0"

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

autosummary_generate = False
autodoc_default_options = {"members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

html_theme = "alabaster"
html_static_path = []
