"""One worker process for tests/test_metrics.py: decides ``N`` requests of one client against
an inline 3/h limit on the suite's Redis, with Prometheus in multiprocess mode (the parent
sets PROMETHEUS_MULTIPROC_DIR), then exits. Run as ``python -m tests.metrics_worker N``."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.test import RequestFactory  # noqa: E402

from django_throttle.rates import Limit  # noqa: E402
from django_throttle.request import core  # noqa: E402


def main() -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = os.environ["DJANGO_THROTTLE_TEST_REDIS_URL"]
    settings.DJANGO_THROTTLE_KEY_PREFIX = os.environ["WORKER_KEY_PREFIX"]
    settings.DJANGO_THROTTLE_METRICS = True
    from django_throttle import metrics
    from django_throttle.conf import app_settings

    app_settings.reload()  # settings changed by hand send no setting_changed

    assert metrics.connect()
    limits = (Limit.build("worker", "3/h", name="worker 3/h"),)
    request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.50")
    for _ in range(int(sys.argv[1])):
        core.check(request, limits=limits)


if __name__ == "__main__":
    main()
