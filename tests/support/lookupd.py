"""Helpers of the nsqlookupd tests: its HTTP API."""

import http.client
import json


def request(lookupd, method, path, headers=None, body=None):
    conn = http.client.HTTPConnection(*lookupd.http_address, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_json(lookupd, path):
    status, headers, body = request(lookupd, "GET", path)
    assert status == 200, body
    return json.loads(body)
