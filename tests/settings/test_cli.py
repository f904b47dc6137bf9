"""The command line: flag syntax, resolution order, refusals, and the real process lifetime."""

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys

import pytest

from nsqd_threaded import cli
from nsqd_threaded.settings.options import DURATION, INT, SETTINGS, STR, STR_LIST, TLS_VERSION, UNSUPPORTED

from support.cli import invoke, options_for  # noqa: F401 (fixtures among them)
from support.proc import REPO_ROOT, CommandProcess


def write_config(tmp_path, text):
    path = tmp_path / "nsqd.cfg"
    path.write_text(text)
    return str(path)


# -- Go flag syntax -------------------------------------------------------------


def test_go_style_args_rewrites():
    assert cli.go_style_args(
        ["-tcp-address=1:2", "-msg-timeout", "5s", "--verbose", "-deflate=false", "--max-rdy-count", "7"]
    ) == ["--tcp-address=1:2", "--msg-timeout", "5s", "--verbose=true", "--deflate=false", "--max-rdy-count", "7"]
    # a flag's separate value is never rewritten, and nothing after "--" is
    assert cli.go_style_args(["--log-prefix", "-verbose", "--", "-verbose"]) == [
        "--log-prefix", "-verbose", "--", "-verbose"]
    assert cli.go_style_args(["-h"]) == ["--help"]
    assert cli.go_style_args(["-help"]) == ["--help"]
    assert cli.go_style_args(["-no-such-flag", "positional"]) == ["-no-such-flag", "positional"]
    assert cli.go_style_args(["--log-prefix"]) == ["--log-prefix"]


def test_defaults_are_nsqds():
    opts, warnings = options_for()
    assert warnings == []
    assert opts.tcp_address == "0.0.0.0:4150"
    assert opts.http_address == "0.0.0.0:4151"
    assert opts.msg_timeout == 60.0
    assert opts.max_msg_timeout == 900.0
    assert opts.max_req_timeout == 3600.0
    assert opts.output_buffer_timeout == 0.25
    assert opts.max_bytes_per_file == 104857600
    assert opts.data_path == ""  # nsqd then uses the current directory
    assert 0 <= opts.node_id < 1024


def test_flag_forms():
    opts, _ = options_for(
        "-tcp-address=127.0.0.1:0",
        "--http-address", "",
        "-msg-timeout", "1m30s",
        "--max-msg-timeout=1h",
        "-output-buffer-timeout=100ms",
        "--max-rdy-count=0x10",
        "-mem-queue-size=010",
        "--node-id", "5",
        "--log-level=DEBUG",
        "--log-prefix", "-x- ",
        "--data-path=/tmp/somewhere",
        "--max-bytes-per-file=1024",
        "--sync-every=10",
        "--sync-timeout=500ms",
        "--queue-scan-worker-pool-max=2",
        "--queue-scan-selection-count=5",
        "--max-channel-consumers=3",
        "--broadcast-address=example.org",
        "--broadcast-tcp-port=1",
        "--broadcast-http-port=2",
    )
    assert opts.tcp_address == "127.0.0.1:0"
    assert opts.http_address == ""
    assert opts.msg_timeout == 90.0
    assert opts.max_msg_timeout == 3600.0
    assert opts.output_buffer_timeout == 0.1
    assert opts.max_rdy_count == 16
    assert opts.mem_queue_size == 8
    assert opts.node_id == 5
    assert opts.log_level == "debug"
    assert opts.log_prefix == "-x- "
    assert opts.data_path == "/tmp/somewhere"
    assert (opts.max_bytes_per_file, opts.sync_every, opts.sync_timeout) == (1024, 10, 0.5)
    assert (opts.queue_scan_worker_pool_max, opts.queue_scan_selection_count) == (2, 5)
    assert opts.max_channel_consumers == 3
    assert (opts.broadcast_address, opts.broadcast_tcp_port, opts.broadcast_http_port) == ("example.org", 1, 2)


def test_last_flag_wins():
    opts, _ = options_for("--max-rdy-count=1", "--max-rdy-count=2")
    assert opts.max_rdy_count == 2


