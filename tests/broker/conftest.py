"""Fixtures of the broker core's unit tests."""

import pytest

from support.core import make_owner


@pytest.fixture
def owners(tmp_path):
    """Factory: a broker core (``make_owner``) with ``options``, its data in ``tmp_path``; each stopped at teardown."""
    made = []

    def make(**options):
        nsqd = make_owner(tmp_path / "data", **options)
        made.append(nsqd)
        return nsqd

    yield make
    for nsqd in made:
        nsqd.stop()
