"""The small words: error lines, defaults in --help, a mistyped command, a bad flag (Go's side by side when present)."""

import re

import pytest

from support.tools import go_tool, run

pytestmark = pytest.mark.timeout(120)

DOWN = "127.0.0.1:1"


def test_nsq_stat_says_error_once():
    args = ["--topic=t", "--channel=c", "--lookupd-http-address=" + DOWN, "--count=1"]
    code, _, err = run("nsq_stat", *args)
    assert code == 1
    assert re.fullmatch(r"\[nsq_stat\] [\d/]+ [\d:.]+ ERROR: failed to get topic producers - .*\n", err), err
    go = go_tool("nsq_stat")
    if go is not None:
        code, _, gos = run(argv=[go] + args)
        assert code == 1 and re.fullmatch(r"[\d/]+ [\d:]+ ERROR: failed to get topic producers - .*\n", gos), gos


def test_to_nsq_help_shows_the_delimiter_default_as_go_does():
    code, out, _ = run("to_nsq", "--help")
    assert code == 0
    help_text = " ".join(out.decode().split())  # click wraps long lines
    assert 'character to split input from stdin (default "\\n")' in help_text
    assert '(default " ")' not in help_text
    go = go_tool("to_nsq")
    if go is not None:
        _, _, err = run(argv=[go, "-h"])
        assert 'character to split input from stdin (default "\\n")' in " ".join(err.split())


def test_a_mistyped_command_is_named_with_the_list_of_commands():
    code, out, err = run("tial", "--topic=t")
    assert code == 2 and out == b""
    lines = err.splitlines()
    assert len(lines) == 3, err
    assert "no such command 'tial' (did you mean tail?)" in lines[1]
    for name in ("nsqd", "nsqlookupd", "nsqadmin", "tail", "to-nsq", "stat", "to-file", "to-http", "relay",
                 "versions"):
        assert re.search(r"\b%s\b" % re.escape(name), lines[0]), lines[0]
    assert "flag" not in lines[0] and "option" not in err.lower()  # not reported as an nsqd flag error


@pytest.mark.parametrize("command, go_name", [("tail", "nsq_tail"), ("to-nsq", "to_nsq"), ("stat", "nsq_stat"),
                                              ("nsqlookupd", "nsqlookupd"), ("nsqd", "nsqd")])
def test_a_bad_flag_exits_2_with_three_lines(command, go_name):
    code, out, err = run(command, "--no-such-flag")
    assert code == 2 and out == b""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 3, err
    assert lines[-1].startswith("Error: No such option") and "--no-such-flag" in lines[-1], err
    go = go_tool(go_name)
    if go is not None:
        code, _, err = run(argv=[go, "--no-such-flag"])
        assert code == 2 and err.startswith("flag provided but not defined: -no-such-flag")
