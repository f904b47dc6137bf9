"""The client modes: each runs inside a host's namespace as ``faults.py _<mode>`` and writes a history.

``_producer`` and ``_consumer`` drive the package's ``Producer`` and ``Consumer``, ``_pynsq_consumer``
pynsq's ``Reader`` (a third-party client), ``_watch`` polls lookupd's ``/nodes`` and ``_http`` makes
one HTTP request from a host.  The fault proxy mode (``_proxy``) is in :mod:`faultlib.proxy`."""

import json
import os
import random
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

from .history import History, now
from .topology import CHANNEL, REPO, TOPIC


def _stop_event():
    """An Event set by SIGTERM/SIGINT, for the client modes' main loops."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def client_producer(args):
    """Publish ``--count`` messages (``<seq>`` bodies) at ``--rate`` per second, at most ``--window``
    unanswered, over ``--nsqd`` (failover); every answer goes to the history."""
    sys.path.insert(0, REPO)
    from nsqd_threaded.client import Producer

    history = History(args.history)
    stop = _stop_event()
    producer = Producer(args.nsqd.split(","), timeout=args.timeout,
                        identify={"heartbeat_interval": args.heartbeat_ms}, reconnect_backoff=(0.1, 1.0))
    window = threading.Semaphore(args.window)
    interval = 1.0 / args.rate
    history.write("start", role="producer", pid=os.getpid())
    seq = 0
    next_at = time.monotonic()
    outstanding = []
    lock = threading.Lock()  # guards outstanding

    def answered(seq, sent, dpub, future):
        error = future.exception()
        history.write("pub", seq=seq, ts=sent, ok=error is None, err=None if error is None else repr(error)[:200],
                      dpub=dpub)
        window.release()

    while seq < args.count and not stop.is_set():
        delay = next_at - time.monotonic()
        if delay > 0:
            stop.wait(delay)
        next_at += interval
        if not window.acquire(timeout=1.0):
            next_at = time.monotonic()
            continue
        seq += 1
        body = "%d" % seq
        dpub = args.dpub_every and seq % args.dpub_every == 0
        sent = now()
        try:
            future = producer.dpub_async(TOPIC, 200, body) if dpub else producer.pub_async(TOPIC, body)
        except Exception as e:  # noqa: BLE001 - every failure is history
            history.write("pub", seq=seq, ts=sent, ok=False, err=repr(e)[:200])
            window.release()
            continue
        with lock:
            outstanding.append(future)
        future.add_done_callback(lambda f, s=seq, ts=sent, d=bool(dpub): answered(s, ts, d, f))
    # Wait for the answers still due (a cut connection is noticed after two heartbeats).
    deadline = time.monotonic() + args.timeout * 4
    with lock:
        pending = list(outstanding)
    for future in pending:
        try:
            future.exception(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - timed out: never answered
            pass
    history.write("done", sent=seq)
    producer.close(timeout=1.0)
    history.close()


def client_consumer(args):
    """Consume through lookupd (or ``--nsqd``), each message held ``--work-ms`` then FIN'd (or REQ'd,
    every ``--req-every``-th first attempt); deliveries and FINs go to the history until SIGTERM."""
    import logging

    sys.path.insert(0, REPO)
    from nsqd_threaded.client import Consumer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    history = History(args.history)
    stop = _stop_event()
    name = args.name

    def handle(message):
        seq = message.body[:20].decode("ascii", "replace")
        mid = message.id.decode("ascii", "replace")
        where = "%s:%d" % tuple(message.connection.address)
        history.write("msg", seq=seq, mid=mid, att=message.attempts, who=name, conn=where)
        if args.work_ms:
            time.sleep(args.work_ms / 1000.0)
        answer = "fin"
        if args.req_every and message.attempts == 1 and random.randrange(args.req_every) == 0:
            answer = "req"
        try:
            message.req(0) if answer == "req" else message.fin()
            history.write(answer, seq=seq, mid=mid, who=name, ok=True)
        except Exception as e:  # noqa: BLE001 - a FIN on a lost connection is history too
            history.write(answer, seq=seq, mid=mid, who=name, ok=False, err=repr(e)[:200])

    history.write("start", role="consumer", who=name, pid=os.getpid())
    consumer = Consumer(
        args.nsqd.split(",") if args.nsqd else None, TOPIC, CHANNEL, handle,
        max_in_flight=args.max_in_flight, concurrency=args.concurrency,
        lookupd_http_addresses=args.lookupd.split(",") if args.lookupd else None,
        lookupd_poll_interval=args.poll, identify={"heartbeat_interval": args.heartbeat_ms},
        reconnect_backoff=(0.1, 1.0), timeout=5.0, on_error=lambda e: history.write("error", err=repr(e)[:200]),
    )
    consumer.start(wait=False)
    stop.wait()
    consumer.close(timeout=3.0)
    history.write("done", who=name)
    history.close()


def client_watch(args):
    """Poll lookupd's ``/nodes`` every ``--interval`` seconds; each answer (or failure) to the history."""
    history = History(args.history)
    stop = _stop_event()
    while not stop.is_set():
        try:
            with urllib.request.urlopen(args.url, timeout=1.0) as r:
                doc = json.load(r)
            producers = doc.get("producers", (doc.get("data") or {}).get("producers", []))
            nodes = [{"addr": p.get("broadcast_address"), "remote": p.get("remote_address")} for p in producers]
            history.write("nodes", nodes=nodes)
        except (OSError, ValueError) as e:
            history.write("nodes_failed", err=repr(e)[:200])
        stop.wait(args.interval)
    history.close()


