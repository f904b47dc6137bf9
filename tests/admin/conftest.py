"""Fixtures of the nsqadmin tests."""

import pytest

from support.admin import start_admin
from support.webdriver import Chrome, require_browser


@pytest.fixture
def admin_factory():
    """``make(**options)`` starts an nsqadmin (``support.admin.start_admin``); each is stopped afterwards."""
    started = []

    def make(**options):
        admin = start_admin(**options)
        started.append(admin)
        return admin

    yield make
    for admin in started:
        admin.stop()


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium driven over chromedriver, with a fresh profile (skipped without them unless CI is set)."""
    require_browser()
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    with Chrome(profile) as chrome:
        yield chrome
