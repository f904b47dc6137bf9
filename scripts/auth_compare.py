#!/usr/bin/env python3
"""AUTH side by side: the same raw-byte scenarios against Go nsqd and ours, one auth server for both.

    scripts/auth_compare.py --go-nsqd PATH/TO/nsqd

Prints SAME or DIFF (with both answers) per scenario: IDENTIFY's auth_required, AUTH's answer, every
auth error, and the /stats keys of an authed producer.  Go's IDENTIFY response and /stats lack the
topology keys (see docs/divergences.md).
"""

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from test_auth import AuthServer  # noqa: E402
from wire import Conn, wait_for  # noqa: E402

from nsqd_threaded import NSQD, Options  # noqa: E402
from nsqd_threaded.wire import protocol_v2  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# (name, [(command line, body or None), ...]): each on a fresh connection, one frame read per command
SCENARIOS = [
    ("identify", [(b"IDENTIFY", json.dumps({"feature_negotiation": True}).encode())]),
    ("auth ok", [(b"AUTH", b"all"), (b"PUB t", b"m")]),
    ("pub first", [(b"PUB t", b"m")]),
    ("sub first", [(b"SUB t c", None)]),
    ("mpub first", [(b"MPUB t", protocol_v2.encode_mpub_body([b"a"]))]),
    ("dpub first", [(b"DPUB t 1", b"m")]),
    ("auth twice", [(b"AUTH", b"all"), (b"AUTH", b"all")]),
    ("no authorizations", [(b"AUTH", b"nothing")]),
    ("auth server 401", [(b"AUTH", b"unknown")]),
    ("pub denied", [(b"AUTH", b"pub-only"), (b"PUB other", b"m")]),
    ("mpub denied", [(b"AUTH", b"pub-only"), (b"MPUB other", protocol_v2.encode_mpub_body([b"a"]))]),
    ("sub denied", [(b"AUTH", b"pub-only"), (b"SUB pub c", None)]),
    ("unanchored", [(b"AUTH", b"ok-topics"), (b"SUB is_ok_x very_good", None)]),
    ("empty channels, pub", [(b"AUTH", b"no-channels"), (b"PUB t", b"m")]),
    ("html in identity", [(b"AUTH", b"<html>&")]),
    ("auth with a param", [(b"AUTH x", b"all")]),
]


def run(tcp, steps):
    answers = []
    with Conn(tcp, timeout=3) as c:
        for line, body in steps:
            c.cmd(line, body)
            try:
                answers.append(c.read_frame())
            except (OSError, EOFError) as e:
                answers.append(("closed", type(e).__name__))
    return answers


def scenarios(tcp, http):
    out = [(name, run(tcp, steps)) for name, steps in SCENARIOS]
    with Conn(tcp, timeout=3) as c:  # an authed producer in /stats
        c.cmd(b"AUTH", b"all")
        c.read_frame()
        c.cmd(b"PUB st", b"m")
        c.read_frame()
        with urllib.request.urlopen("http://%s:%d/stats?format=json&topic=st" % http, timeout=10) as r:
            client = json.loads(r.read())["producers"][0]
    out.append(("stats keys", list(client)))
    out.append(("stats auth", [client.get(k) for k in ("authed", "auth_identity", "auth_identity_url")]))
    return out


def compare(go_nsqd, server):
    with tempfile.TemporaryDirectory() as go_data, tempfile.TemporaryDirectory() as our_data:
        tcp_port, http_port = free_port(), free_port()
        go = subprocess.Popen(
            [go_nsqd, "--tcp-address=127.0.0.1:%d" % tcp_port, "--http-address=127.0.0.1:%d" % http_port,
             "--data-path=" + go_data, "--auth-http-address=" + server.address],
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", tcp_port)) == 0, what="Go nsqd")
            theirs = scenarios(("127.0.0.1", tcp_port), ("127.0.0.1", http_port))
        finally:
            go.terminate()
            go.wait()
        nsqd = NSQD(Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", data_path=our_data, node_id=1,
                            auth_http_addresses=[server.address]), log_stream=io.StringIO())
        nsqd.start()
        try:
            ours = scenarios(nsqd.tcp_address, nsqd.http_address)
        finally:
            nsqd.stop()
    for (name, g), (_, o) in zip(theirs, ours):
        if name == "identify":  # JSON: compare the documents, without the version
            g = [(ft, dict(json.loads(d), version=None)) for ft, d in g]
            o = [(ft, dict(json.loads(d), version=None)) for ft, d in o]
        print("SAME" if g == o else "DIFF", name)
        if g != o:
            print("   go :", g)
            print("   our:", o)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--go-nsqd", required=True, help="Go nsqd binary")
    args = parser.parse_args()
    server = AuthServer()
    try:
        compare(args.go_nsqd, server)
    finally:
        server.close()


if __name__ == "__main__":
    main()
