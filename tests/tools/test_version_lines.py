"""Every command's ``--version`` line and the daemons' first log lines, in Go's shape, next to Go's when present.

Client libraries' test harnesses start ``nsqd`` and parse its version line
(gnsq's regular expression is :data:`GNSQ_VERSION`), so the shape is a contract.
"""

import re
import sys

import pytest

from support.proc import CommandProcess
from support.tools import go_tool, run

pytestmark = pytest.mark.timeout(120)

# gnsq 1.0.2's test harness: what it accepts from `nsqd --version`.
GNSQ_VERSION = re.compile(r"^[a-z]+ v\d+\.\d+\.\d+(-[a-z]+)? \(built w/[a-z0-9.-]+\)")

DAEMONS = ("nsqd", "nsqlookupd", "nsqadmin")
# Go's tools with --version (to_nsq has none, in Go as here).
TOOLS = ("nsq_tail", "nsq_stat", "nsq_to_file", "nsq_to_http", "nsq_to_nsq")
RUNTIME = r"(cpython|pypy)\d+\.\d+\.\d+"


def version_of(*args, argv=None):
    code, out, err = run(*args, argv=argv)
    assert code == 0, err
    return out.decode()


@pytest.mark.parametrize("daemon", DAEMONS)
def test_a_daemon_prints_gos_version_line_under_every_name(daemon, tmp_path):
    line = version_of(daemon, "--version")
    assert re.fullmatch(r"%s v1\.3\.0 \(built w/%s\)\n" % (daemon, RUNTIME), line), line
    assert GNSQ_VERSION.match(line)
    # the console script, and a copy of it named as Go's binary (what a harness runs)
    module = {"nsqd": "nsqd_threaded.cli", "nsqlookupd": "nsqd_threaded.lookupd.cli",
              "nsqadmin": "nsqd_threaded.admin.cli"}[daemon]
    script = tmp_path / daemon
    script.write_text("import sys\nfrom %s import main\nsys.exit(main())\n" % module)
    assert version_of(argv=[sys.executable, str(script), "--version"]) == line
    assert version_of(argv=[sys.executable, str(script), "-version"]) == line
    if daemon == "nsqd":
        assert version_of("--version") == line  # no command: nsqd
    go = go_tool(daemon)
    if go is not None:
        gos = version_of(argv=[go, "--version"])
        assert GNSQ_VERSION.match(gos)
        assert re.sub(r"w/\S+\)", "w/X)", gos) == re.sub(r"w/\S+\)", "w/X)", line)


@pytest.mark.parametrize("tool", TOOLS)
def test_a_tool_prints_gos_version_line(tool):
    short = {"nsq_tail": "tail", "nsq_stat": "stat", "nsq_to_file": "to-file", "nsq_to_http": "to-http",
             "nsq_to_nsq": "relay"}[tool]
    line = version_of(tool, "--version")
    assert line == "%s v1.3.0\n" % tool
    assert version_of(short, "-version") == line
    go = go_tool(tool)
    if go is not None:
        assert version_of(argv=[go, "--version"]) == line


def test_to_nsq_has_no_version_flag_as_in_go():
    code, _, err = run("to_nsq", "--version")
    assert code == 2 and "--version" in err
    go = go_tool("to_nsq")
    if go is not None:
        assert run(argv=[go, "--version"])[0] == 2


def first_lines(argv, until, tmp_path):
    """The log lines of a daemon up to the last one matching a pattern of ``until`` (in any order),
    timestamps and prefixes left out."""
    proc = CommandProcess(argv, cwd=str(tmp_path))
    try:
        for pattern in until:
            if not any(re.search(pattern, line) for line in proc.log):
                proc.wait_for(pattern)
    finally:
        proc.close()
    return [re.sub(r"^\[\w+\] [\d/]+ [\d:.]+ INFO: |^[\d/]+ [\d:.]+ ", "", line.rstrip("\n")) for line in proc.log]


def normalized(lines):
    """Lines with what differs between two runs or two implementations replaced."""
    return [re.sub(r"(127\.0\.0\.1|\[::\]|0\.0\.0\.0):\d+", "ADDR", re.sub(r"built w/\S+\)", "built w/X)", line))
            for line in lines]


DAEMON_ARGS = {
    "nsqd": (["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"], [r"HTTP: listening on", r"TCP: listening on"]),
    "nsqlookupd": (["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"],
                   [r"HTTP: listening on", r"TCP: listening on"]),
    "nsqadmin": (["--http-address=127.0.0.1:0", "--nsqd-http-address=127.0.0.1:1"], [r"HTTP: listening on"]),
}


@pytest.mark.parametrize("daemon", DAEMONS)
def test_a_daemon_logs_gos_first_lines(daemon, tmp_path):
    args, until = DAEMON_ARGS[daemon]
    (tmp_path / "ours").mkdir()
    ours = first_lines([sys.executable, "-m", "nsqd_threaded", daemon] + args, until, tmp_path / "ours")
    assert re.fullmatch(r"%s v1\.3\.0 \(built w/%s\)" % (daemon, RUNTIME), ours[0]), ours
    if daemon == "nsqd":
        assert re.fullmatch(r"ID: \d+", ours[1]), ours
        assert ours[2] == "NSQ: persisting topic/channel metadata to nsqd.dat"  # relative, as Go says it
    go = go_tool(daemon)
    if go is None:
        return
    (tmp_path / "gos").mkdir()
    gos = first_lines([go] + args, until, tmp_path / "gos")
    assert sorted(normalized(ours)) == sorted(normalized(gos))  # the listeners may start in either order


def test_the_nsqd_log_line_names_the_node_id(tmp_path):
    lines = first_lines([sys.executable, "-m", "nsqd_threaded", "--tcp-address=127.0.0.1:0",
                         "--http-address=127.0.0.1:0", "--node-id=42"], [r"ID: "], tmp_path)
    assert lines[-1] == "ID: 42"

