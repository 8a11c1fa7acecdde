"""Headless Chromium from Debian (`apt-get install chromium chromium-driver`), driven by
selenium, for the browser tests of the HTML report and the gateway inspector.

`chrome()` yields a real browser, or skips the test with the reason when Chromium, its driver
or selenium is absent. Console messages are collected (goog:loggingPrefs) so tests can assert
that a page logged no errors — including Content-Security-Policy violations, which Chromium
reports there."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def missing() -> str | None:
    """Why browser tests cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install 'cdr-retrieval[browser]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists() and not shutil.which(Path(path).name):
            return f"{path} is absent (apt-get install chromium chromium-driver)"
    return None


@contextlib.contextmanager
def chrome(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-extensions",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                "--disable-default-apps", f"--window-size={width},{height}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[str]:
    """Console messages at SEVERE level since the last call (a CSP violation is one)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def full_page_screenshot(driver: Any, path: Path, max_height: int = 6000) -> None:
    """Resize the window to the page's height (capped) and save a PNG."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, min(int(height) + 100, max_height))
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
