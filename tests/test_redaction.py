"""Redis URLs with a password never reach a check message, a log line or a debug page."""

from __future__ import annotations

from typing import Any

import pytest

from django_throttle.checks import check_settings
from django_throttle.redaction import redact_text, redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("rediss://app:s3cret@cache:6380/1", "rediss://app:***@cache:6380/1"),
        ("redis://app:s3:cr@et@cache/0", "redis://app:***@cache/0"),
        ("unix:///run/redis.sock?db=1&password=s3cret", "unix:///run/redis.sock?db=1&password=***"),
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        ("redis://app@cache/0", "redis://app@cache/0"),
        ("http://[::1", "http://[::1"),
    ],
)
def test_redact_url_masks_every_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "s3" not in redact_url(url)


def test_redact_text_masks_urls_inside_text() -> None:
    text = "could not reach redis://:s3cret@a:1/0, then rediss://u:p4ss@b/0?password=x9 either"
    assert redact_text(text) == (
        "could not reach redis://:***@a:1/0, then rediss://u:***@b/0?password=*** either"
    )


def test_a_bad_redis_url_setting_is_reported_with_its_password_masked(settings: Any) -> None:
    settings.DJANGO_THROTTLE_REDIS_URL = "http://:s3cret@cache:6379/0"
    [error] = check_settings()
    assert error.id == "django_throttle.E002"
    assert "s3cret" not in error.msg
    assert "http://:***@cache:6379/0" in error.msg
