"""Headless Chromium for the tests that look at a page (the Dagster UI, the leaderboards): Debian's
chromium driven through Debian's chromedriver, both named explicitly, so that Selenium never tries
to download a driver or a browser."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
# The flags a sandboxed root CI needs; background networking off because the machine's closed
# network refuses Chromium's own update and metrics connections.
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
]

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="Debian's chromium and chromium-driver are not installed (make test installs them when run as root with apt-get)",
)


@contextmanager
def headless_chromium(directory: Path) -> Iterator:
    """A Selenium driver of headless Chromium with its profile in ``directory``, quit on leaving;
    skips the test when selenium (the `test` extra) is not installed."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the `test` extra) is not installed")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={directory / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
