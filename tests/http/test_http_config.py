"""/config: reading and changing settings at run time."""

import pytest

from support.http_api import (  # noqa: F401 (fixtures among them)
    HTTP,
    assert_empty,
    assert_error,
    assert_json,
    assert_text,
    h,
)

# -- /config --------------------------------------------------------------------------


def test_config_get_values(make_nsqd):
    nsqd = make_nsqd(
        e2e_processing_latency_percentiles=[0.5, 0.99],
        broadcast_address="127.0.0.1",
        nsqlookupd_tcp_addresses=[],
    )
    h = HTTP(nsqd)
    port = nsqd.http_address[1]
    json_cases = {
        "mem_queue_size": b"10000",
        "msg_timeout": b"60000000000",
        "max_msg_timeout": b"900000000000",
        "max_req_timeout": b"3600000000000",
        "sync_timeout": b"2000000000",
        "output_buffer_timeout": b"250000000",
        "min_output_buffer_timeout": b"25000000",
        "e2e_processing_latency_window_time": b"600000000000",
        "log_level": b"2",
        "tls_min_version": b"769",
        "tls_required": b"0",
        "max_msg_size": b"1048576",
        "max_body_size": b"5242880",
        "max_rdy_count": b"2500",
        "statsd_mem_stats": b"true",
        "statsd_exclude_ephemeral": b"false",
        "nsqlookupd_tcp_addresses": b"[]",
        "auth_http_addresses": b"[]",
        "e2e_processing_latency_percentiles": b"[0.99,0.5]",
        "id": b"1",
        "broadcast_tcp_port": str(nsqd.tcp_address[1]).encode(),
        "broadcast_http_port": str(port).encode(),
    }
    for name, body in json_cases.items():
        assert_json(h.get("/config/" + name), body)
    text_cases = {
        "statsd_prefix": b"nsq.127_0_0_1_%d." % port,
        "broadcast_address": b"127.0.0.1",
        "http_address": b"127.0.0.1:0",
        "https_address": b"0.0.0.0:4152",
        "auth_http_request_method": b"get",
        "log_prefix": b"[nsqd] ",
        "data_path": nsqd.options.data_path.encode(),
    }
    for name, body in text_cases.items():
        assert_text(h.get("/config/" + name), body)


def test_config_empty_string_option_is_an_unsniffed_empty_body(nsqd, h):
    # An empty string result writes the same zero bytes as a nil one: nothing to sniff.
    assert_empty(h.get("/config/topology_zone"))
    assert_empty(h.get("/config/tls_cert"))


@pytest.mark.parametrize(
    "name",
    ["node_id", "nosuch", "client_timeout", "queue_scan_interval", "queue_scan_refresh_interval",
     "queue_scan_dirty_percent", "logger", "version", "Log_Level"],
)  # fmt: skip
def test_config_get_invalid_option(h, name):
    assert_error(h.get("/config/" + name), 400, "INVALID_OPTION")


@pytest.mark.parametrize("name", ["validate", "durable_unknown", "__class__"])
def test_config_get_method_names_are_not_options(h, name):
    assert_error(h.get("/config/" + name), 400, "INVALID_OPTION")


def test_config_put_log_level(nsqd, h):
    assert_json(h.put("/config/log_level", b"warn"), b"3")
    assert_json(h.get("/config/log_level"), b"3")
    assert_json(h.put("/config/log_level", b"ERROR"), b"4")
    assert_json(h.put("/config/log_level", b"Debug"), b"1")
    assert_error(h.put("/config/log_level", b"info\n"), 400, "INVALID_VALUE")
    assert_error(h.put("/config/log_level", b" info"), 400, "INVALID_VALUE")
    assert_error(h.put("/config/log_level", b"verbose"), 400, "INVALID_VALUE")
    assert_error(h.put("/config/log_level", b"2"), 400, "INVALID_VALUE")
    assert_error(h.put("/config/log_level", b""), 413, "INVALID_VALUE")
    assert_error(h.put("/config/log_level"), 413, "INVALID_VALUE")
    assert_json(h.get("/config/log_level"), b"1")  # failures changed nothing
    assert_json(h.put("/config/log_level", b"fatal"), b"5")
    assert_json(h.put("/config/log_level", b"info"), b"2")


def test_config_put_body_limit_is_max_msg_size(make_nsqd):
    nsqd = make_nsqd(max_msg_size=10)
    h = HTTP(nsqd)
    assert_error(h.put("/config/log_level", b"x" * 11), 413, "INVALID_VALUE")
    assert_error(h.put("/config/nsqlookupd_tcp_addresses", b'["1234:56"]'), 413, "INVALID_VALUE")
    assert_json(h.put("/config/nsqlookupd_tcp_addresses", b'["1:3456"]'), b'["1:3456"]')  # 10 bytes
    # The size check comes before the option name.
    assert_error(h.put("/config/nosuch", b""), 413, "INVALID_VALUE")
    assert_error(h.put("/config/nosuch", b"x" * 11), 413, "INVALID_VALUE")


def test_config_put_nsqlookupd_tcp_addresses(nsqd, h):
    assert_json(
        h.put("/config/nsqlookupd_tcp_addresses", b'["127.0.0.1:4160", "10.0.0.1:4160"]'),
        b'["127.0.0.1:4160","10.0.0.1:4160"]',
    )
    assert_json(h.get("/config/nsqlookupd_tcp_addresses"), b'["127.0.0.1:4160","10.0.0.1:4160"]')
    for bad in (b"[1]", b'"127.0.0.1:4160"', b"{}", b"[", b"127.0.0.1:4160", b'["a", 2]', b"[[]]"):
        assert_error(h.put("/config/nsqlookupd_tcp_addresses", bad), 400, "INVALID_VALUE")
    assert_json(h.get("/config/nsqlookupd_tcp_addresses"), b'["127.0.0.1:4160","10.0.0.1:4160"]')
    assert_json(h.put("/config/nsqlookupd_tcp_addresses", b"[]"), b"[]")


@pytest.mark.parametrize("name", ["mem_queue_size", "msg_timeout", "statsd_prefix", "nosuch", "node_id"])
def test_config_put_other_options_is_invalid_option(h, name):
    assert_error(h.put("/config/" + name, b"5"), 400, "INVALID_OPTION")
