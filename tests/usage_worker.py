"""One worker process for tests/test_figures.py: counts ``N`` decisions of one client under
usage field anonymous|seam on the suite's Redis, pushes them, then exits. Run as
``python -m tests.usage_worker N``."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402

from django_throttle.backends import get_backend  # noqa: E402
from django_throttle.conf import app_settings  # noqa: E402
from django_throttle.rates import Limit  # noqa: E402
from django_throttle.usage import accounting as usage  # noqa: E402


def main() -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = os.environ["DJANGO_THROTTLE_TEST_REDIS_URL"]
    settings.DJANGO_THROTTLE_KEY_PREFIX = os.environ["WORKER_KEY_PREFIX"]
    app_settings.reload()  # settings changed by hand send no setting_changed
    backend = get_backend()
    field = usage.field_for("anonymous", "seam")
    limits = (Limit.build("shared", "5/h"),)
    for _ in range(int(sys.argv[1])):
        backend.hit("ip:203.0.113.50", limits, usage=field)
    usage.flush_pending()


if __name__ == "__main__":
    main()
