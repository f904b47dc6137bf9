"""A fault harness: an NSQ cluster across Linux network namespaces, faults injected, histories checked.

    scripts/faults.py --scenario producer_cut [--scenario ...] [--short] [--go DIR] [--report]
    scripts/faults.py --scenario all --short --go /path/to/go-nsq-1.3.0 --report

Needs root, ``ip`` (iproute2) and ``unshare``/``nsenter`` (util-linux).  Every
name it makes starts with ``nsqf-<pid>-`` (namespaces) and lives inside those
namespaces (links, addresses, routes); everything is removed at the end, on an
error, on Ctrl-C and on SIGTERM.  The hosts are namespaces joined by veth pairs
to a bridge that lives in a namespace of its own, addressed 10.200.0.0/24.

Every process runs inside its host's namespace through ``ip netns exec``:
nsqlookupd and nsqd (ours, ``python -m nsqd_threaded``, or Go's with ``--go``),
and the clients, which are ``scripts/faults.py`` in a client mode (``_producer``,
``_consumer``, ``_pynsq_consumer``, ``_watch``, ``_http``, ``_proxy``) writing a
JSON-lines history; with ``--go`` (or ``$NSQ_GO_BIN``) Go's ``nsq_to_file`` joins some
scenarios as a third-party consumer, its files read back for losses.
The checker reads the histories: acked messages never delivered (lost),
messages delivered more than once and why, and recovery times.  What each
scenario does and the figures are in docs/reliability.md ("Faults across a
network").  Standalone on purpose: the standard library and this repository only.

The modules, from the bottom up:

* ``topology``: the hosts' addresses, the ports, the topic;
* ``history``: the JSON-lines histories;
* ``network``: namespaces, veth pairs, the bridge, partitions (blackhole routes);
* ``clients``: the client modes (producer, consumer, pynsq's Reader, lookupd watcher, HTTP);
* ``proxy``: the userspace fault proxy mode (the package's ``nsqd_threaded.testing.FaultProxy``);
* ``checker``: lost, duplicates and why, recovery times;
* ``cluster``: processes in the hosts (ours or Go's) and their fault controls;
* ``scenarios``: the faults, one function each;
* ``runner``, ``report``, ``cli``: running scenarios, the table, the command line.
"""
