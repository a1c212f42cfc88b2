"""Sphinx configuration of the django-throttle documentation.

Build: ``.venv/bin/sphinx-build -W --keep-going -b html docs docs/_build/html`` (after
``pip install -e '.[docs]'``). autodoc imports the package, so Django is set up first, with
the small settings module next to this file (no Redis needed).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS), str(DOCS / "_ext")]
os.environ["DJANGO_SETTINGS_MODULE"] = "django_settings"
django.setup()

project = "django-throttle"
author = "django-throttle developers"
copyright = "django-throttle developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "throttle_reference",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": True}


html_theme = "furo"
html_title = "django-throttle"
