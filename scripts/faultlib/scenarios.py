"""The scenarios: each builds its cluster, injects its fault on a timeline and returns the checker's
result with the figures particular to it.  ``SCENARIOS`` names them, ``ORDER`` is the report's order."""

import os
import signal
import time

from .history import now, read_history
from .network import run_cmd
from .topology import NSQD_HTTP, TOPIC


def cut_for(c, a, b, seconds):
    """Partition hosts ``a`` and ``b`` for ``seconds``, then heal; both moments marked in the history."""
    c.net.cut(a, b)
    c.mark("cut %s-%s" % (a, b))
    time.sleep(seconds)
    c.net.heal(a, b)
    c.mark("heal %s-%s" % (a, b))


def consumed(c, host):
    """How many deliveries consumer ``host`` has recorded so far."""
    return sum(1 for e in c.events("consumer-" + host) if e["ev"] == "msg")


def start_two_brokers(c, count, rate):
    """The common cluster: a lookupd, brokers b1 and b2 with the topic, consumer c1, producer p1 over both."""
    c.start_lookupd()
    for b in ("b1", "b2"):
        c.start_broker(b)
        c.create_topic(b)
    c.start_consumer("c1")
    c.start_producer("p1", ["b1", "b2"], count, rate)


def sc_producer_cut(c, short):
    """(1) The producer is cut from b1 mid-stream and fails over to b2; healed later."""
    count, rate = (1500, 300) if short else (6000, 300)
    start_two_brokers(c, count, rate)
    c.wait_for("30% acked", lambda: c.acked() >= count * 0.3, 60)
    cut_for(c, "p1", "b1", 5 if short else 15)
    return c.finish(60)


def sc_lookupd_cut(c, short):
    """(2) b1 is cut from lookupd for longer than a ping interval (15 s), then healed."""
    count, rate = (6000, 200) if short else (10000, 200)
    c.start_lookupd()
    c.start_watch()
    c.registration_host = "b1"
    for b in ("b1", "b2"):
        c.start_broker(b)
        c.create_topic(b)
    c.start_consumer("c1")
    c.start_producer("p1", ["b1", "b2"], count, rate)
    c.wait_for("500 acked", lambda: c.acked() >= 500, 60)
    cut_for(c, "b1", "l1", 17 if short else 30)
    t_heal = now()
    result = c.finish(60)
    via_b1 = [e["t"] for e in c.events("consumer-") if e["ev"] == "msg" and e["t"] >= t_heal
              and e["conn"].startswith(c.net.address("b1") + ":")]
    result["consumer_on_b1_after_heal"] = bool(via_b1)
    return result


def sc_consumer_cut(c, short):
    """(3) c1 is cut from its broker with messages in flight; after --msg-timeout they go to c2."""
    count, rate = (1200, 200) if short else (5000, 200)
    c.start_lookupd()
    c.start_broker("b1", msg_timeout="4s")
    c.create_topic("b1")
    c.start_consumer("c1", max_in_flight=20, work_ms=50)
    c.start_consumer("c2", max_in_flight=20, work_ms=50)
    c.start_producer("p1", ["b1"], count, rate)
    c.wait_for("30% acked", lambda: c.acked() >= count * 0.3, 60)
    # c1 finds b1 through lookupd (polled each second): on a loaded host its first messages may come
    # after 30 % acked, and a cut before them would hold nothing in flight
    c.wait_for("c1 handling messages", lambda: consumed(c, "c1") >= 5, 60)
    cut_for(c, "c1", "b1", 8 if short else 20)
    return c.finish(60)


def sc_broker_kill(c, short, durable=True):
    """(4) b1 killed with SIGKILL mid-stream (messages queued and in flight), restarted on its data."""
    count, rate = (1500, 300) if short else (6000, 300)
    kills = 1 if short else 3
    c.start_lookupd()
    for b in ("b1", "b2"):
        c.start_broker(b, durable=durable)
        c.create_topic(b)
    c.start_producer("p1", ["b1", "b2"], count, rate)
    c.wait_for("30% acked", lambda: c.acked() >= count * 0.3, 60)
    c.start_consumer("c1", max_in_flight=20, work_ms=20)  # late: a backlog sits on the brokers
    for i in range(kills):
        time.sleep(1.0)
        c.procs["nsqd-b1"].kill()
        c.mark("kill b1 (SIGKILL)")
        time.sleep(2.0)
        c.restart_broker("b1")
        c.mark("restart b1")
    return c.finish(90)


def sc_broker_kill_memory(c, short):
    """(4b) as broker_kill, with the brokers' defaults (no ``--durable``; Go's 10,000-message memory
    queue): what sat in memory is lost, bounded by the backlog and the messages in flight."""
    return sc_broker_kill(c, short, durable=False)


