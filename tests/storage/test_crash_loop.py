"""The crash loop's short version (scripts/crashloop.py runs hundreds of kills): a --durable broker
SIGKILLed at random instants under PUB, MPUB and DPUB while a consumer FINs, REQs, lets messages time
out and reconnects.  Nothing acknowledged is lost, and a message never delivered is delivered once."""

import os
import random
import sys

import pytest

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)

import crashloop  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_durable_kills_lose_nothing_and_duplicate_nothing_never_delivered(tmp_path):
    rng = random.Random(7)
    rounds = [crashloop.run_round(crashloop.MODES["durable"], str(tmp_path), rng) for _ in range(4)]
    totals = crashloop.tally(rounds)
    assert totals["work"]["acked"] > 0
    for channel in ("work", "audit"):
        assert (totals[channel]["lost"], totals[channel]["duplicated"]) == (0, 0), totals
    assert totals["audit"]["redelivered"] == 0  # never consumed: each acknowledged message there once
