"""nsqadmin over a cluster that requires TLS (``nsqd --tls-required --https-address``): the
``--http-client-tls-*`` flags, Go's retry of a ``403 TLS_REQUIRED`` over HTTPS, and refusals
of unusable TLS settings at startup."""

import json
import subprocess
import sys
import urllib.request

import pytest

from nsqd_threaded.testing import Cluster

from support.admin import call
from support.transport import certs  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(120)


def https(broker, certs, method, path, body=None):
    url = "https://127.0.0.1:%d%s" % (broker.nsqd.https_address[1], path)
    req = urllib.request.Request(url, data=body, method=method)
    context = certs.client_context(client_cert=True)
    with urllib.request.urlopen(req, timeout=10, context=context) as resp:
        return resp.status, resp.read()


def billing(broker, certs):
    status, body = https(broker, certs, "GET", "/stats?format=json&topic=orders")
    [topic] = json.loads(body)["topics"]
    return topic, topic["channels"][0]


@pytest.fixture
def tls_cluster(certs):
    with Cluster(2, tls_cert=certs.server_cert, tls_key=certs.server_key, tls_root_ca_file=certs.ca,
                 https_address="127.0.0.1:0", tls_required=2) as cluster:
        for broker in cluster:
            assert broker.http("GET", "/ping")[0] == 403  # plain HTTP: TLS_REQUIRED
            assert https(broker, certs, "POST", "/topic/create?topic=orders")[0] == 200
            assert https(broker, certs, "POST", "/channel/create?topic=orders&channel=billing")[0] == 200
            assert https(broker, certs, "POST", "/pub?topic=orders", b"over tls")[0] == 200
        yield cluster



def test_a_tls_cluster_is_administered_with_its_ca(tls_cluster, certs, admin_factory):
    admin = admin_factory(lookupd_http_addresses=[tls_cluster.lookupd.http_addr],
                          http_client_tls_root_ca_file=certs.ca)
    status, doc = call(admin.http_url + "/api/topics/orders")
    assert status == 200 and doc["message"] == "", doc
    assert (doc["message_count"], len(doc["nodes"])) == (2, 2)
    node = tls_cluster[0].http_addr
    assert call(admin.http_url + "/api/nodes/" + node)[0] == 200
    assert call(admin.http_url + "/topics/orders")[0] == 200

    # actions reach the brokers over HTTPS too
    assert call(admin.http_url + "/api/topics/orders/billing", "POST", {"action": "pause"})[0] == 200
    assert all(billing(b, certs)[1]["paused"] for b in tls_cluster)
    assert call(admin.http_url + "/api/topics/orders/billing", "POST", {"action": "empty"})[0] == 200
    assert all(billing(b, certs)[1]["depth"] == 0 for b in tls_cluster)
    # the inside view too
    status, doc = call(admin.http_url + "/api/nodes/%s/state" % node)
    assert status == 200 and [t["name"] for t in doc["topics"]] == ["orders"]


def test_without_trust_the_brokers_fail_and_skip_verify_trusts_anything(tls_cluster, certs, admin_factory):
    lookupds = [tls_cluster.lookupd.http_addr]
    untrusting = admin_factory(lookupd_http_addresses=lookupds)  # the system's roots: not our test CA
    status, doc = call(untrusting.http_url + "/api/topics/orders")
    assert status == 502 and "CERTIFICATE_VERIFY_FAILED" in doc["message"], doc
    status, doc = call(untrusting.http_url + "/api/topics/orders/billing", "POST", {"action": "pause"})
    assert status == 200 and doc["message"].startswith("WARNING") and "CERTIFICATE_VERIFY_FAILED" in doc["message"]
    assert not any(billing(b, certs)[1]["paused"] for b in tls_cluster)

    trusting = admin_factory(lookupd_http_addresses=lookupds, http_client_tls_insecure_skip_verify=True)
    status, doc = call(trusting.http_url + "/api/topics/orders")
    assert (status, doc["message_count"]) == (200, 2)


def test_a_client_certificate_for_brokers_that_verify_one(certs, admin_factory):
    with Cluster(1, tls_cert=certs.server_cert, tls_key=certs.server_key, tls_root_ca_file=certs.ca,
                 https_address="127.0.0.1:0", tls_required=2, tls_client_auth_policy="require-verify") as cluster:
        assert https(cluster[0], certs, "POST", "/topic/create?topic=orders")[0] == 200
        lookupds = [cluster.lookupd.http_addr]
        without = admin_factory(lookupd_http_addresses=lookupds, http_client_tls_root_ca_file=certs.ca)
        assert call(without.http_url + "/api/topics/orders")[0] == 502
        admin = admin_factory(lookupd_http_addresses=lookupds, http_client_tls_root_ca_file=certs.ca,
                              http_client_tls_cert=certs.client_cert, http_client_tls_key=certs.client_key)
        status, doc = call(admin.http_url + "/api/topics/orders")
        assert status == 200 and doc["message"] == "", doc


def run_command(*args):
    return subprocess.run([sys.executable, "-m", "nsqd_threaded.admin", "--http-address=127.0.0.1:0",
                           "--lookupd-http-address=127.0.0.1:4161"] + list(args),
                          capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


def test_unusable_tls_settings_stop_the_command(certs, tmp_path):
    result = run_command("--http-client-tls-cert=" + certs.client_cert)
    assert result.returncode == 1
    assert "--http-client-tls-key must be specified with --http-client-tls-cert" in result.stderr
    result = run_command("--http-client-tls-key=" + certs.client_key)
    assert "--http-client-tls-cert must be specified with --http-client-tls-key" in result.stderr
    missing = str(tmp_path / "missing.pem")
    result = run_command("--http-client-tls-root-ca-file=" + missing)
    assert result.returncode == 1 and "failed to read TLS root CA file %s" % missing in result.stderr
    result = run_command("--http-client-tls-cert=" + certs.client_cert, "--http-client-tls-key=" + certs.server_key)
    assert result.returncode == 1 and "failed to LoadX509KeyPair" in result.stderr
    assert "Traceback" not in result.stderr
