"""The nsqlookupd-threaded command: flags, config file, and the real process lifetime."""

import configparser
import http.client
import os
import re
import signal
import socket
import struct
import sys

import pytest
from click.testing import CliRunner

from nsqd_threaded.lookupd import cli
from nsqd_threaded.lookupd.nsqlookupd import LookupdOptions

from support.proc import REPO_ROOT, CommandProcess

pytestmark = pytest.mark.timeout(60)



def resolved(*args):
    ctx = cli.main.make_context("nsqlookupd-threaded", list(args))
    return cli.resolve(ctx.params)


def options_for(*args):
    return resolved(*args)[0]


def invoke(*args):
    return CliRunner().invoke(cli.main, list(args))


def write_config(tmp_path, text):
    path = tmp_path / "nsqlookupd.cfg"
    path.write_text(text)
    return str(path)


# -- flags and config --------------------------------------------------------------------


def test_go_style_args():
    assert cli.go_style_args(["-tcp-address=1:2", "-tombstone-lifetime", "5s", "-version", "--verbose=false"]) == [
        "--tcp-address=1:2", "--tombstone-lifetime", "5s", "--version=true", "--verbose=false"]
    assert cli.go_style_args(["--log-prefix", "-x", "--", "-version"]) == ["--log-prefix", "-x", "--", "-version"]
    assert cli.go_style_args(["-h"]) == ["--help"]
    assert cli.go_style_args(["-nope"]) == ["-nope"]


def test_defaults_are_nsqlookupds():
    assert options_for() == LookupdOptions()
    opts = options_for()
    assert (opts.tcp_address, opts.http_address) == ("0.0.0.0:4160", "0.0.0.0:4161")
    assert opts.broadcast_address == socket.gethostname()
    assert (opts.inactive_producer_timeout, opts.tombstone_lifetime) == (300.0, 45.0)
    assert (opts.log_level, opts.log_prefix) == ("info", "[nsqlookupd] ")


def test_flags():
    opts = options_for("-tcp-address=127.0.0.1:1", "--http-address", "127.0.0.1:2", "-broadcast-address", "b",
                       "--inactive-producer-timeout=1m30s", "-tombstone-lifetime=250ms", "-log-level=WARN",
                       "--log-prefix", "-p- ", "-verbose")
    assert opts == LookupdOptions("127.0.0.1:1", "127.0.0.1:2", "b", 90.0, 0.25, "warn", "-p- ")


@pytest.mark.parametrize("args", [["--tombstone-lifetime=5"], ["--inactive-producer-timeout=x"],
                                  ["--log-level=loud"], ["--no-such-flag"], ["--verbose=maybe"]])
def test_bad_flags_exit_2(args):
    result = invoke(*args)
    assert result.exit_code == 2, result.output


def test_version():
    for flag in ("--version", "-version"):
        result = invoke(flag)
        assert result.exit_code == 0
        assert re.fullmatch(r"nsqlookupd v1\.3\.0 \(built w/[a-z]+\d+\.\d+\.\d+\)\n", result.output), result.output


def test_help_lists_the_flags():
    result = invoke("-h")
    assert result.exit_code == 0
    for flag in ("--tcp-address", "--http-address", "--broadcast-address", "--inactive-producer-timeout",
                 "--tombstone-lifetime", "--log-level", "--log-prefix", "--config", "--version",
                 "--http-read-timeout", "--http-idle-timeout"):
        assert flag in result.output


def test_config_file_then_flags(tmp_path):
    path = write_config(tmp_path, "\n".join([
        "tcp_address = '127.0.0.1:1'",
        "http_address = '127.0.0.1:2'",
        "broadcast_address = 'cfg'",
        "inactive_producer_timeout = '10s'",
        "tombstone_lifetime = 1500",  # integer milliseconds, as go-options reads them
        "log_level = 'DEBUG'",
        "unknown_key = 1",
    ]))
    assert options_for("--config", path) == LookupdOptions("127.0.0.1:1", "127.0.0.1:2", "cfg", 10.0, 1.5, "debug")
    assert resolved("--config", path)[1] == ["config file %s: unknown key unknown_key ignored" % path]
    opts = options_for("--config=" + path, "--tcp-address=127.0.0.1:3", "--tombstone-lifetime=2s")
    assert (opts.tcp_address, opts.tombstone_lifetime, opts.broadcast_address) == ("127.0.0.1:3", 2.0, "cfg")


def test_http_deadlines_flags_and_config(tmp_path):
    assert (options_for().http_read_timeout, options_for().http_idle_timeout) == (30.0, 60.0)  # the broker's
    opts = options_for("-http-read-timeout=300ms", "--http-idle-timeout", "2m")
    assert (opts.http_read_timeout, opts.http_idle_timeout) == (0.3, 120.0)
    path = write_config(tmp_path, 'http_read_timeout = "1.5s"\nhttp_idle_timeout = 2500\n')
    opts = options_for("--config", path)
    assert (opts.http_read_timeout, opts.http_idle_timeout) == (1.5, 2.5)
    result = invoke("--http-read-timeout=0")
    assert result.exit_code == 1 and "FATAL: failed to instantiate nsqlookupd - --http-read-timeout must be > 0" in (
        result.output)


