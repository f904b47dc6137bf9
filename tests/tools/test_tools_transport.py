"""to_nsq and nsq_tail negotiate TLS and compression from go-nsq's option names, against a real broker."""

import pytest

from support.tools import run
from support.transport import certs, tls_options  # noqa: F401 (certs is a fixture)

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    "opts",
    [
        ["tls_v1"],
        ["snappy"],
        ["deflate", "deflate_level,4"],
        ["tls_v1,true", "deflate,true", "auth_secret,unused"],
        ["tls_v1", "tls_insecure_skip_verify"],
    ],
    ids=["tls", "snappy", "deflate", "tls+deflate", "tls-insecure"],
)
def test_to_nsq_then_nsq_tail_with_options(make_nsqd, certs, opts):  # noqa: F811
    nsqd = make_nsqd(**tls_options(certs))
    address = "%s:%d" % nsqd.tcp_address
    if "tls_insecure_skip_verify" not in opts and any(o.startswith("tls_v1") for o in opts):
        opts = opts + ["tls_root_ca_file," + certs.ca]
    n = 500
    lines = [("line %d " % i) * (i % 30 + 1) for i in range(n)]
    code, _, err = run("to_nsq", "--nsqd-tcp-address", address, "--topic", "t",
                       *["--producer-opt=" + o for o in opts], input=("\n".join(lines) + "\n").encode())
    assert code == 0, err
    assert nsqd.get_existing_topic("t").message_count == n
    code, out, err = run("tail", "--nsqd-tcp-address", address, "--topic", "t", "--channel", "tail", "-n", str(n),
                         *["--consumer-opt=" + o for o in opts])
    assert code == 0, err
    assert out.decode().splitlines() == lines


def test_a_tls_broker_with_an_unknown_ca_is_refused(make_nsqd, certs):  # noqa: F811
    nsqd = make_nsqd(**tls_options(certs))
    code, _, err = run("tail", "--nsqd-tcp-address", "%s:%d" % nsqd.tcp_address, "--topic", "t",
                       "--consumer-opt=tls_v1", "--consumer-opt=tls_root_ca_file," + certs.other_ca)
    assert code == 1 and "FATAL" in err and "TLS" in err
