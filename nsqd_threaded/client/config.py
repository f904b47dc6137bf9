"""go-nsq's ``Config`` option names for the client: what ``--consumer-opt``/``--producer-opt`` set.

A :class:`ClientConfig` holds go-nsq's options under go-nsq's names, with its
defaults (``max_in_flight`` 1, ``max_attempts`` 5, ``backoff_multiplier`` 1s,
``max_backoff_duration`` 2m, ``default_requeue_delay`` 90s ...), and
:meth:`ClientConfig.set` takes a value as go-nsq's ``Config.Set`` does from
a flag: ``-`` in a name is ``_``, booleans in Go's syntax (a name alone means
true, as ``ConfigFlag`` does), durations in Go's syntax or as integer
milliseconds.  :meth:`~ClientConfig.consumer_kwargs` and
:meth:`~ClientConfig.producer_kwargs` turn it into keywords of
:class:`~nsqd_threaded.client.Consumer` and :class:`~nsqd_threaded.client.Producer`
(IDENTIFY fields in the protocol's milliseconds, TLS as an ``ssl.SSLContext``).

Options that only tune go-nsq's own machinery (``read_timeout``,
``write_timeout``, ``lookupd_poll_jitter``, ``low_rdy_timeout``,
``skip_lookupd_authorization``) are accepted and have no effect here;
``local_addr`` and ``tls_config`` (a Go value) are refused.
"""

import ssl

from ..internal.gocompat import parse_duration, parse_go_bool, parse_go_int


class ClientConfigError(ValueError):
    """An unknown option or an unusable value (the message names the option, as go-nsq's does)."""


def _duration(text):
    """go-nsq's coerceDuration from flag text: a Go duration (``"250ms"``) or integer milliseconds."""
    try:
        return parse_go_int(text) / 1000.0
    except ValueError:
        return parse_duration(text)


def _bool(text):
    if isinstance(text, bool):
        return text
    return parse_go_bool(text)


def _int(text):
    return parse_go_int(text) if isinstance(text, str) else int(text)


def _strategy(text):
    if text not in ("", "exponential", "full_jitter"):
        raise ValueError("invalid backoff strategy %r (exponential, full_jitter)" % text)
    return text or "exponential"


# name -> (parse, default, (min, max) or None); names, defaults and bounds are go-nsq's Config.
OPTIONS = {
    "dial_timeout": (_duration, 1.0, None),
    "read_timeout": (_duration, 60.0, (0.1, 300.0)),
    "write_timeout": (_duration, 1.0, (0.1, 300.0)),
    "lookupd_poll_interval": (_duration, 60.0, (0.01, 300.0)),
    "lookupd_poll_jitter": (float, 0.3, (0.0, 1.0)),
    "lookupd_poll_timeout": (_duration, 60.0, None),
    "max_requeue_delay": (_duration, 900.0, (0.0, 3600.0)),
    "default_requeue_delay": (_duration, 90.0, (0.0, 3600.0)),
    "backoff_strategy": (_strategy, "exponential", None),
    "max_backoff_duration": (_duration, 120.0, (0.0, 3600.0)),
    "backoff_multiplier": (_duration, 1.0, (0.0, 3600.0)),
    "max_attempts": (_int, 5, (0, 65535)),
    "low_rdy_idle_timeout": (_duration, 10.0, (1.0, 300.0)),
    "low_rdy_timeout": (_duration, 30.0, (1.0, 300.0)),
    "rdy_redistribute_interval": (_duration, 5.0, (0.001, 5.0)),
    "client_id": (str, "", None),
    "hostname": (str, "", None),
    "user_agent": (str, "", None),
    "heartbeat_interval": (_duration, 30.0, None),
    "sample_rate": (_int, 0, (0, 99)),
    "tls_v1": (_bool, False, None),
    "tls_root_ca_file": (str, "", None),
    "tls_insecure_skip_verify": (_bool, False, None),
    "tls_cert": (str, "", None),
    "tls_key": (str, "", None),
    "tls_min_version": (str, "", None),
    "deflate": (_bool, False, None),
    "deflate_level": (_int, 6, (1, 9)),
    "snappy": (_bool, False, None),
    "output_buffer_size": (_int, 16384, None),
    "output_buffer_timeout": (_duration, 0.25, None),
    "max_in_flight": (_int, 1, (0, None)),
    "msg_timeout": (_duration, 0.0, (0.0, None)),
    "auth_secret": (str, "", None),
    "skip_lookupd_authorization": (_bool, True, None),
}

_REFUSED = {"local_addr": "binding a local address is not supported",
            "tls_config": "a Go tls.Config cannot be given on a command line"}

_TLS_VERSIONS = {"ssl3.0": ssl.TLSVersion.TLSv1, "tls1.0": ssl.TLSVersion.TLSv1,
                 "tls1.1": ssl.TLSVersion.TLSv1_1, "tls1.2": ssl.TLSVersion.TLSv1_2,
                 "tls1.3": ssl.TLSVersion.TLSv1_3}


