"""A headless Chromium for the console's tests, through Selenium: skip without one, or fail in CI.

The browser tests run when Chromium, its WebDriver (``chromedriver``) and the ``selenium`` package
are installed (Debian: ``apt-get install chromium chromium-driver``; ``pip install selenium``).
Otherwise they skip, unless ``LONGRUN_REQUIRE_BROWSER=1`` (``.ci/run`` sets it and installs all
three), which makes them fail instead: CI must never pass by skipping them. Nothing is downloaded:
the browser and the driver are the ones found on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Any

from .optional import installed, skip_or_fail

REQUIRE_VARIABLE = "LONGRUN_REQUIRE_BROWSER"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
ARTIFACTS_VARIABLE = "LONGRUN_TEST_ARTIFACTS"
ARTIFACTS = os.environ.get(ARTIFACTS_VARIABLE) or os.path.join(tempfile.gettempdir(), "longrun-test-artifacts")
"""Where screenshots of the console's pages are kept after the tests (overwritten by the next run):
``$LONGRUN_TEST_ARTIFACTS``, which CI may keep, else a directory under the temporary directory."""


def _browser() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


def check() -> None:
    """Raise SkipTest (or, when the browser is required, fail) unless a headless browser can run."""
    reason = None
    if not installed("selenium"):
        reason = "the selenium package is not installed (pip install selenium)"
    elif _browser() is None:
        reason = "no Chromium on PATH (apt-get install chromium)"
    elif shutil.which("chromedriver") is None:
        reason = "no chromedriver on PATH (apt-get install chromium-driver)"
    if reason is not None:
        skip_or_fail(REQUIRE_VARIABLE, reason)


def start_browser() -> Any:
    """A headless Chromium under WebDriver (the caller quits it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = _browser() or ""
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1100",
                     "--no-first-run", "--disable-extensions", "--disable-background-networking", "--lang=en-US"):  # fmt: skip
        options.add_argument(argument)
    service = Service(executable_path=shutil.which("chromedriver") or "chromedriver", log_output=subprocess.DEVNULL)
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    return driver