def test_config_warnings_as_nsqd_gives_them(tmp_path):
    path = write_config(tmp_path, "tombstone_lifetim = '5s'\ntcp-address = '127.0.0.1:1'\nmax_msg_size = 5\n")
    opts, warnings = resolved("--config", path)
    assert opts.tombstone_lifetime == 45.0
    assert warnings == [
        "config file %s: unknown key tombstone_lifetim ignored (did you mean tombstone_lifetime?)" % path,
        "config file %s: unknown key tcp-address ignored (did you mean tcp_address?)" % path,
        "config file %s: unknown key max_msg_size ignored" % path,  # an nsqd key: not nsqlookupd's
    ]
    assert resolved("-verbose")[1] == ["--verbose is deprecated and has no effect, use --log-level"]


@pytest.mark.parametrize("text, message", [
    ("log_level = 'loud'", "FATAL: failed to load config file %s - log_level: invalid log level \"loud\""),
    ("tombstone_lifetime = 'soon'", "FATAL: failed to load config file %s - tombstone_lifetime: "),
    ("tcp_address = 1", "FATAL: failed to load config file %s - tcp_address: "),
    ("tcp_address = ", "FATAL: failed to load config file %s - "),
])
def test_bad_config_is_fatal(tmp_path, text, message):
    path = write_config(tmp_path, text)
    result = invoke("--config=" + path)
    assert result.exit_code == 1, result.output
    assert (message % path if "%s" in message else message) in result.output
    assert result.output.startswith("[nsqlookupd] ") and result.output.count("\n") == 1


def test_missing_config_is_fatal(tmp_path):
    result = invoke("--config=" + str(tmp_path / "missing.cfg"))
    assert result.exit_code == 1 and "FATAL: failed to load config file" in result.output


def test_console_script_is_declared():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(REPO_ROOT, "setup.cfg"))
    scripts = cfg["options.entry_points"]["console_scripts"]
    assert "nsqlookupd-threaded = nsqd_threaded.lookupd.cli:main" in scripts


# -- the real process --------------------------------------------------------------------


class LookupdProcess(CommandProcess):
    """The command in a child process, its stderr lines collected by a reader thread."""

    def ports(self):
        """(tcp, http): read from the startup log, which names HTTP first."""
        http_port = int(self.wait_for(r"HTTP: listening on 127\.0\.0\.1:(\d+)").group(1))
        tcp_port = int(self.wait_for(r"TCP: listening on 127\.0\.0\.1:(\d+)").group(1))
        return tcp_port, http_port


@pytest.fixture
def spawn():
    started = []

    def start(*args, argv=None):
        proc = LookupdProcess((argv or [sys.executable, "-m", "nsqd_threaded.lookupd"]) + list(args))
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


LOCAL = ("-tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "-broadcast-address=127.0.0.1")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_the_daemon(spawn, signum):
    lookupd = spawn(*LOCAL)
    tcp_port, http_port = lookupd.ports()
    conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
    conn.request("GET", "/ping")
    assert conn.getresponse().read() == b"OK"
    peer = socket.create_connection(("127.0.0.1", tcp_port), timeout=10)
    with peer:
        peer.sendall(b"  V1PING\n")
        assert peer.recv(6) == b"\x00\x00\x00\x02OK"
        lookupd.proc.send_signal(signum)
        assert lookupd.proc.wait(timeout=15) == 0, lookupd.log
        assert peer.recv(1) == b""  # closed on the way out
    conn.close()
    lookupd.wait_for(r"INFO: %s: shutting down" % signal.Signals(signum).name)


def test_identify_answers_with_the_real_ports(spawn):
    lookupd = spawn(*LOCAL)
    tcp_port, http_port = lookupd.ports()
    with socket.create_connection(("127.0.0.1", tcp_port), timeout=10) as peer:
        body = b'{"broadcast_address":"127.0.0.1","tcp_port":1,"http_port":2,"version":"1.3.0"}'
        peer.sendall(b"  V1IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            chunk = peer.recv(4096)
            assert chunk, data
            data += chunk
        assert b'"http_port":%d,"tcp_port":%d' % (http_port, tcp_port) in data
    lookupd.proc.send_signal(signal.SIGTERM)
    assert lookupd.proc.wait(timeout=15) == 0


def test_listen_failure_is_one_fatal_line(spawn):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        address = "127.0.0.1:%d" % taken.getsockname()[1]
        lookupd = spawn("--tcp-address=" + address, "--http-address=127.0.0.1:0")
        assert lookupd.proc.wait(timeout=15) == 1
        match = lookupd.wait_for(r"FATAL: (.*)")
        assert match.group(1).startswith(
            "failed to instantiate nsqlookupd - --tcp-address: listen (%s) failed - " % address)


def test_installed_console_script(spawn):
    script = os.path.join(os.path.dirname(sys.executable), "nsqlookupd-threaded")
    if not os.path.exists(script):
        pytest.skip("the package is not installed with its console scripts")
    lookupd = spawn(*LOCAL, argv=[script])
    lookupd.ports()
    lookupd.proc.send_signal(signal.SIGTERM)
    assert lookupd.proc.wait(timeout=15) == 0, lookupd.log


def test_config_warnings_are_logged_at_startup(spawn, tmp_path):
    path = write_config(tmp_path, "tombstone_lifetim = '5s'\n")
    lookupd = spawn(*LOCAL, "--config=" + path)
    lookupd.wait_for(r"WARNING: config file .*: unknown key tombstone_lifetim ignored \(did you mean tombstone_lifetime\?\)")
    lookupd.ports()
    lookupd.proc.send_signal(signal.SIGTERM)
    assert lookupd.proc.wait(timeout=15) == 0, lookupd.log
