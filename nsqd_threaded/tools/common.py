"""What the tools share: their common flags and turning ``--consumer-opt``/``--producer-opt`` into a client."""

from ..client.config import ClientConfig, ClientConfigError
from ..internal.logger import Logger
from ..settings.options import BOOL, META, STR, STR_LIST, VERSION, OptionError, Setting
from ..wire.protocol_v2 import is_valid_name

VERSION_SETTING = Setting("version", BOOL, False, "print version string", META)
# Not in Go's tools: every command of this package takes a TOML config file (keys are the fields).
CONFIG_SETTING = Setting("config", STR, "", "(not in Go's tools) path to a TOML config file; flags win", META)


def nsqd_tcp(help_text="nsqd TCP address (may be given multiple times)"):
    return Setting("nsqd-tcp-address", STR_LIST, (), help_text, field="nsqd_tcp_addresses")


def lookupd_http():
    return Setting("lookupd-http-address", STR_LIST, (), "lookupd HTTP address (may be given multiple times)",
                   field="lookupd_http_addresses")


def consumer_opt():
    return Setting("consumer-opt", STR_LIST, (), "option to passthrough to nsq.Consumer (may be given multiple "
                   "times, http://godoc.org/github.com/nsqio/go-nsq#Config)", field="consumer_opts")


def producer_opt():
    return Setting("producer-opt", STR_LIST, (), "option to passthrough to nsq.Producer (may be given multiple "
                   "times, http://godoc.org/github.com/nsqio/go-nsq#Config)", field="producer_opts")


def client_config(opts, flag):
    """``--consumer-opt``/``--producer-opt`` values -> a ClientConfig; OptionError naming the flag."""
    config = ClientConfig()
    for text in opts:
        try:
            config.set_flag(text)
        except ClientConfigError as e:
            raise OptionError("invalid value %r for flag --%s: %s" % (text, flag, e)) from None
    return config


def user_agent(tool):
    """Go's ``<tool>/<version> go-nsq/<version>``, with this package's client."""
    return "%s/%s nsqd_threaded.client/%s" % (tool, VERSION, VERSION)


def tool_logger(options, tool):
    """The tool's logger: its --log-prefix/--log-level where it has them (nsq_to_file), else ``[tool] ``."""
    return Logger(prefix=getattr(options, "log_prefix", "[%s] " % tool), level=getattr(options, "log_level", "info"))


def one_of_nsqd_or_lookupd(nsqd, lookupd, nsqd_flag="--nsqd-tcp-address"):
    """Go's tools' check: exactly one way to find nsqd."""
    if not nsqd and not lookupd:
        raise OptionError("%s or --lookupd-http-address required" % nsqd_flag)
    if nsqd and lookupd:
        raise OptionError("use %s or --lookupd-http-address not both" % nsqd_flag)


def valid_names(topics, channel):
    """go-nsq's NewConsumer check, made before anything connects: nsqd would refuse the SUB
    (``E_BAD_TOPIC``), and a consumer over lookupd would wait for a topic that can never exist."""
    if not all(is_valid_name(topic) for topic in topics):
        raise OptionError("invalid topic name")
    if channel and not is_valid_name(channel):
        raise OptionError("invalid channel name")


def no_scheme(addresses, flag):
    """Go's checkAddrs: an HTTP address is host:port, not a URL."""
    for address in addresses:
        if address.lower().startswith("http"):
            raise OptionError("%s error - address should not contain scheme" % flag)
