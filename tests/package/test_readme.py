"""What README.md shows works when copied: its pytest example passes, its scripts can be run."""

import os
import re
import stat
import subprocess

import pytest

import nsqd_threaded

pytest_plugins = ["pytester"]

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(nsqd_threaded.__file__)))


def _readme():
    with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_the_readme_pytest_example_passes_as_copied(pytester):
    blocks = re.findall(r"```python\n(.*?)```", _readme(), re.S)
    examples = [b for b in blocks if "def test_" in b]
    assert len(examples) == 1
    pytester.makepyfile(test_readme_example=examples[0])
    result = pytester.runpytest("-p", "nsqd_threaded.pytest_plugin", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_the_readme_scripts_are_executable():
    named = set(re.findall(r"`?(scripts/[\w.]+)", _readme()))
    assert "scripts/bench" in named
    for root, _, files in os.walk(os.path.join(REPO_ROOT, "scripts")):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                shebang = f.read(2) == b"#!"
            if shebang:
                assert os.stat(path).st_mode & stat.S_IXUSR, "%s has a #! line but no run bit" % path


def test_scripts_are_executable_in_git():
    """The run bit as committed (a fresh clone), not only on this disk."""
    try:
        listing = subprocess.run(
            ["git", "ls-files", "-s", "scripts"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, universal_newlines=True, timeout=30,
        )
    except OSError:
        pytest.skip("git is not available")
    if listing.returncode != 0 or not listing.stdout:
        pytest.skip("not a git checkout")
    modes = {line.split("\t")[1]: line.split()[0] for line in listing.stdout.splitlines()}
    for path, mode in modes.items():
        with open(os.path.join(REPO_ROOT, path), "rb") as f:
            if f.read(2) == b"#!":
                assert mode == "100755", "%s has a #! line but is committed as %s" % (path, mode)


@pytest.mark.timeout(120)
def test_the_readme_first_message_works_as_written(tmp_path):
    """The "A first message" commands, run by bash against a broker on kernel-chosen ports (the
    block's 4150/4151 replaced by them, `scripts/run &` by that broker, `.venv/bin/python` by this
    interpreter): the ping answers OK, the publish OK, and the one-liner prints the message."""
    import shutil
    import sys

    from nsqd_threaded.testing import Broker

    if not shutil.which("curl"):
        pytest.skip("needs curl")
    block = _readme().split("## A first message", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    assert lines[0].startswith("scripts/run &") and lines[-1].startswith("kill %1"), lines
    assert ". .venv/bin/activate" in _readme().split("## A first message", 1)[1].split("## ", 1)[0]
    with Broker() as broker:
        script = "\n".join(lines[1:-1])
        # One pass, so a kernel-chosen port that itself contains "4151" (41515, 44151) is never
        # rewritten a second time.
        ports = {"4150": broker.tcp_address[1], "4151": broker.http_address[1]}
        script, count = re.subn(r"\b127\.0\.0\.1:(4150|4151)\b",
                                lambda m: "127.0.0.1:%d" % ports[m.group(1)], script)
        assert count >= 3, script
        script = script.replace(".venv/bin/python ", sys.executable + " ")
        assert not re.search(r":415[01]\b", script), script
        result = subprocess.run(["bash", "-euc", script], cwd=str(tmp_path), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, universal_newlines=True, timeout=100)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "OK\nOK\nhello\n"
