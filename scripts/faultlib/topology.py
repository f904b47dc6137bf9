"""The cluster's fixed shape: where this repository is, the hosts' addresses, the ports, the topic.

Every host is a namespace of its own, so every broker can use Go's default ports."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The command the clients run as (``faults.py _producer ...``): the entry point, not this package.
FAULTS_SCRIPT = os.path.join(REPO, "scripts", "faults.py")
SUBNET = "10.200.0."
LOOKUPD_TCP, LOOKUPD_HTTP = 4160, 4161
NSQD_TCP, NSQD_HTTP = 4150, 4151
PROXY_TCP = 4150  # the proxy takes the broker's advertised port; the broker then listens on 127.0.0.1
TOPIC, CHANNEL = "faults", "check"
# Go's nsq_to_file (a third-party consumer, when its binary is at hand) reads a channel of its own:
# it gets a copy of every message, so its files alone say whether any acked message was lost.
ARCHIVE_CHANNEL = "archive"
HOST_ADDRESSES = {"l1": 2, "b1": 11, "b2": 12, "p1": 21, "c1": 31, "c2": 32, "a1": 41}
