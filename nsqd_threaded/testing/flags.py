"""nsqd flags and Options fields for a test's broker: parsed as the command parses them."""

from ..settings.options import BY_FIELD, DURATION, STR_LIST
from ..internal.gocompat import parse_duration

__all__ = ["resolve_options", "values_to_flags"]


def resolve_options(flags=(), options=None):
    """The Options fields set by nsqd ``flags`` and then by the ``options`` mapping (which wins).

    Only what was given is returned (a dict), so callers can supply their own
    defaults.  ``flags`` are parsed and resolved exactly as the ``nsqd-threaded``
    command does it (``--config`` files included).  Raises ValueError for a bad
    flag or value, an unknown option name, or a feature that is not built yet;
    the values themselves are checked later by :meth:`Options.validate`.
    """
    return resolve_with_warnings(flags, options).values


def resolve_with_warnings(flags, options):
    """:func:`resolve_options`, with the warnings (deprecated flags, unknown config keys) kept."""
    from ..settings import config

    values, warnings = {}, []
    if flags:
        values, warnings = config.resolve(*_parse_flags(list(flags)))
    for name, value in (options or {}).items():
        setting = BY_FIELD.get(name)
        if setting is None:
            raise ValueError("unknown nsqd option %r (see nsqd_threaded.settings.options.Options)" % name)
        if setting.kind is DURATION and isinstance(value, str):
            value = parse_duration(value)
        values[name] = value
    return config.Resolved(values, warnings)


def _parse_flags(flags):
    """``(flags, config_file)`` for :func:`config.resolve`, with the command's own parser; ValueError if bad."""
    from .. import cli

    click = cli.click  # the click that built the command (not a re-imported copy)

    if any(not isinstance(f, str) for f in flags):
        raise ValueError("nsqd flags must be strings, got %r" % (flags,))
    try:
        given, params = cli.parse(flags)
    except click.exceptions.Exit:
        raise ValueError("nsqd flags %r ask for help, not for a broker" % (flags,)) from None
    except click.ClickException as e:
        raise ValueError("bad nsqd flags %r: %s" % (flags, e.format_message())) from None
    if params.get("version"):
        raise ValueError("--version does not start a broker")
    return given, params.get("config")


def values_to_flags(values):
    """Options fields -> ``--flag=value`` strings for a child process."""
    flags = []
    for name, value in values.items():
        setting = BY_FIELD.get(name)
        if setting is None or setting.flag is None:
            raise ValueError("option %r has no nsqd flag, so a child process cannot be given it" % name)
        if setting.kind is STR_LIST:  # one flag per item: an item may contain a comma
            flags.extend("--%s=%s" % (setting.flag, v) for v in value)
        else:
            flags.append("--%s=%s" % (setting.flag, setting.kind.format(value)))
    return flags
