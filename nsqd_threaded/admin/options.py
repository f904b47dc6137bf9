"""nsqadmin's settings: one table of :class:`~nsqd_threaded.settings.options.Setting` entries,
and :class:`AdminOptions` built from it, as nsqlookupd's are.

Flag names, defaults and config-file keys are Go nsqadmin 1.3's, plus
``--inside-view-bodies`` and ``--chart-sample-interval`` (ours).  Graphite and
statsd key formats are not built: those flags are refused unless they ask for
nothing (``--graphite-url`` included; nsqadmin samples the nodes itself and
draws its own charts instead, see :mod:`.sampler`).
"""

import ipaddress


from ..internal.gocompat import is_socket_path
from ..settings.options import (
    BOOL,
    COMMAND_SETTINGS,
    DURATION,
    OptionError,
    STR,
    STR_LIST,
    UNSUPPORTED as U,
    Setting,
    check_settings,
    daemon_settings,
    options_class,
)


def _positive(flag, value):
    if value <= 0:
        return "must be positive"
    return None


def _not_negative(flag, value):
    if value < 0:
        return "must not be negative"
    return None


def _cidr(flag, value):
    if not value:
        return None  # no restriction, as in Go
    if "/" not in value:
        return "failed to parse %s (%s) - invalid CIDR address" % (flag, value)
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError as e:
        return "failed to parse %s (%s) - %s" % (flag, value, e)
    return None


def _tcp_only(flag, value):
    # Go's nsqadmin listens with net.Listen("tcp", ...): a socket path is an error there too.
    if is_socket_path(value):
        return "%s=%s: invalid address (want host:port; nsqadmin listens on TCP only, as Go's)" % (flag, value)
    return None


def _base_path(flag, value):
    if not value.startswith("/"):
        return "must start with /"
    return None


# Table order is AdminOptions' field order.
SETTINGS = (
    Setting("http-address", STR, "0.0.0.0:4171", "<addr>:<port> to listen on for HTTP clients", check=_tcp_only),
    Setting("base-path", STR, "/", "URL base path", check=_base_path),
    Setting("lookupd-http-address", STR_LIST, (), "lookupd HTTP address (may be given multiple times)",
            field="lookupd_http_addresses", cfg="nsqlookupd_http_addresses"),
    Setting("nsqd-http-address", STR_LIST, (), "nsqd HTTP address (may be given multiple times)",
            field="nsqd_http_addresses"),
    Setting("http-client-connect-timeout", DURATION, 2.0, "timeout for HTTP connect", check=_positive),
    Setting("http-client-request-timeout", DURATION, 5.0, "timeout for HTTP request", check=_positive),
    Setting("admin-user", STR_LIST, (), "admin user (may be given multiple times; if specified, only these "
            "users will be able to perform privileged actions; acl-http-header is used to determine the "
            "authenticated user)", field="admin_users"),
    Setting("acl-http-header", STR, "X-Forwarded-User", "HTTP header to check for authenticated admin users"),
    Setting("notification-http-endpoint", STR, "", "HTTP endpoint (fully qualified) to which POST "
            "notifications of admin actions will be sent"),
    Setting("allow-config-from-cidr", STR, "127.0.0.1/8", "A CIDR from which to allow HTTP requests to the "
            "/config endpoint", check=_cidr),
    Setting("inside-view-bodies", BOOL, False, "(not in Go nsqadmin) ask brokers for message bodies "
            "(nsqd --debug-state-bodies) in the inside view, for admin users only (requires --admin-user)"),
    Setting("chart-sample-interval", DURATION, 2.0, "(not in Go nsqadmin) how often nsqadmin asks every node's "
            "/stats for the topic and channel charts it keeps (0 to keep none: no charts)", check=_not_negative),
    *daemon_settings("nsqadmin"),
    Setting("graphite-url", STR, "", "graphite HTTP address (graphs are drawn from polled /stats instead)", U),
    Setting("proxy-graphite", BOOL, False, "proxy HTTP requests to graphite", U),
    Setting("statsd-counter-format", STR, "", "The counter stats key formatting applied by the implementation "
            "of statsd (only used with graphite)", U, go_default="stats.counters.%s.count"),
    Setting("statsd-gauge-format", STR, "", "The gauge stats key formatting applied by the implementation of "
            "statsd (only used with graphite)", U, go_default="stats.gauges.%s"),
    Setting("statsd-prefix", STR, "", "prefix used for keys sent to statsd (only used with graphite)", U,
            go_default="nsq.%s"),
    Setting("statsd-interval", DURATION, 0.0, "time interval nsqd is configured to push to statsd (only used "
            "with graphite)", U, go_default=60.0),
    Setting("http-client-tls-cert", STR, "", "path to certificate file for the HTTP client"),
    Setting("http-client-tls-key", STR, "", "path to key file for the HTTP client"),
    Setting("http-client-tls-root-ca-file", STR, "", "path to CA file for the HTTP client"),
    Setting("http-client-tls-insecure-skip-verify", BOOL, False, "configure the HTTP client to skip "
            "verification of TLS certificates"),
    Setting("dev-static-dir", STR, "", "(development use only)", U),
    *COMMAND_SETTINGS,
)


@options_class(SETTINGS)
class AdminOptions:
    """nsqadmin's options (flag ``--http-address`` is field ``http_address``)."""

    def validate(self):
        """Raise OptionError (a ValueError) naming the flag for an unusable value; returns self."""
        check_settings(self, SETTINGS)
        if self.lookupd_http_addresses and self.nsqd_http_addresses:
            raise OptionError("use --nsqd-http-address or --lookupd-http-address not both")
        if not self.lookupd_http_addresses and not self.nsqd_http_addresses:
            raise OptionError("--nsqd-http-address or --lookupd-http-address required")
        if self.http_client_tls_cert and not self.http_client_tls_key:
            raise OptionError("--http-client-tls-key must be specified with --http-client-tls-cert")
        if self.http_client_tls_key and not self.http_client_tls_cert:
            raise OptionError("--http-client-tls-cert must be specified with --http-client-tls-key")
        if self.inside_view_bodies and not self.admin_users:
            raise OptionError("--inside-view-bodies requires --admin-user (bodies are for admins only)")
        return self
