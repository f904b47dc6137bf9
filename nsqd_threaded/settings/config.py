"""The ``--config`` TOML file, and :func:`resolve`: flags > config file > defaults.

The command line (:mod:`nsqd_threaded.cli`) and the test brokers
(:mod:`nsqd_threaded.testing`) both parse flags with the command's parser and
then call :func:`resolve`, so a setting means the same thing everywhere.
Config values are coerced as nsqd's option resolver does: durations are Go
duration strings or integer milliseconds, lists are TOML arrays or
comma-separated strings.  Keys no setting uses are ignored, as in nsqd, but
with a warning naming them.
"""

import difflib
import sys
from typing import NamedTuple

from .options import DEPRECATED, SETTINGS, SUPPORTED, UNSUPPORTED

# Kept importable from here: the table used to live in this module.
__all__ = ["ConfigError", "NotSupportedError", "Resolved", "SETTINGS", "coerce", "load", "loads",
           "read", "resolve"]


class ConfigError(ValueError):
    """The config file cannot be used (unreadable, bad syntax, or a value of the wrong type)."""


class NotSupportedError(ValueError):
    """A flag or config key asks for a feature that is not built yet."""

    def __init__(self, setting, source=None):
        message = "%s is not supported yet" % setting.option
        if source:
            message += " (%s)" % source
        super().__init__(message)
        self.setting = setting


class Resolved(NamedTuple):
    """What :func:`resolve` found: ``values`` (Options fields that were set) and ``warnings``."""

    values: dict
    warnings: list


_DEPRECATION = {
    "verbose": "--verbose is deprecated and has no effect, use --log-level",
    "worker-id": "--worker-id is deprecated and has no effect, use --node-id",
}


def resolve(flags, config_file=None, settings=SETTINGS):
    """Resolve parsed flags and a config file into the Options fields they set.

    ``settings`` is the daemon's table (nsqd's by default).
    ``flags`` maps each :class:`~nsqd_threaded.settings.options.Setting` given on the
    command line to its parsed value (a list for repeatable flags).
    ``config_file`` is a path or None.  Flags win over the file; fields that
    neither sets are left out, for :class:`~nsqd_threaded.settings.options.Options`
    (or the caller) to default.  Raises ConfigError for an unusable file and
    NotSupportedError for a value that asks for a feature not built yet.
    """
    values = {}
    warnings = []
    if config_file:
        from_file, file_warnings = read(config_file, settings)
        values.update(from_file)
        warnings.extend(file_warnings)
    for setting, value in flags.items():
        if setting.status == UNSUPPORTED:
            if not setting.asks_for_nothing(value):
                raise NotSupportedError(setting)
            continue  # accepted, and nothing to do
        elif setting.status == DEPRECATED:
            warnings.append(_DEPRECATION[setting.flag])
            continue
        elif setting.status != SUPPORTED:
            continue  # --config, --version
        values[setting.field] = list(value) if setting.multiple else value
    return Resolved(values, warnings)


def read(path, settings=SETTINGS):
    """A config file's settings: ``({field: value}, warnings)``.

    Values of unbuilt features are accepted when they ask for nothing (see
    :meth:`~nsqd_threaded.settings.options.Setting.asks_for_nothing`) or restate Go
    nsqd's default (config files copied from nsqd's example spell out every
    key; ``deflate = true`` then earns a warning, since we do not deflate).
    """
    try:
        doc = load(path)
    except (OSError, ValueError) as e:
        raise ConfigError("failed to load config file %s - %s" % (path, _one_line(e))) from None
    values = {}
    warnings = []
    known = {}
    for setting in settings:
        if setting.key is None:
            continue
        known[setting.key] = setting
        if setting.key not in doc:
            continue
        try:
            value = coerce(setting.kind, doc[setting.key])
        except ValueError as e:
            raise ConfigError("failed to load config file %s - %s: %s" % (path, setting.key, e)) from None
        if setting.status == UNSUPPORTED and not setting.asks_for_nothing(value):
            if value != setting.go_default:
                raise NotSupportedError(setting, "%s in %s" % (setting.key, path))
            warnings.append(
                "config file %s: %s = %s is not supported yet, so it has no effect (%s stays %s)"
                % (path, setting.key, setting.kind.format(value), setting.key, setting.kind.format(setting.default))
            )
            continue
        if setting.status == SUPPORTED:
            values[setting.field] = list(value) if setting.multiple else value
    for key in doc:
        if key not in known:
            warnings.append("config file %s: unknown key %s ignored%s" % (path, key, _suggestion(key, known, settings)))
    return values, warnings


def _suggestion(key, known, settings):
    """`` (did you mean X?)`` for a misspelled or flag-spelled key, else ``""``."""
    aliases = {s.flag.replace("-", "_"): s.key for s in settings if s.flag and s.key}
    match = aliases.get(key)
    if match is None:
        close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
        match = close[0] if close else None
    return " (did you mean %s?)" % match if match and match != key else ""


def _one_line(error):
    return " ".join(str(error).split())


def coerce(kind, value):
    """A config-file value -> the value the flag of ``kind`` would have produced."""
    return kind.coerce(value)


def load(path):
    """Read a TOML config file into a dict (OSError, or ValueError on bad syntax)."""
    with open(path, "rb") as f:
        data = f.read()
    return loads(data.decode("utf-8"))


def loads(text):
    """Parse TOML with :mod:`tomllib` where it exists (3.11+), else the fallback parser."""
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib.loads(text)
    from .toml_fallback import loads as fallback_loads

    return fallback_loads(text)
