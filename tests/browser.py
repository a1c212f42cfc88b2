"""A real headless browser for the admin tests: Debian's Chromium driven by Playwright for
Python, launched with that executable (nothing is downloaded).

The tests skip when there is no Chromium or no Playwright, so the README's test command works on
a machine with only Python and pip; CI installs both and sets
``DJANGO_THROTTLE_BROWSER_TESTS=required``, which turns a missing browser into a failure.
Screenshots go to ``test-artifacts/screenshots/`` (or ``DJANGO_THROTTLE_SCREENSHOTS``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")
SCREENSHOTS = (
    Path(
        os.environ.get(
            "DJANGO_THROTTLE_SCREENSHOTS", Path(__file__).resolve().parent.parent / "test-artifacts"
        )
    )
    / "screenshots"
)


def chromium_path() -> str | None:
    explicit = os.environ.get("DJANGO_THROTTLE_CHROMIUM")
    if explicit:
        return explicit
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


def _unavailable(reason: str) -> None:
    if os.environ.get("DJANGO_THROTTLE_BROWSER_TESTS") == "required":
        pytest.fail(f"browser tests are required here, but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One browser per test module. Playwright's sync API keeps an event loop running while
    it is open, which would break later tests that call ``asyncio.run``: it is closed at the
    end of the module, and the environment is restored."""
    executable = chromium_path()
    if executable is None:
        _unavailable("no Chromium on PATH (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright for Python is not installed (pip install playwright)")
    # Playwright's sync API runs an event loop in this thread; Django refuses ORM calls from a
    # thread with a running loop unless told it is safe (it is: the calls are synchronous).
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(
                executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
            )
            yield launched
            launched.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
