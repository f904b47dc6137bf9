"""AUTH's HTTP exchange: asking the auth servers (the pure part is :mod:`nsqd_threaded.broker.auth`)."""

import random
import socket
import ssl
import time
import urllib.parse

from ..broker.auth import AuthError, auth_endpoint, auth_params, get_url, https_endpoint, parse_auth_response, post_body
from ..internal.gocompat import go_quote
from ..internal.httpclient import NSQ_V1_ACCEPT, ResponseTooLarge, request

# An answer larger than this is a failure (Go reads any size; a bound keeps a
# runaway server from filling memory before the request timeout).
MAX_RESPONSE_SIZE = 16 * 1024 * 1024


def query_any(opts, remote_ip, tls, secret, common_name="", log=None):
    """Ask the auth servers, starting at a random one and wrapping around; the first answer wins.

    Raises AuthError (the last failure) when none answers usably.
    """
    addresses = list(opts.auth_http_addresses)
    if not addresses:
        raise AuthError("no auth server")
    params = auth_params(remote_ip, tls, secret, common_name)
    start = random.randrange(len(addresses))
    error = None
    for i in range(len(addresses)):
        address = addresses[(start + i) % len(addresses)]
        try:
            return query_one(opts, address, params)
        except AuthError as e:
            error = e
        except Exception as e:  # any failure is the client's E_AUTH_FAILED, never the connection thread's end
            error = AuthError(_error_text(e))
        if log is not None:
            log.warn("failed auth against %s %s", address, error)
    raise error


def query_one(opts, address, params):
    """One auth server's answer as an AuthState (AuthError, or the OSError/HTTPException/ValueError of the exchange)."""
    endpoint = auth_endpoint(address)
    post = opts.auth_http_request_method == "post"
    url = endpoint if post else get_url(endpoint, params)
    body = post_body(params) if post else None
    # Go's http.Client: the request timeout bounds the whole exchange (0 = none).
    deadline = time.monotonic() + opts.http_client_request_timeout if opts.http_client_request_timeout else None
    status, data = _request(opts, "POST" if post else "GET", url, body, deadline)
    if status == 403 and not url.startswith("https"):
        url = https_endpoint(url, data)
        status, data = _request(opts, "POST" if post else "GET", url, body, deadline)
    if status != 200:
        raise AuthError("got response %d %s" % (status, go_quote(data[:256])))
    return parse_auth_response(data)


def _request(opts, method, url, body, deadline):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise AuthError("unsupported protocol scheme %s" % go_quote(parts.scheme))
    if not parts.hostname:
        raise AuthError("no host in the address")  # (not the URL: its query holds the secret)
    context = ssl.create_default_context(cafile=opts.tls_root_ca_file or None) if parts.scheme == "https" else None
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    headers = {"Accept": NSQ_V1_ACCEPT}
    if body is not None:
        headers["Content-Type"] = "application/json"
    try:
        status, _, data = request(method, parts.hostname, parts.port, path, body, headers,
                                  opts.http_client_connect_timeout or None, deadline, context, MAX_RESPONSE_SIZE)
    except ResponseTooLarge as e:
        raise AuthError(str(e)) from None
    return status, data


def _error_text(e):
    if isinstance(e, socket.timeout):
        return "i/o timeout"
    return str(e) or type(e).__name__