def _ms(seconds):
    return int(round(seconds * 1000))


class ClientConfig:
    """go-nsq's options by name (``config.values["max_in_flight"]``), go-nsq's defaults until set."""

    def __init__(self, **values):
        self.values = {name: spec[1] for name, spec in OPTIONS.items()}
        self.given = set()  # the names set explicitly (IDENTIFY carries only those and the defaults nsqd needs)
        for name, value in values.items():
            self.set(name, value)

    def set(self, name, value=True):
        """Set one option as go-nsq's ``Config.Set`` does (text values parsed; ``-`` read as ``_``)."""
        name = name.replace("-", "_")
        if name in _REFUSED:
            raise ClientConfigError("option %s: %s" % (name, _REFUSED[name]))
        spec = OPTIONS.get(name)
        if spec is None:
            raise ClientConfigError("invalid option %s" % name)
        parse, _, bounds = spec
        try:
            parsed = parse(value) if isinstance(value, str) or parse is _bool else value
        except ValueError as e:
            raise ClientConfigError("failed to set option %s - %s" % (name, e)) from None
        if bounds is not None and not isinstance(parsed, str):
            low, high = bounds
            if parsed < low or (high is not None and parsed > high):
                raise ClientConfigError("invalid %s ! %r (min %r, max %r)" % (name, value, low, high))
        if name == "tls_min_version" and parsed and parsed not in _TLS_VERSIONS:
            raise ClientConfigError("unknown tls_min_version %s" % parsed)
        self.values[name] = parsed
        self.given.add(name)
        return self

    def set_flag(self, text):
        """One ``--consumer-opt``/``--producer-opt`` value: ``name,value``, or ``name`` alone for true."""
        name, comma, value = text.partition(",")
        return self.set(name, value) if comma else self.set(name, True)

    def __getitem__(self, name):
        return self.values[name]

    # -- what the client's classes take ------------------------------------------------

    def tls_context(self):
        """The SSLContext ``tls_v1`` asks for (go-nsq's tls_* options), or False without TLS."""
        v = self.values
        if not v["tls_v1"]:
            return False
        context = ssl.create_default_context(cafile=v["tls_root_ca_file"] or None)
        if v["tls_cert"] or v["tls_key"]:
            if not (v["tls_cert"] and v["tls_key"]):
                raise ClientConfigError("tls_cert and tls_key must be given together")
            context.load_cert_chain(v["tls_cert"], v["tls_key"])
        if v["tls_insecure_skip_verify"]:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if v["tls_min_version"]:
            context.minimum_version = _TLS_VERSIONS[v["tls_min_version"]]
        return context

    def identify(self):
        """The IDENTIFY fields these options ask for, in the protocol's units (ms)."""
        v = self.values
        fields = {
            "heartbeat_interval": _ms(v["heartbeat_interval"]),
            "output_buffer_size": v["output_buffer_size"],
            "output_buffer_timeout": _ms(v["output_buffer_timeout"]),
            "sample_rate": v["sample_rate"],
        }
        if v["msg_timeout"]:
            fields["msg_timeout"] = _ms(v["msg_timeout"])
        for name in ("client_id", "hostname", "user_agent"):
            if v[name]:
                fields[name] = v[name]
        return fields

    def _common(self):
        v = self.values
        return {
            # go-nsq's dial_timeout bounds connecting only; the client's timeout also bounds the
            # handshake's answers and a close, so go-nsq's 1s default would be too short for those.
            "timeout": v["dial_timeout"] if "dial_timeout" in self.given and v["dial_timeout"] > 0 else 10.0,
            "identify": self.identify(),
            "lookupd_poll_interval": v["lookupd_poll_interval"],
            "auth_secret": v["auth_secret"] or None,
            "tls_v1": self.tls_context(),
            "snappy": v["snappy"],
            "deflate": v["deflate"],
            "deflate_level": v["deflate_level"] if v["deflate"] else None,
        }

    def producer_kwargs(self):
        """Keywords for :class:`~nsqd_threaded.client.Producer`."""
        return self._common()

    def consumer_kwargs(self):
        """Keywords for :class:`~nsqd_threaded.client.Consumer` (max_in_flight at least 1)."""
        v = self.values
        kwargs = self._common()
        kwargs.update(
            max_in_flight=max(1, v["max_in_flight"]),
            max_attempts=v["max_attempts"],
            requeue_delay_ms=-1,
            default_requeue_delay=v["default_requeue_delay"],
            max_requeue_delay=v["max_requeue_delay"],
            backoff_multiplier=v["backoff_multiplier"],
            max_backoff_duration=v["max_backoff_duration"],
            backoff_strategy=v["backoff_strategy"],
            rdy_redistribute_interval=v["rdy_redistribute_interval"],
            low_rdy_idle_timeout=v["low_rdy_idle_timeout"],
        )
        return kwargs
