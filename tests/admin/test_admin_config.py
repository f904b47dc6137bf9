"""nsqadmin's ``/config/:opt`` (Go nsqadmin's, from ``--allow-config-from-cidr``) and the message
bodies of the inside view (``--inside-view-bodies``, admins only)."""

import http.client
import json

import pytest

from nsqd_threaded.admin import AdminOptions
from nsqd_threaded.admin.api import without_bodies
from nsqd_threaded.settings.options import OptionError
from nsqd_threaded.testing import Cluster

from support.admin import call
from support.wire import wait_for

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def cluster():
    with Cluster(1, debug_state_bodies=True) as c:
        broker = c[0]
        assert broker.http("POST", "/topic/create?topic=orders")[0] == 200
        assert broker.http("POST", "/channel/create?topic=orders&channel=billing")[0] == 200
        assert broker.http("POST", "/pub?topic=orders", b"card 4111")[0] == 200
        wait_for(lambda: c.lookupd.lookup("orders"), what="the registration")
        yield c



def raw(admin, method, path, body=None, headers=None):
    """``(status, content type, body)`` as sent."""
    conn = http.client.HTTPConnection(*admin.http_address, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type"), resp.read()
    finally:
        conn.close()


# -- /config/:opt -------------------------------------------------------------------------------------


def test_config_reads_every_setting_as_go_does(cluster, admin_factory):
    admin = admin_factory(lookupd_http_addresses=[cluster.lookupd.http_addr])
    lookupd = cluster.lookupd.http_addr
    assert raw(admin, "GET", "/config/nsqlookupd_http_addresses") == (
        200, "application/json; charset=utf-8", json.dumps([lookupd]).replace(" ", "").encode())
    assert raw(admin, "GET", "/config/log_level")[::2] == (200, b"2")  # debug 1 ... fatal 5
    assert raw(admin, "GET", "/config/http_client_request_timeout")[::2] == (200, b"5000000000")
    assert raw(admin, "GET", "/config/base_path") == (200, "text/plain; charset=utf-8", b"/")
    assert raw(admin, "GET", "/config/allow_config_from_cidr")[::2] == (200, b"127.0.0.1/8")
    assert raw(admin, "GET", "/config/admin_users")[::2] == (200, b"[]")
    assert raw(admin, "GET", "/config/http_client_tls_insecure_skip_verify")[::2] == (200, b"false")
    assert raw(admin, "GET", "/config/nope") == (400, "application/json; charset=utf-8",
                                                 b'{"message":"INVALID_OPTION"}')
    assert raw(admin, "GET", "/config/config")[0] == 400  # a command-line flag, not a setting


def test_config_changes_the_lookupds_and_the_log_level(cluster, admin_factory):
    admin = admin_factory(lookupd_http_addresses=["127.0.0.1:1"])  # nothing listens there
    assert call(admin.http_url + "/api/topics")[0] == 502
    body = json.dumps([cluster.lookupd.http_addr]).encode()
    status, _, answer = raw(admin, "PUT", "/config/nsqlookupd_http_addresses", body)
    assert (status, json.loads(answer)) == (200, [cluster.lookupd.http_addr])
    assert call(admin.http_url + "/api/topics") == (200, {"topics": ["orders"], "message": ""})

    assert raw(admin, "PUT", "/config/log_level", b"WARN")[::2] == (200, b"3")
    assert admin.log.level == 3 and admin.options.log_level == "warn"

    # what Go refuses
    assert raw(admin, "PUT", "/config/log_level", b"")[::2] == (413, b'{"message":"INVALID_VALUE"}')
    assert raw(admin, "PUT", "/config/log_level", b"loud")[::2] == (400, b'{"message":"INVALID_VALUE"}')
    assert raw(admin, "PUT", "/config/nsqlookupd_http_addresses", b'"x:1"')[::2] == (
        400, b'{"message":"INVALID_VALUE"}')
    assert raw(admin, "PUT", "/config/base_path", b"/x")[::2] == (400, b'{"message":"INVALID_OPTION"}')
    assert raw(admin, "PUT", "/config/log_level", b"x" * ((1 << 20) + 1))[0] == 413
    # a browser on another origin cannot change it either
    assert raw(admin, "PUT", "/config/log_level", b"debug", {"Origin": "http://evil.example"})[::2] == (
        403, b'{"message":"CROSS_ORIGIN_FORBIDDEN"}')
    assert admin.options.log_level == "warn"


def test_config_only_from_the_allowed_cidr(cluster, admin_factory):
    admin = admin_factory(lookupd_http_addresses=[cluster.lookupd.http_addr], allow_config_from_cidr="10.0.0.0/8")
    assert raw(admin, "GET", "/config/log_level")[::2] == (403, b'{"message":"FORBIDDEN"}')
    assert raw(admin, "PUT", "/config/log_level", b"debug")[::2] == (403, b'{"message":"FORBIDDEN"}')
    assert admin.options.log_level == "info"
    anyone = admin_factory(lookupd_http_addresses=[cluster.lookupd.http_addr], allow_config_from_cidr="")
    assert raw(anyone, "GET", "/config/log_level")[::2] == (200, b"2")


def test_config_cidr_is_checked_at_startup():
    for bad in ("127.0.0.1", "300.0.0.0/8", "nope/8"):
        with pytest.raises(OptionError, match="allow-config-from-cidr"):
            AdminOptions(lookupd_http_addresses=["a:1"], allow_config_from_cidr=bad).validate()
    assert AdminOptions().allow_config_from_cidr == "127.0.0.1/8"  # Go's default


# -- message bodies through the inside view --------------------------------------------------------------


def bodies(doc):
    return [m.get("body") for t in doc["topics"] for c in t["channels"] for m in c["memory"]]


def test_the_inside_view_shows_no_body_by_default(cluster, admin_factory):
    admin = admin_factory(lookupd_http_addresses=[cluster.lookupd.http_addr])
    status, doc = call(admin.http_url + "/api/nodes/%s/state" % cluster[0].http_addr)
    assert status == 200 and bodies(doc) == [None]
    assert "card 4111" not in json.dumps(doc)  # (the number alone may be in a timestamp)


def test_the_inside_view_shows_bodies_to_admins_with_the_flag(cluster, admin_factory):
    admin = admin_factory(lookupd_http_addresses=[cluster.lookupd.http_addr], admin_users=["ops"],
                          inside_view_bodies=True)
    url = admin.http_url + "/api/nodes/%s/state" % cluster[0].http_addr
    status, doc = call(url, headers={"X-Forwarded-User": "ops"})
    assert status == 200 and bodies(doc) == ["card 4111"]
    for headers in ({}, {"X-Forwarded-User": "mallory"}):
        status, doc = call(url, headers=headers)
        assert status == 200 and bodies(doc) == [None] and doc["topics"][0]["channels"][0]["memory_depth"] == 1


def test_the_bodies_flag_requires_admin_users():
    with pytest.raises(OptionError, match="--inside-view-bodies requires --admin-user"):
        AdminOptions(lookupd_http_addresses=["a:1"], inside_view_bodies=True).validate()


def test_bodies_a_node_sends_unasked_are_dropped():
    """A node that sends bodies anyway (hostile, or an older broker): none of them goes on, at any depth."""
    doc = {"topics": [{"name": "t", "bodies": True, "memory": [{"id": "1", "body": "secret"}],
                       "channels": [{"bodies": True, "in_flight": [{"body": "x", "extra": [{"body": "y"}]}]}]}],
           "body": "top"}
    without_bodies(doc)
    assert "secret" not in json.dumps(doc) and '"body"' not in json.dumps(doc)
    assert doc["topics"][0]["bodies"] is False and doc["topics"][0]["channels"][0]["bodies"] is False
