#!/usr/bin/env python
"""Django's command-line utility for the demo project (``python manage.py run_demo``)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    try:
        from django.core.management import execute_from_command_line
    except ImportError as exc:
        raise ImportError(
            "Couldn't import Django. Install the demo first: "
            "python3 -m venv .venv && .venv/bin/pip install -e '.[demo]'"
        ) from exc
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
