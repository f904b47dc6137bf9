"""go-nsq (the reference's to_nsq and nsq_tail) over TLS, snappy and deflate; skipped without the binaries."""

import os
import subprocess

import pytest

from support.transport import certs, tls_options  # noqa: F401 (fixture)

GO_BIN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "reference", "go-nsq-1.3.0")
TO_NSQ = os.path.join(GO_BIN, "to_nsq")
NSQ_TAIL = os.path.join(GO_BIN, "nsq_tail")

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not (os.access(TO_NSQ, os.X_OK) and os.access(NSQ_TAIL, os.X_OK)),
                       reason="the Go reference binaries are not here"),
]


@pytest.mark.parametrize(
    "opts",
    [
        ["tls_v1,true"],
        ["snappy,true"],
        ["deflate,true", "deflate_level,4"],
        ["tls_v1,true", "snappy,true"],
        ["tls_v1,true", "deflate,true"],
    ],
    ids=["tls", "snappy", "deflate", "tls+snappy", "tls+deflate"],
)
def test_go_nsq_producer_and_consumer(make_nsqd, certs, opts):
    nsqd = make_nsqd(**tls_options(certs))
    address = "%s:%d" % nsqd.tcp_address
    if "tls_v1,true" in opts:
        opts = opts + ["tls_root_ca_file," + certs.ca]
    n = 2000
    lines = [("line %d " % i) * (i % 30 + 1) for i in range(n)]
    producer = ["--producer-opt=" + o for o in opts]
    subprocess.run([TO_NSQ, "--nsqd-tcp-address", address, "--topic", "go"] + producer,
                   input="\n".join(lines) + "\n", universal_newlines=True, check=True, timeout=60,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert nsqd.get_existing_topic("go").message_count == n
    consumer = ["--consumer-opt=" + o for o in opts]
    out = subprocess.run([NSQ_TAIL, "--nsqd-tcp-address", address, "--topic", "go", "--channel", "tail",
                          "-n", str(n), "--max-in-flight", "2500"] + consumer,
                         universal_newlines=True, check=True, timeout=60, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL).stdout
    assert sorted(out.splitlines()) == sorted(lines)


def test_go_nsq_with_a_client_certificate(make_nsqd, certs):
    nsqd = make_nsqd(**tls_options(certs, tls_client_auth_policy="require-verify", tls_root_ca_file=certs.ca))
    address = "%s:%d" % nsqd.tcp_address
    opts = ["tls_v1,true", "tls_root_ca_file," + certs.ca, "tls_cert," + certs.client_cert,
            "tls_key," + certs.client_key, "snappy,true"]
    subprocess.run([TO_NSQ, "--nsqd-tcp-address", address, "--topic", "go"] + ["--producer-opt=" + o for o in opts],
                   input="one\ntwo\n", universal_newlines=True, check=True, timeout=60,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = subprocess.run([NSQ_TAIL, "--nsqd-tcp-address", address, "--topic", "go", "--channel", "tail", "-n", "2"]
                         + ["--consumer-opt=" + o for o in opts],
                         universal_newlines=True, check=True, timeout=60, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL).stdout
    assert sorted(out.splitlines()) == ["one", "two"]
