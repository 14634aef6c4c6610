"""Sphinx configuration: build with ``sphinx-build -W -n -b html docs docs/_build/html``
(warnings are errors; ``-n`` makes a reference to an API that no longer exists one)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent / "src"))

project = "rlloop"
author = "rlloop contributors"
copyright = "rlloop contributors"
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "rlloop_docs",
]
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "_generated"]
html_theme = "furo"
html_title = "rlloop"
nitpicky = True
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings say the types; signatures stay readable
napoleon_use_ivar = True  # "Attributes:" sections as fields, not a second description
# Names outside rlloop have no inventory here (the build is offline); rlloop's own
# references stay checked.
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|numpy|np|gymnasium|gym|optuna|ray|mlflow|pettingzoo|yaml)(\..*)?"),
    (r"py:.*", r"(Any|Callable|Iterator|Sequence|Mapping|Path|Tensor|Generator|T|BatchT|ModelT)"),
]