def sc_sigstop(c, short):
    """(6a) b1 paused with SIGSTOP (8 s short, 20 s full), then resumed."""
    count, rate = (3000, 200) if short else (8000, 200)
    start_two_brokers(c, count, rate)
    c.wait_for("20% acked", lambda: c.acked() >= count * 0.2, 60)
    c.procs["nsqd-b1"].signal(signal.SIGSTOP)
    c.mark("stop b1 (SIGSTOP)")
    time.sleep(8 if short else 20)
    c.procs["nsqd-b1"].signal(signal.SIGCONT)
    c.mark("cont b1 (SIGCONT)")
    return c.finish(90)


def sc_full_disk(c, short):
    """(6b) b1's data path is a 16 MiB tmpfs that a filler file fills; then the filler goes."""
    count, rate = (2000, 200) if short else (6000, 200)
    c.start_lookupd()
    c.start_broker("b1", tmpfs_mb=16)
    c.start_broker("b2")
    for b in ("b1", "b2"):
        c.create_topic(b)
    c.start_producer("p1", ["b1", "b2"], count, rate)
    c.wait_for("20% acked", lambda: c.acked() >= count * 0.2, 60)
    pid = c.procs["nsqd-b1"].pid
    filler = os.path.join(c.brokers["b1"]["data"], "filler")
    run_cmd(["nsenter", "-t", str(pid), "-m", "sh", "-c", "dd if=/dev/zero of=%s bs=1M count=64 2>/dev/null; true" % filler])
    c.mark("fill b1's disk")
    url = "http://%s:%d/pub?topic=%s" % (c.net.address("b1"), NSQD_HTTP, TOPIC)
    # A write may still land in a page the file already has: publish until the broker refuses.
    ok, answer = c.http("b1", "POST", url, data="x" * 1024, wait=0, retry_http_errors=False, repeat=2000)
    c.mark("HTTP pubs of 1 KiB on the full disk: %s" % answer[:80])
    c.full_disk_answer = answer
    time.sleep(3 if short else 10)
    run_cmd(["nsenter", "-t", str(pid), "-m", "rm", "-f", filler])
    c.mark("free b1's disk")
    ok, answer = c.http("b1", "POST", url, data="x" * 1024, wait=0, retry_http_errors=False, repeat=100)
    c.mark("HTTP pub after freeing: %s" % answer[:60])
    c.full_disk_recovered = ok
    c.start_consumer("c1")
    result = c.finish(90)
    result["full_disk_answer"] = c.full_disk_answer
    result["recovered"] = c.full_disk_recovered
    # The HTTP probes' bodies are not sequence numbers: the checker leaves them out.
    return result


def sc_lossy(c, short):
    """(5) every client link to the brokers through a proxy: 50 ms +- 20 ms per chunk, 2% of chunks
    held a further 200 ms (a retransmission), for the whole run."""
    seconds = 45 if short else 300
    rate = 500  # offered; what a window of 32 over ~100 ms round trips carries is the figure
    count = seconds * rate  # more than that carries: the producer is stopped after ``seconds``
    proxy = dict(delay_ms=50, jitter_ms=20, loss=0.02, rto_ms=200)
    c.start_lookupd()
    for b in ("b1", "b2"):
        c.start_broker(b, proxy=proxy)
        c.create_topic(b)
    c.start_consumer("c1", max_in_flight=50, work_ms=0)
    t0 = now()
    c.start_producer("p1", ["b1", "b2"], count, rate, window=32)
    c.mark("lossy links (proxy) from the start")
    time.sleep(seconds)
    c.procs["producer-p1"].stop(timeout=60.0)
    c.mark("producer stopped after %d s" % seconds)
    result = c.finish(90)
    pubs = [e for e in c.events("producer-") if e["ev"] == "pub" and e["ok"]]
    if pubs:
        result["throughput_per_s"] = round(len(pubs) / max(0.001, max(e["t"] for e in pubs) - t0), 1)
    errors = [e for e in c.events("consumer-") if e["ev"] == "error"]
    result["consumer_errors"] = len(errors)
    return result


