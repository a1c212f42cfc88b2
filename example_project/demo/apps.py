"""The demo app: example views and the ``seed_demo`` / ``run_demo`` commands."""

from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    name = "example_project.demo"
    label = "demo"
    verbose_name = "django-throttle demo"
