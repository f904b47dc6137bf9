"""A small synchronous NSQ client: :class:`Producer` and :class:`Consumer`.

Blocking sockets and threads, standard library only (no tornado, no asyncio), and
exact about the TCP protocol V2 (see ``tcp-protocol.md``):

* every connection sends the magic, then ``IDENTIFY`` (with feature negotiation; TLS,
  snappy or deflate only when asked: ``tls_v1``, ``snappy``, ``deflate``), and answers
  each ``_heartbeat_`` with ``NOP``;
* the Producer pipelines ``PUB``/``MPUB``/``DPUB`` from any number of threads on one
  connection and matches each ``OK`` or error frame to its request in order (nsqd
  answers the commands of a connection in the order it reads them);
* the Consumer sends ``SUB`` then ``RDY <max_in_flight>`` (split over its
  connections), hands messages to a handler or an iterator, and ``FIN``/``REQ``/
  ``TOUCH`` them; it reconnects with exponential backoff and closes with ``CLS``.

Across a cluster, the Producer spreads requests over several nsqd (given, or listed
by nsqlookupd's ``/nodes``) and sends a request again to the next one when its node
fails; the Consumer finds the nsqd of its topic with nsqlookupd's ``/lookup`` and
re-splits ``max_in_flight`` so that idle connections keep ``RDY 1`` and busy ones
share the rest.

Errors from nsqd are :class:`NSQError` (``code``, ``description``, ``fatal``).  Only
``E_FIN_FAILED``, ``E_REQ_FAILED`` and ``E_TOUCH_FAILED`` are non-fatal; after any
other error nsqd closes the connection.  FIN, REQ and TOUCH have no answer on
success, so their failures arrive later and go to the Consumer's ``on_error``.

Durations on the wire (``delay_ms``, IDENTIFY fields) are in milliseconds as in the
protocol; client-side waits (``timeout``, ``reconnect_backoff``) are in seconds.

Connection events (connecting, a failed dial, an IO error, re-connecting, each lookupd
query and failure) are logged in go-nsq's words to the ``logger`` a Producer or
Consumer is given (the tools give theirs), else to the ``logging`` module's
``nsqd_threaded.client`` (:mod:`nsqd_threaded.client.log`).
"""
from .connection import (
    DEFAULT_HEARTBEAT_MS,
    HEARTBEAT,
    USER_AGENT,
    Connection,
    ConnectionClosed,
    NSQError,
    parse_address,
    parse_addresses,
)
from .config import ClientConfig
from .consumer import Consumer, ReceivedMessage
from .lookupd import LOOKUPD_ACCEPT, lookup_addresses, parse_lookupd_address, producer_addresses, query_lookupd
from .producer import Producer

__all__ = ["ClientConfig", "Producer", "Consumer", "ReceivedMessage", "NSQError", "ConnectionClosed"]
