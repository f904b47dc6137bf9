"""Delivery behaviour against Go nsqd's: the same client sessions, the same observations.

Each session (tests/support/delivery.py) is played by raw consumers that hold
messages, FIN, REQ and TOUCH some, change RDY, leave, and let messages time
out.  After every step what the clients observe is compared: no message held
back from a consumer with a free RDY slot, none beyond RDY, the same errors,
the freed slots refilled after a timeout, nothing lost.  Against Go nsqd (the
reference binary, when present) ours must observe exactly what Go's clients
observe; without it, the contract that Go's runs confirm.
scripts/delivery_diff.py plays many more random seeds.
"""

import os

import pytest

from support import delivery

pytestmark = pytest.mark.timeout(240)

SCRIPTS = dict(delivery.scripted_sessions())
SCRIPTS.update(("seed-%d" % seed, delivery.random_session(seed, steps=18)) for seed in (11, 23, 37))
needs_go = pytest.mark.skipif(not os.access(delivery.GO_NSQD, os.X_OK), reason="Go nsqd reference binary absent")


def topic(name):
    return "delivery-" + name


@pytest.fixture(scope="module")
def go_broker():
    broker = delivery.GoBroker()
    try:
        broker.prepare([topic(name) for name in SCRIPTS])
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="module")
def our_broker():
    broker = delivery.OurBroker()
    try:
        yield broker
    finally:
        broker.close()


def differences(ours, theirs):
    return [(a, b) for a, b in zip(ours, theirs) if a != b] + (
        [("length", len(ours), len(theirs))] if len(ours) != len(theirs) else [])


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_session_keeps_nsqds_delivery_contract(our_broker, name):
    script = SCRIPTS[name]
    ours = delivery.play(our_broker, script, topic(name) + "-alone")[0]
    assert differences(ours, delivery.ideal(script)) == []


@needs_go
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_session_observes_what_go_nsqd_clients_observe(go_broker, our_broker, name):
    script = SCRIPTS[name]
    go = delivery.play(go_broker, script, topic(name))[0]
    ours = delivery.play(our_broker, script, topic(name))[0]
    assert differences(ours, go) == []
    assert differences(go, delivery.ideal(script)) == [], "Go nsqd no longer keeps the contract"
