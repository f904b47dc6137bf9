"""The process tuning (internal/process.py): the command's gc threshold."""

import gc
import platform

import pytest

from nsqd_threaded.internal import process

from support.core import make_owner

pytestmark = pytest.mark.timeout(30)

CPYTHON = platform.python_implementation() == "CPython"


@pytest.fixture
def gc_threshold():
    saved = gc.get_threshold()
    yield saved
    gc.set_threshold(*saved)


@pytest.mark.skipif(not CPYTHON, reason="the gc thresholds are CPython's")
def test_tune_raises_only_the_youngest_generation_threshold(gc_threshold):
    gc.set_threshold(700, 10, 10)
    process.tune_gc()
    assert gc.get_threshold() == (process.GC_GEN0_THRESHOLD, 10, 10)
    gc.set_threshold(50000, 3, 4)  # higher already: kept
    process.tune_gc()
    assert gc.get_threshold() == (50000, 3, 4)
    gc.set_threshold(0, 10, 10)  # automatic collection off: stays off
    process.tune_gc()
    assert gc.get_threshold() == (0, 10, 10)


@pytest.mark.skipif(not CPYTHON, reason="the gc thresholds are CPython's")
def test_an_embedded_broker_leaves_the_settings_alone(gc_threshold, tmp_path):
    """Only the command tunes: an embedded NSQD changes nothing process-wide."""
    gc.set_threshold(700, 10, 10)
    nsqd = make_owner(tmp_path / "data")
    try:
        nsqd.start()
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        nsqd.stop()
