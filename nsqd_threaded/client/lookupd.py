"""Finding nsqd nodes through nsqlookupd's HTTP API (``/lookup``, ``/nodes``)."""

import http.client
import json
import time

from ..internal.gocompat import is_socket_path
from ..internal.httpclient import NSQ_V1_ACCEPT, request
from .connection import format_address, parse_address
from .log import error_words, lookupd_status_words

LOOKUPD_ACCEPT = NSQ_V1_ACCEPT


def parse_lookupd_address(address):
    """``"host:port"``, ``"http://host:port"`` or ``(host, port)`` -> ``(host, port)``; a unix
    socket path stays a path (a str)."""
    if isinstance(address, str) and not is_socket_path(address):
        address = address.split("://", 1)[-1].rstrip("/")
    return parse_address(address)


def query_lookupd(address, path, timeout):
    """``GET path`` on one nsqlookupd (the v1 API, unwrapped JSON): ``(status, doc)``; OSError if unreachable."""
    host, port = (address, None) if isinstance(address, str) else address  # a str: a socket path
    try:
        status, _, body = request("GET", host, port, path, headers={"Accept": LOOKUPD_ACCEPT},
                                  connect_timeout=timeout, deadline=time.monotonic() + timeout)
    except (OSError, http.client.HTTPException) as e:
        raise ConnectionError("nsqlookupd at %s: %s" % (format_address(address), e)) from None
    try:
        return status, json.loads(body.decode("utf-8"))
    except ValueError:
        raise ConnectionError("nsqlookupd at %s answered %d with no JSON" % (format_address(address), status)) from None


def producer_addresses(doc, port_field="tcp_port"):
    """The ``broadcast_address:tcp_port`` (or ``port_field``) of each producer of a ``/lookup`` or ``/nodes`` answer."""
    result = []
    for p in doc.get("producers") or ():
        try:
            result.append((str(p["broadcast_address"]).strip("[]"), int(p[port_field])))
        except (KeyError, TypeError, ValueError):
            continue
    return result


def lookupd_url(address, path):
    """The URL go-nsq names in its lookupd lines: ``http://127.0.0.1:4161/lookup?topic=orders``."""
    return "http://%s%s" % (format_address(address), path)


def lookup_addresses(lookupds, path, timeout, port_field="tcp_port", log=None):
    """The union of the producers ``path`` lists on every lookupd, in a stable order.

    A 404 (``TOPIC_NOT_FOUND``) counts as an empty answer.  Returns ``(addresses,
    errors)``: the lookupds that could not be asked are in ``errors``.  With a
    ``log`` (a :class:`~nsqd_threaded.client.log.ClientLog`) each query and each
    failure, a 404 included, is logged in go-nsq's words.
    """
    found, errors = {}, []
    for lookupd in lookupds:
        if log is not None:
            log.info("querying nsqlookupd %s", lookupd_url(lookupd, path))
        try:
            status, doc = query_lookupd(lookupd, path, timeout)
        except OSError as e:
            if log is not None:
                log.error("error querying nsqlookupd (%s) - %s", lookupd_url(lookupd, path), error_words(e))
            errors.append(e)
            continue
        if status == 200:
            for address in producer_addresses(doc, port_field):
                found.setdefault(address, None)
            continue
        if log is not None:
            log.error("error querying nsqlookupd (%s) - %s", lookupd_url(lookupd, path),
                      lookupd_status_words(status, json.dumps(doc, separators=(",", ":"))))
        if status != 404:
            errors.append(ConnectionError("nsqlookupd at %s answered %d %s" % (format_address(lookupd), status, doc)))
    return sorted(found), errors