@pytest.mark.parametrize("args", [["--verbose"], ["-verbose=false"], ["--worker-id=1"]])
def test_deprecated_flags_are_accepted_with_a_warning(args):
    _, warnings = options_for(*args)
    assert len(warnings) == 1
    assert "deprecated" in warnings[0] and args[0].lstrip("-").split("=")[0] in warnings[0]


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--msg-timeout", "5"], "--msg-timeout"),
        (["-msg-timeout=soon"], "--msg-timeout"),
        (["--sync-timeout="], "--sync-timeout"),
        (["--max-rdy-count=ten"], "--max-rdy-count"),
        (["--node-id=1.5"], "--node-id"),
        (["--mem-queue-size=99999999999999999999"], "--mem-queue-size"),
        (["--log-level=loud"], "--log-level"),
        (["--verbose=maybe"], "--verbose"),
        (["--worker-id="], "--worker-id"),
    ],
)
def test_unparsable_flag_exits_2_naming_it(args, flag):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    error_lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error_lines) == 1 and flag in error_lines[0], result.output


@pytest.mark.parametrize("args", [["--no-such-flag=1"], ["-nosuch"], ["positional"], ["--verbose", "false"]])
def test_unknown_flags_and_arguments_exit_2(args):
    assert invoke(*args).exit_code == 2


@pytest.mark.parametrize(
    "args, reason",
    [
        (["--node-id=1024"], "--node-id must be [0,1024)"),
        (["--node-id=-1"], "--node-id must be [0,1024)"),
        (["--msg-timeout=0s"], "--msg-timeout must be > 0"),
        (["--msg-timeout=20m"], "--msg-timeout must be <= --max-msg-timeout"),
        (["--max-bytes-per-file=0"], "--max-bytes-per-file must be > 0"),
        (["--queue-scan-worker-pool-max=0"], "--queue-scan-worker-pool-max must be > 0"),
        (["--max-rdy-count=-1"], "--max-rdy-count must be >= 0"),
    ],
)
def test_invalid_options_are_fatal(args, reason):
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert "FATAL: failed to instantiate nsqd - " + reason in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0
    assert re.fullmatch(r"nsqd v1\.3\.0 \(built w/[a-z]+\d+\.\d+\.\d+\)\n", result.output)
    assert invoke("-version=true").output == result.output


def test_help_lists_every_flag():
    result = invoke("-h")
    assert result.exit_code == 0
    for setting in SETTINGS:
        if setting.flag:
            assert "--%s " % setting.flag in result.output
    assert "(default 1m0s)" in result.output


# -- refusals of features not built yet ---------------------------------------------

_SAMPLE = {STR: "x", STR_LIST: "x:1", INT: "3", DURATION: "3s", TLS_VERSION: "tls1.2"}


def _refusal_args(setting):
    if setting.kind.bare:
        return ["--" + setting.flag]  # bare boolean form: true
    return ["--%s=%s" % (setting.flag, _SAMPLE[setting.kind])]


UNSUPPORTED_SETTINGS = [s for s in SETTINGS if s.status == UNSUPPORTED]
REFUSABLE_SETTINGS = UNSUPPORTED_SETTINGS


@pytest.mark.parametrize("setting", REFUSABLE_SETTINGS, ids=lambda s: s.flag)
def test_unsupported_flag_is_refused(setting):
    result = invoke(*_refusal_args(setting))
    assert result.exit_code == 2, result.output
    assert result.output == "Error: --%s is not supported yet\n" % setting.flag


def test_unsupported_flags_in_go_forms_are_refused():
    for args in (["-topology-zone=z1"], ["-topology-region", "r1"]):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "is not supported yet" in result.output


def test_unsupported_feature_list():
    assert {s.flag for s in UNSUPPORTED_SETTINGS} == {
        "topology-region", "topology-zone", "enable-experiment",
    }