def c1_back_after_resets(c, broker):
    """For each reset of ``broker``'s connections (when its proxy did it, a little after the signal):
    how long until c1 (our Consumer) took from ``broker`` a message published after it, so over a new
    connection (None if it never did).  A message received before the reset may still be handled
    after it: that one says nothing."""
    times = [e["t"] for e in read_history(c.path("proxy-%s.jsonl" % broker)) if e["ev"] == "reset"]
    prefix = c.net.address(broker) + ":"
    sent = {str(e["seq"]): e["ts"] for e in c.events("producer-") if e["ev"] == "pub"}
    got = sorted((e["t"], sent.get(e["seq"], 0.0)) for e in c.events("consumer-c1")
                 if e["ev"] == "msg" and e["conn"].startswith(prefix))
    out = []
    for t0 in times:
        later = [t for t, published in got if published >= t0]
        out.append(round(later[0] - t0, 2) if later else None)
    return out


def sc_stall_reset(c, short):
    """(5b) every client link to the brokers through a proxy with toxics: a stall shorter than a
    heartbeat interval (nothing may be dropped for it), a stall longer than two (Go's rule: the broker
    closes a connection silent for twice the heartbeat interval; the clients' own heartbeat checks
    close theirs), then RSTs of every connection, under load. c2 is pynsq's Reader (a third-party
    client): its history is checked with c1's. With Go's nsq_to_file at hand (``--go DIR`` or
    ``$NSQ_GO_BIN``), it runs too, on a channel of its own, and its files are checked for losses."""
    count, rate = (2400, 150) if short else (9000, 150)
    long_stall = 5 if short else 10
    resets = 1 if short else 3
    clients = 4 if c.want_archiver() else 3  # the connections each broker has: p1, c1, c2 (and a1)
    c.start_lookupd()
    for b in ("b1", "b2"):
        c.start_broker(b, proxy=dict(bandwidth_kbps=512))
        c.create_topic(b)
    c.start_consumer("c1", max_in_flight=20, work_ms=5)
    c.start_pynsq_consumer("c2", max_in_flight=20)
    if c.archiver:
        c.start_archiver()
    c.start_producer("p1", ["b1", "b2"], count, rate, window=8)
    c.wait_for("20% acked", lambda: c.acked() >= count * 0.2, 60)
    before = c.proxy_accepts("b1")
    c.stall_for("b1", 0.8)
    time.sleep(2.5)  # past two heartbeat intervals: a connection the stall broke would be redialled by now
    short_stall_new = c.proxy_accepts("b1") - before
    c.wait_for("40% acked", lambda: c.acked() >= count * 0.4, 60)
    before = c.proxy_accepts("b1")
    c.stall_for("b1", long_stall)
    t_flow = now()
    # Each client's connection dropped by the heartbeat rules and dialled again (maybe during the
    # stall: the proxy accepts and holds a new connection too).
    c.wait_for("the clients back on b1", lambda: c.proxy_accepts("b1") >= before + clients, 30)
    long_stall_redials = c.proxy_accepts("b1") - before
    back_after_reset = []
    back_by_client = []
    hosts = ["p1", "c1", "c2"] + (["a1"] if c.archiver else [])
    for i in range(resets):
        c.wait_for("%d%% acked" % (60 + 10 * i), lambda: c.acked() >= count * (0.6 + 0.1 * i), 60)
        resets_before = c.proxy_resets("b1")
        c.reset_links("b1")
        t_reset = now()
        # Every client back on b1, each by a connection the proxy accepted after it reset (so not one
        # the reset broke, nor one client's two dials counted for another's).  Ours redial within a
        # second; pynsq's Reader only when Reader.connect_to_nsqd lets it: an address at most once
        # per 10 s, counted from the last attempt (connection_attempts), and its last one is its
        # redial just after the long stall, a second or two before this reset: c2 is back 10-11 s
        # after it (9.5-11.0 s in 10 runs, on CPython 3.11 with tornado 6.0.4 and 3.13 with 6.6.1).
        # A dial of its that failed would cost 10 s more; 30 s leaves room for one.
        if c.wait_for("the clients back on b1 after the reset",
                      lambda: len(c.back_after_reset("b1", resets_before, hosts)) == len(hosts), 30):
            back_after_reset.append(round(now() - t_reset, 1))
        back = c.back_after_reset("b1", resets_before, hosts)
        back_by_client.append({h: back.get(h) for h in hosts})  # None: not back (the failure names it)
    result = c.finish(90)
    result["reset_back_s"] = back_after_reset
    result["reset_back_by_client_s"] = back_by_client
    result["c1_back_after_reset_s"] = c1_back_after_resets(c, "b1")
    result["short_stall_reconnects"] = short_stall_new
    b1 = c.net.address("b1") + ":"
    again = [e["t"] for e in c.events("consumer-c1") if e["ev"] == "msg" and e["t"] >= t_flow
             and e["conn"].startswith(b1)]
    result["long_stall_redials"] = long_stall_redials
    result["long_stall_b1_again_s"] = round(min(again) - t_flow, 2) if again else None
    result["pynsq_deliveries"] = sum(1 for e in c.events("consumer-c2") if e["ev"] == "msg")
    result["consumer_errors"] = len([e for e in c.events("consumer-") if e["ev"] == "error"])
    return result


