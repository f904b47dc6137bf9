"""Fixtures of the tools' tests."""

import pytest

from nsqd_threaded.testing import Broker


@pytest.fixture
def broker():
    """An in-process broker on 127.0.0.1 ephemeral ports."""
    with Broker() as b:
        yield b