@pytest.mark.parametrize(
    "line, flag",
    [
        ('topology_zone = "z1"', "--topology-zone"),
        ('enable_experiment = ["topology-aware-consumption"]', "--enable-experiment"),
    ],
)
def test_unsupported_config_key_is_refused(tmp_path, line, flag):
    path = write_config(tmp_path, line + "\n")
    result = invoke("--config", path)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: %s is not supported yet (" % flag)
    assert path in result.output and len(result.output.splitlines()) == 1


def test_inert_unsupported_config_keys_are_accepted(tmp_path):
    path = write_config(
        tmp_path,
        "\n".join(
            [
                'tls_cert = ""',
                'tls_key = ""',
                "tls_required = false",
                'tls_min_version = ""',
                "deflate = true",
                "snappy = false",
                "max_deflate_level = 6",
                "nsqlookupd_tcp_addresses = []",
                "e2e_processing_latency_percentiles = []",
                'statsd_prefix = "nsq.%s"',
                'statsd_interval = "60s"',
                "statsd_mem_stats = true",
                'http_client_connect_timeout = "2s"',
                "max_rdy_count = 99",
            ]
        ),
    )
    opts, warnings = options_for("--config", path)
    assert opts.max_rdy_count == 99
    assert (opts.deflate, opts.snappy) == (True, False)
    assert warnings == []


@pytest.mark.parametrize(
    "args",
    [
        ["--snappy=false"], ["-deflate=false"], ["--tls-required=false"], ["--statsd-mem-stats=false"],
        ["--statsd-mem-stats"], ["--max-deflate-level=6"], ["--tls-cert="], ["--tls-min-version=tls1.0"],
        ["--http-client-connect-timeout=2s"],
    ],
)
def test_flags_restating_an_unbuilt_features_default_are_accepted(args):
    """What a config file may say, a flag may say: values that ask for nothing."""
    opts, warnings = options_for(*args)
    assert (opts.tls_required, opts.max_deflate_level) == (0, 6)
    assert (opts.snappy, opts.deflate) == ("--snappy=false" not in args, "-deflate=false" not in args)
    assert warnings == []


def test_help_shows_the_effective_value_of_unbuilt_features():
    output = invoke("--help").output
    help_of = {}
    for line in re.split(r"\n(?=  -)", output):
        match = re.match(r"\s*--([\w-]+)", line)
        if match:
            help_of[match.group(1)] = " ".join(line.split())
    for flag in ("snappy", "deflate"):
        assert help_of[flag].endswith("(default true)"), help_of[flag]
    assert "default" not in help_of["tls-required"]  # Go prints no default for it
    assert "(default true)" in help_of["statsd-mem-stats"] and "not supported" not in help_of["statsd-mem-stats"]
    assert help_of["max-deflate-level"].endswith("(default 6)")
    assert help_of["tls-min-version"].endswith("(default tls1.0)")
    assert "(default 30s)" in help_of["http-read-timeout"] and "(default 1m0s)" in help_of["msg-timeout"]


# -- the config file ------------------------------------------------------------------


def test_config_values_and_flag_precedence(tmp_path):
    path = write_config(
        tmp_path,
        """
        # a comment
        id = 77
        msg_timeout = "7s"
        max_msg_timeout = 600000      # integer: milliseconds
        max_rdy_count = 123
        log_level = "WARN"
        verbose = true                # deprecated flags have no config key: ignored
        no_such_key = "ignored"
        """,
    )
    opts, warnings = options_for("-config=" + path, "--msg-timeout=9s")
    assert opts.node_id == 77
    assert opts.msg_timeout == 9.0  # flag beats config file
    assert opts.max_msg_timeout == 600.0
    assert opts.max_rdy_count == 123
    assert opts.log_level == "warn"
    assert warnings == [
        "config file %s: unknown key verbose ignored" % path,
        "config file %s: unknown key no_such_key ignored" % path,
    ]


def test_config_file_missing_is_fatal(tmp_path):
    path = str(tmp_path / "absent.cfg")
    result = invoke("--config", path)
    assert result.exit_code == 1
    assert "FATAL: failed to load config file %s - " % path in result.output


@pytest.mark.parametrize(
    "text, detail",
    [
        ("msg_timeout = 1.5", "msg_timeout: want a duration string"),
        ('msg_timeout = "1"', 'msg_timeout: time: missing unit in duration "1"'),
        ('max_rdy_count = "many"', 'max_rdy_count: invalid integer "many"'),
        ("tcp_address = 4150", "tcp_address: want a string"),
        ("msg_timeout = ", "line 1"),
    ],
)
def test_config_file_bad_value_is_fatal(tmp_path, text, detail):
    path = write_config(tmp_path, text + "\n")
    result = invoke("--config", path)
    assert result.exit_code == 1, result.output
    assert "FATAL: failed to load config file %s - " % path in result.output
    assert detail in result.output
    assert len(result.output.splitlines()) == 1


def test_config_value_failing_validation_is_fatal(tmp_path):
    path = write_config(tmp_path, "id = 4096\n")
    result = invoke("--config", path)
    assert result.exit_code == 1
    assert "FATAL: failed to instantiate nsqd - --node-id must be [0,1024)" in result.output


# -- start failures (in-process: they exit before serving) ----------------------------


def test_bound_port_is_fatal(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        address = "127.0.0.1:%d" % taken.getsockname()[1]
        before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        result = invoke("--tcp-address=" + address, "--http-address=", "--data-path=" + str(tmp_path))
    assert result.exit_code == 1, result.output
    assert "FATAL: failed to instantiate nsqd - listen (%s) failed - " % address in result.output
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_locked_data_path_is_fatal(make_nsqd, tmp_path):
    running = make_nsqd()
    data_path = running.options.data_path
    result = invoke("--tcp-address=127.0.0.1:0", "--http-address=", "--data-path=" + data_path)
    assert result.exit_code == 1, result.output
    assert "FATAL: failed to instantiate nsqd - failed to lock data-path: cannot flock directory %s" % (
        data_path) in result.output


def test_missing_data_path_is_fatal(tmp_path):
    missing = str(tmp_path / "missing")
    result = invoke("--tcp-address=127.0.0.1:0", "--http-address=", "--data-path=" + missing)
    assert result.exit_code == 1, result.output
    assert result.output.endswith(
        "FATAL: failed to instantiate nsqd - --data-path %s does not exist "
        "(create it, writable by this user, or choose another)\n" % missing)
    assert len(result.output.splitlines()) == 1


def test_data_path_that_is_a_file_is_fatal(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("")
    result = invoke("--tcp-address=127.0.0.1:0", "--http-address=", "--data-path=%s" % afile)
    assert result.exit_code == 1, result.output
    assert result.output.endswith("FATAL: failed to instantiate nsqd - --data-path %s is not a directory\n" % afile)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_data_path_is_fatal(tmp_path):
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o555)
    result = invoke("--tcp-address=127.0.0.1:0", "--http-address=", "--data-path=%s" % readonly)
    assert result.exit_code == 1, result.output
    assert "--data-path %s is not writable by this user" % readonly in result.output


# -- the real process -----------------------------------------------------------------


class BrokerProcess(CommandProcess):
    """``python -m nsqd_threaded`` with its stderr lines collected by a reader thread."""

    def __init__(self, args, cwd=None):
        super().__init__([sys.executable, "-m", "nsqd_threaded"] + list(args), cwd=cwd)

    def tcp_port(self):
        return int(self.wait_for(r"TCP: listening on 127\.0\.0\.1:(\d+)").group(1))


@pytest.fixture
def spawn():
    started = []

    def start(*args, **kwargs):
        broker = BrokerProcess(args, **kwargs)
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.close()


def connect(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"  V2")
    return sock


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("connection closed")
        data += chunk
    return data


def identify(sock):
    """IDENTIFY with feature negotiation; returns the response JSON."""
    body = json.dumps({"feature_negotiation": True}).encode()
    sock.sendall(b"IDENTIFY\n" + struct.pack(">I", len(body)) + body)
    size, frame_type = struct.unpack(">II", recv_exact(sock, 8))
    data = recv_exact(sock, size - 4)
    assert frame_type == 0, data
    return json.loads(data)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_the_broker(spawn, tmp_path, signum):
    broker = spawn("--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--data-path=%s" % tmp_path)
    sock = connect(broker.tcp_port())
    with sock:
        sock.sendall(b"NOP\n")
        assert identify(sock)["max_rdy_count"] == 2500  # the connection is being served
        broker.proc.send_signal(signum)
        assert broker.proc.wait(timeout=15) == 0, broker.log
        assert sock.recv(1) == b""  # the broker closed it on the way out
    broker.wait_for(r"NSQ: stopped")


def test_data_path_defaults_to_the_working_directory(spawn, tmp_path):
    broker = spawn("-tcp-address=127.0.0.1:0", "-http-address=127.0.0.1:0", cwd=str(tmp_path))
    broker.tcp_port()
    broker.proc.send_signal(signal.SIGTERM)
    assert broker.proc.wait(timeout=15) == 0, broker.log
    assert os.path.exists(tmp_path / "nsqd.dat")


def test_config_file_and_flag_override_in_a_real_process(spawn, tmp_path):
    path = write_config(
        tmp_path,
        "tcp_address = '127.0.0.1:0'\n"
        "http_address = '127.0.0.1:0'\n"
        "data_path = '%s'\n"
        "max_rdy_count = 123\n"
        "msg_timeout = '7s'\n"
        "max_msg_timeout = 600000\n" % tmp_path,
    )
    broker = spawn("-config=" + path, "--msg-timeout=9s")
    with connect(broker.tcp_port()) as sock:
        response = identify(sock)
    assert response["max_rdy_count"] == 123  # from the file
    assert response["max_msg_timeout"] == 600000  # integer milliseconds in the file
    assert response["msg_timeout"] == 9000  # the flag wins over the file's 7s
    broker.proc.send_signal(signal.SIGTERM)
    assert broker.proc.wait(timeout=15) == 0, broker.log


def test_version_process():
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "nsqd_threaded", "--version"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        universal_newlines=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nsqd v1.3.0 (built w/")
    assert len(done.stdout.splitlines()) == 1


def test_fatal_process_exit_code(spawn, tmp_path):
    broker = spawn("--node-id=5000", "--data-path=%s" % tmp_path)
    broker.wait_for(r"FATAL: failed to instantiate nsqd - --node-id must be \[0,1024\)")
    assert broker.proc.wait(timeout=15) == 1


def test_e2e_percentiles_are_supported(tmp_path):
    """The e2e latency window is built: its flags reach Options, sorted descending."""
    path = write_config(tmp_path, "e2e_processing_latency_percentiles = [0.5, 0.99]\n")
    result = invoke("--config", path, "--e2e-processing-latency-percentile=1.5")
    assert result.exit_code == 1, result.output
    assert "invalid E2E processing latency percentile: 1.5" in result.output


# -- one clear line for every startup error (a real process: no traceback reaches stderr) ----


def run_cli(*args, cwd=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "nsqd_threaded"] + list(args),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        universal_newlines=True,
        env=env,
        cwd=cwd,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args, config, name",
    [
        (["--tcp-address=127.0.0.1:99999", "--http-address="], None, "--tcp-address"),
        (["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:70000"], None, "--http-address"),
        (["--tcp-address=localhost", "--http-address="], None, "--tcp-address"),
        (["--http-address="], "tcp_address = '127.0.0.1:65536'\n", "--tcp-address"),
        (["--tcp-address=127.0.0.1:0", "--http-address="], None, "--data-path"),
        (["--tcp-address=127.0.0.1:0", "--http-address=", "--node-id=5000"], None, "--node-id"),
        (["--tcp-address=127.0.0.1:0", "--http-address=", "--tls-required=true"], None, "TLS key and cert"),
        ([], "mem_queue_size = 'many'\n", "mem_queue_size"),
    ],
    ids=["tcp-port", "http-port", "no-port", "config-port", "data-path", "node-id", "tls-required", "config-value"],
)
def test_startup_errors_are_one_line_naming_the_setting(tmp_path, args, config, name):
    args = list(args)
    if name != "--data-path":
        args.append("--data-path=%s" % tmp_path)
    else:
        args.append("--data-path=%s" % (tmp_path / "absent"))
    if config:
        args.append("--config=" + write_config(tmp_path, config))
    done = run_cli(*args, cwd=str(tmp_path))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and name in lines[0], done.stderr


def test_unknown_config_key_is_logged_as_a_warning(spawn, tmp_path):
    path = write_config(tmp_path, "mem_queue_sizee = 100\ntcp_address = '127.0.0.1:0'\nhttp_address = ''\n")
    broker = spawn("--config=" + path, "--data-path=%s" % tmp_path)
    broker.wait_for(r"WARNING: config file %s: unknown key mem_queue_sizee ignored "
                    r"\(did you mean mem_queue_size\?\)" % re.escape(path))
    broker.tcp_port()
    broker.proc.send_signal(signal.SIGTERM)
    assert broker.proc.wait(timeout=15) == 0, broker.log