def client_http(args):
    """One HTTP request, retried until it answers 2xx or ``--wait`` passes; prints the status and body."""
    deadline = time.monotonic() + args.wait
    data = args.data.encode() if args.data is not None else None
    last = None
    if args.repeat:  # send it --repeat times; stop at the first refusal and say after how many
        for i in range(args.repeat):
            try:
                req = urllib.request.Request(args.url, data=data, method=args.method)
                with urllib.request.urlopen(req, timeout=5.0) as r:
                    r.read()
            except urllib.error.HTTPError as e:
                print("%d %s after %d accepted" % (e.code, e.read().decode("utf-8", "replace").strip(), i))
                return 1
            except OSError as e:
                print("%r after %d accepted" % (e, i))
                return 1
        print("200 OK x%d" % args.repeat)
        return 0
    while True:
        try:
            req = urllib.request.Request(args.url, data=data, method=args.method)
            with urllib.request.urlopen(req, timeout=2.0) as r:
                print(r.status, r.read().decode("utf-8", "replace"))
                return 0
        except urllib.error.HTTPError as e:
            last = "%d %s" % (e.code, e.read().decode("utf-8", "replace"))
            if not args.retry_http_errors:
                print(last)
                return 1
        except OSError as e:
            last = repr(e)
        if time.monotonic() >= deadline:
            print(last)
            return 1
        time.sleep(0.1)


def client_pynsq_consumer(args):
    """A third-party consumer: pynsq's Reader (tornado), through lookupd, ``--max-in-flight``, 1 s
    heartbeats, no attempt limit; each delivery and FIN to the history (the consumer's format)."""
    import logging

    import nsq
    import tornado.ioloop

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    history = History(args.history)
    name = args.name
    io_loop = tornado.ioloop.IOLoop.current()

    def handle(message):
        seq = message.body[:20].decode("ascii", "replace")
        mid = message.id.decode("ascii", "replace")
        history.write("msg", seq=seq, mid=mid, att=message.attempts, who=name, conn="pynsq")
        history.write("fin", seq=seq, mid=mid, who=name, ok=True)  # returning True FINs it
        return True

    reader = nsq.Reader(topic=TOPIC, channel=CHANNEL, message_handler=handle,
                        lookupd_http_addresses=["http://" + a for a in args.lookupd.split(",")],
                        lookupd_poll_interval=max(1, int(args.poll)), max_in_flight=args.max_in_flight,
                        heartbeat_interval=max(1, args.heartbeat_ms // 1000), max_tries=0)

    def on_term(*_):
        io_loop.add_callback_from_signal(io_loop.stop)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_term)
    history.write("start", role="consumer", who=name, pid=os.getpid(), client="pynsq " + nsq.__version__)
    io_loop.start()
    reader.close()
    io_loop.call_later(0.5, io_loop.stop)
    io_loop.start()
    history.write("done", who=name)
    history.close()
