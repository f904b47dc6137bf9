"""go-nsq's option names (ClientConfig), max_attempts and backoff, against a real broker."""

import threading

import pytest

from nsqd_threaded.client import ClientConfig, Consumer, Producer
from nsqd_threaded.client.config import ClientConfigError
from nsqd_threaded.testing import Broker

from support.wire import wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def broker():
    with Broker() as b:
        yield b


def subscribed(broker):
    return [c for c in broker.nsqd.clients() if c.channel is not None]


# -- the option table ---------------------------------------------------------------------


def test_go_nsq_names_defaults_and_syntax():
    config = ClientConfig()
    assert (config["max_in_flight"], config["max_attempts"], config["max_backoff_duration"]) == (1, 5, 120.0)
    config.set_flag("max-in-flight,50")  # ConfigFlag: "name,value"; '-' is '_'
    config.set_flag("snappy")  # a name alone is true
    config.set_flag("msg_timeout,1m30s")
    config.set_flag("heartbeat_interval,5000")  # integer milliseconds, as go-nsq coerces them
    config.set_flag("deflate_level,9")
    assert config["max_in_flight"] == 50 and config["snappy"] is True
    assert (config["msg_timeout"], config["heartbeat_interval"]) == (90.0, 5.0)
    assert config.identify()["msg_timeout"] == 90000 and config.identify()["heartbeat_interval"] == 5000
    with pytest.raises(ClientConfigError, match="invalid option nope"):
        config.set_flag("nope,1")
    with pytest.raises(ClientConfigError, match="deflate_level"):
        config.set_flag("deflate_level,10")
    with pytest.raises(ClientConfigError, match="tls_v1"):
        config.set_flag("tls_v1,maybe")
    with pytest.raises(ClientConfigError, match="local_addr"):
        config.set_flag("local_addr,127.0.0.1:0")


def test_options_are_negotiated_with_a_real_broker(broker):
    config = ClientConfig()
    for flag in ("deflate", "deflate_level,3", "sample_rate,40", "user_agent,tool/1.0", "client_id,abc",
                 "output_buffer_timeout,100ms", "max_in_flight,7"):
        config.set_flag(flag)
    received = []
    with Producer(broker.tcp_addr, **config.producer_kwargs()) as producer:
        producer.pub("t", b"x")
    consumer = Consumer(broker.tcp_addr, "t", "c", received.append, **config.consumer_kwargs())
    with consumer:
        client = wait_for(lambda: [c for c in subscribed(broker) if c.ready_count == 7], what="RDY 7")[0]
        assert (client.user_agent, client.client_id, client.sample_rate) == ("tool/1.0", "abc", 40)
        assert client.deflate
        assert client.output_buffer_timeout in (0.1, 100)  # held in the broker's units


# -- max_attempts ------------------------------------------------------------------------


def test_a_message_past_max_attempts_is_given_up_and_fined(broker):
    given_up = []
    done = threading.Event()

    def give_up(msg):
        given_up.append((msg.body, msg.attempts))
        done.set()

    with Producer(broker.tcp_addr) as producer:
        producer.pub("t", b"poison")
    consumer = Consumer(broker.tcp_addr, "t", "c", lambda m: False, max_attempts=3, on_give_up=give_up,
                        requeue_delay_ms=0)
    with consumer:
        assert done.wait(20)
    assert given_up == [(b"poison", 4)]
    wait_for(lambda: broker.stats(topic="t")["topics"][0]["channels"][0]["depth"] == 0
             and broker.stats(topic="t")["topics"][0]["channels"][0]["in_flight_count"] == 0,
             what="the message FINed")


# -- backoff -------------------------------------------------------------------------------


def test_backoff_is_rdy_0_then_a_test_rdy_1_then_max_in_flight(broker):
    handled = []

    def handler(msg):
        handled.append(msg.body)
        return msg.body != b"fails"

    consumer = Consumer(broker.tcp_addr, "t", "c", handler, max_in_flight=10, requeue_delay_ms=60000,
                        backoff_multiplier=0.5, max_backoff_duration=2.0)
    with consumer, Producer(broker.tcp_addr) as producer:
        wait_for(lambda: subscribed(broker) and subscribed(broker)[0].ready_count == 10, what="RDY 10")
        producer.pub("t", b"fails")
        wait_for(lambda: consumer.backoff_level == 1, what="backoff level 1")
        wait_for(lambda: subscribed(broker)[0].ready_count == 0, what="RDY 0 while backing off")
        producer.pub("t", b"works")  # held back until the backoff period (1s) is over and RDY 1 tests
        assert handled == [b"fails"]
        wait_for(lambda: subscribed(broker)[0].ready_count == 10, timeout=15, what="RDY back to max_in_flight")
        assert handled == [b"fails", b"works"] and consumer.backoff_level == 0


def test_backoff_off_by_default_and_requeue_minus_one_is_go_nsqs_delay(broker):
    consumer = Consumer(broker.tcp_addr, "t", "c", lambda m: None, default_requeue_delay=2.0, max_requeue_delay=5.0)
    assert not consumer.backs_off

    class Msg:
        attempts = 2

    assert consumer.requeue_delay_for(Msg()) == 4000
    Msg.attempts = 9
    assert consumer.requeue_delay_for(Msg()) == 5000
