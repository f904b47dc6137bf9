"""Fixtures of the nsqadmin tests."""

import pytest

from support.admin import start_admin


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