def sc_archive_reset(c, short):
    """(5c) Go's nsq_to_file (go-nsq, a third-party consumer) beside our Consumer, every link to b1
    through the proxy, every connection reset mid-stream (once short, three times full); the
    archiver's files read back for lost messages.  Needs nsq_to_file (``--go DIR`` or
    ``$NSQ_GO_BIN``): skipped without it."""
    if not c.want_archiver():
        return {"skipped": "no nsq_to_file (give --go DIR or set NSQ_GO_BIN)"}
    count, rate = (600, 200) if short else (6000, 200)
    resets = 1 if short else 3
    c.start_lookupd()
    # Go nsqd keeps a reset client's in-flight messages until they time out: 5 s, within the drain.
    c.start_broker("b1", msg_timeout="5s", proxy=dict(delay_ms=0))
    c.create_topic("b1")
    c.start_consumer("c1", max_in_flight=20, work_ms=0)
    c.start_archiver()
    c.start_producer("p1", ["b1"], count, rate, window=8)
    back_after_reset = []
    for i in range(resets):
        share = (i + 1) / (resets + 1.0)
        c.wait_for("%d%% acked" % (share * 100), lambda: c.acked() >= count * share, 30)
        before = c.proxy_accepts("b1")
        c.reset_links("b1")
        t_reset = now()
        if c.wait_for("the clients back on b1 after the reset", lambda: c.proxy_accepts("b1") >= before + 3, 20):
            back_after_reset.append(round(now() - t_reset, 1))
    result = c.finish(30)
    result["reset_back_s"] = back_after_reset
    result["c1_back_after_reset_s"] = c1_back_after_resets(c, "b1")
    return result


def sc_soak(c, short, minutes=None):
    """(7) mixed PUB/DPUB and consume/REQ load with consumers connecting and leaving; the broker's RSS,
    threads and open files sampled each 10 s."""
    minutes = minutes or (1 if short else 10)
    rate = 100
    count = int(minutes * 60 * rate)
    c.start_lookupd()
    for b in ("b1", "b2"):
        c.start_broker(b)
        c.create_topic(b)
    c.start_consumer("c1", req_every=20)
    c.start_producer("p1", ["b1", "b2"], count, rate, dpub_every=10)
    samples = []
    end = time.monotonic() + minutes * 60
    turn = 0
    while time.monotonic() < end and not c.producer_done():
        time.sleep(10)
        samples.append(proc_sample(c.procs["nsqd-b1"].pid))
        turn += 1
        if turn % 3 == 0:  # c2 comes and goes
            name = "consumer-c2"
            if name in c.procs and c.procs[name].alive():
                c.procs[name].stop(timeout=8.0)
                c.mark("c2 leaves")
            else:
                c.start_consumer("c2", req_every=20)
                c.mark("c2 joins")
    result = c.finish(120)
    if len(samples) >= 4:
        warm = samples[len(samples) // 4]
        last = samples[-1]
        result["soak"] = {k: [warm[k], last[k]] for k in warm}
    with open(c.path("nsqd-b1.log"), errors="replace") as f:
        bad = [line.strip() for line in f if "Traceback" in line or "ERROR" in line]
    result["log_errors"] = len(bad)
    result["log_error_lines"] = bad[:3]
    return result


def proc_sample(pid):
    """RSS (KiB), threads and open files of a process, from /proc."""
    status = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k, _, v = line.partition(":")
                status[k] = v.split()[0] if v.split() else ""
        fds = len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return {"rss_kib": None, "threads": None, "fds": None}
    return {"rss_kib": int(status.get("VmRSS", 0)), "threads": int(status.get("Threads", 0)), "fds": fds}


SCENARIOS = {
    "producer_cut": sc_producer_cut,
    "lookupd_cut": sc_lookupd_cut,
    "consumer_cut": sc_consumer_cut,
    "broker_kill": sc_broker_kill,
    "broker_kill_memory": sc_broker_kill_memory,
    "sigstop": sc_sigstop,
    "full_disk": sc_full_disk,
    "lossy": sc_lossy,
    "stall_reset": sc_stall_reset,
    "archive_reset": sc_archive_reset,
    "soak": sc_soak,
}
ORDER = ["producer_cut", "consumer_cut", "broker_kill", "broker_kill_memory", "lookupd_cut", "sigstop", "full_disk", "lossy",
         "stall_reset", "archive_reset", "soak"]
