"""The single-file build: scripts/build_pyz's archive, run by an interpreter that has nothing installed.

The archive is built from the dependencies installed for this runtime (no
network), then run with ``python -I -S``: no site-packages, no PYTHONPATH,
no working directory on the path, so click, sortedcontainers and
nsqd_threaded can only come from the archive (checked first).
"""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import zipfile
from importlib import metadata

import pytest

from nsqd_threaded.settings.options import VERSION

from support.proc import REPO_ROOT, CommandProcess
from support.wire import Conn

BUILD = os.path.join(REPO_ROOT, "scripts", "build_pyz")
BARE = [sys.executable, "-I", "-S"]
DEPENDENCIES = ("click", "sortedcontainers")


def build(output, *args):
    result = subprocess.run([sys.executable, BUILD, "-o", str(output)] + list(args),
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    path = tmp_path_factory.mktemp("pyz") / "nsqd-threaded.pyz"
    build(path, "--installed")
    return str(path)


@pytest.fixture(scope="module")
def bare_python():
    """``python -I -S`` of this runtime, after checking it cannot import what the archive bundles."""
    for module in ("click", "sortedcontainers", "nsqd_threaded"):
        result = subprocess.run(BARE + ["-c", "import %s" % module], cwd="/", stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr, (module, result)
    return BARE


@pytest.fixture
def run(tmp_path):
    """Start ``bare_python pyz ARGS`` in ``tmp_path``; every process started is killed if still running."""
    started = []

    def start(*argv):
        proc = CommandProcess(list(argv), cwd=str(tmp_path))
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def stop(proc):
    """SIGTERM: the daemon shuts down gracefully and exits 0."""
    proc.proc.send_signal(signal.SIGTERM)
    assert proc.proc.wait(timeout=30) == 0, proc.log


def http(port, method, path):
    request = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method, data=b"" if
                                     method == "POST" else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.read()


def ports(proc):
    """``{"TCP": port, "HTTP": port}`` from the daemon's two ``listening on`` log lines, in either order."""
    found = {}
    while len(found) < 2:
        match = proc.wait_for(r"(TCP|HTTP): listening on 127\.0\.0\.1:(\d+)")
        found[match.group(1)] = int(match.group(2))
    return found


def start_nsqd(run, bare_python, pyz, data):
    proc = run(*bare_python, pyz, "-tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--data-path=%s" % data)
    found = ports(proc)
    return proc, found["TCP"], found["HTTP"]


def test_pyz_runs_nsqd_with_a_bare_python(run, bare_python, pyz, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    nsqd, tcp, http_port = start_nsqd(run, bare_python, pyz, data)
    assert http(http_port, "GET", "/ping") == (200, b"OK")
    assert http(http_port, "POST", "/topic/create?topic=orders")[0] == 200
    assert http(http_port, "POST", "/channel/create?topic=orders&channel=later")[0] == 200
    with Conn(("127.0.0.1", tcp)) as consumer, Conn(("127.0.0.1", tcp)) as producer:
        consumer.sub("orders", "live", rdy=1)
        assert producer.pub("orders", b"order 1") == b"OK"
        _, attempts, msg_id, body = consumer.read_message()
        assert (attempts, body) == (1, b"order 1")
        consumer.cmd(b"FIN " + msg_id)
    stop(nsqd)
    nsqd.wait_for(r"NSQ: stopped")
    with open(data / "nsqd.dat") as f:
        (topic,) = json.load(f)["topics"]
    assert topic["name"] == "orders"
    assert sorted(c["name"] for c in topic["channels"]) == ["later", "live"]

    # the copy queued for the channel nobody read survives the restart
    nsqd, tcp, _ = start_nsqd(run, bare_python, pyz, data)
    with Conn(("127.0.0.1", tcp)) as consumer:
        consumer.sub("orders", "later", rdy=1)
        _, _, msg_id, body = consumer.read_message()
        assert body == b"order 1"
        consumer.cmd(b"FIN " + msg_id)
    stop(nsqd)


def test_pyz_runs_nsqlookupd(run, bare_python, pyz):
    lookupd = run(*bare_python, pyz, "nsqlookupd", "-tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0")
    assert http(ports(lookupd)["HTTP"], "GET", "/ping") == (200, b"OK")
    stop(lookupd)


def test_pyz_runs_nsqadmin_over_a_cluster(run, bare_python, pyz):
    """An operator with python3 and the .pyz: lookupd, a broker and nsqadmin, pages and static assets."""
    lookupd = run(*bare_python, pyz, "nsqlookupd", "-tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0")
    lookupd_ports = ports(lookupd)
    admin = run(*bare_python, pyz, "nsqadmin", "--http-address=127.0.0.1:0",
                "--lookupd-http-address=127.0.0.1:%d" % lookupd_ports["HTTP"])
    port = int(admin.wait_for(r"HTTP: listening on 127\.0\.0\.1:(\d+)").group(1))
    assert http(port, "GET", "/api/topics") == (200, b'{"topics":[],"message":""}')
    for path in ("/topics", "/nodes", "/static/admin.js", "/static/admin.css", "/static/favicon.svg"):
        assert http(port, "GET", path)[0] == 200
    assert b"createElement" in http(port, "GET", "/static/admin.js")[1]  # the file, read from the zip
    stop(admin)
    stop(lookupd)


def test_pyz_versions_and_commands(bare_python, pyz, tmp_path):
    def output(*args):
        result = subprocess.run(bare_python + [pyz] + list(args), cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    lines = output("versions")
    assert lines[:3] == ["nsqd-threaded %s" % VERSION] + ["%s %s" % (d, metadata.version(d)) for d in DEPENDENCIES]
    assert lines[3].startswith("python %s " % ".".join(map(str, sys.version_info[:3])))
    assert output("--version")[0].startswith("nsqd v%s (built w/" % VERSION)
    assert output("nsqd", "--version")[0].startswith("nsqd v%s (built w/" % VERSION)
    assert output("tail", "--version") == ["nsq_tail v%s" % VERSION]
    assert "--inactive-producer-timeout" in "\n".join(output("nsqlookupd", "--help"))
    assert "--lookupd-http-address" in "\n".join(output("nsqadmin", "--help"))
    listed = "\n".join(output("--help"))
    for name in ("nsqlookupd", "nsqadmin", "tail", "nsq_tail", "to-nsq", "to_nsq", "stat", "nsq_stat", "to-file",
                 "nsq_to_file", "versions", "--tcp-address"):
        assert name in listed
    assert "--print-topic" in "\n".join(output("tail", "--help"))
    assert "--delimiter" in "\n".join(output("to_nsq", "--help"))
    tail_link = tmp_path / "nsq_tail"
    tail_link.symlink_to(pyz)
    result = subprocess.run(bare_python + [str(tail_link), "--help"], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60)
    assert "--print-topic" in result.stdout, result.stderr
    result = subprocess.run(bare_python + [str(tail_link), "--version"], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60)
    assert result.stdout == "nsq_tail v%s\n" % VERSION, result.stderr
    nsqd_link = tmp_path / "nsqd"
    nsqd_link.symlink_to(pyz)
    result = subprocess.run(bare_python + [str(nsqd_link), "--version"], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.startswith("nsqd v%s (built w/" % VERSION), result.stderr
    link = tmp_path / "nsqlookupd.pyz"
    link.symlink_to(pyz)
    result = subprocess.run(bare_python + [str(link), "--version"], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.startswith("nsqlookupd v%s (built w/" % VERSION), result.stderr


def test_python_m_nsqd_threaded_dispatches_the_same():
    def output(*args):
        env = dict(os.environ, PYTHONPATH=REPO_ROOT)
        result = subprocess.run([sys.executable, "-m", "nsqd_threaded"] + list(args), env=env,
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    assert output("nsqlookupd", "--version")[0].startswith("nsqlookupd v")
    assert output("--version")[0].startswith("nsqd v")
    assert output("versions")[:3] == ["nsqd-threaded %s" % VERSION] + [
        "%s %s" % (d, metadata.version(d)) for d in DEPENDENCIES]


def test_pyz_is_reproducible_and_holds_only_the_package_and_its_dependencies(pyz, tmp_path):
    again = tmp_path / "again.pyz"
    build(again, "--installed")
    with open(pyz, "rb") as f:
        first = f.read()
    assert again.read_bytes() == first
    assert first.startswith(b"#!/usr/bin/env python3\n")
    assert os.stat(pyz).st_mode & 0o777 == 0o755
    with zipfile.ZipFile(pyz) as archive:
        infos = archive.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names)
    assert all(i.date_time == (1980, 1, 1, 0, 0, 0) and i.external_attr >> 16 == 0o100644 for i in infos)
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".so"))]
    tops = {n.split("/")[0] for n in names}
    assert {"__main__.py", "nsqd_threaded", "click", "sortedcontainers"} <= tops
    extra = {t for t in tops if not t.endswith(".dist-info")} - {"__main__.py", "nsqd_threaded", "click",
                                                                   "sortedcontainers"}
    assert not extra
    assert "nsqd_threaded/pytest_plugin.py" in names  # the whole package, as pip installs it
    assert {"nsqd_threaded/admin/assets/%s" % a for a in ("admin.js", "admin.css", "favicon.svg")} <= set(names)


def test_pip_builds_carry_the_admin_assets(tmp_path):
    """setup.cfg's package data: setuptools' build step (what pip runs for a wheel) copies nsqadmin's assets.

    (Run where setuptools is installed: a venv of Python 3.12+ has none unless asked.)"""
    import shutil

    pytest.importorskip("setuptools")

    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(os.path.join(REPO_ROOT, name), source / name)
    shutil.copytree(os.path.join(REPO_ROOT, "nsqd_threaded"), source / "nsqd_threaded",
                    ignore=shutil.ignore_patterns("__pycache__"))
    built = tmp_path / "built"
    result = subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py",
                             "-d", str(built)], cwd=str(source), stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assets = built / "nsqd_threaded" / "admin" / "assets"
    assert sorted(os.listdir(assets)) == ["admin.css", "admin.js", "favicon.svg"]


def fake_wheel(directory, name, requires=None):
    """A wheel of the installed ``name``: the same files in a zip, as ``pip wheel`` would lay them out
    (with ``Requires-Python: requires`` if given)."""
    dist = metadata.distribution(name)
    path = directory / ("%s-%s-py3-none-any.whl" % (name, dist.version))
    with zipfile.ZipFile(path, "w") as wheel:
        for file in dist.files:
            if not str(file).startswith("..") and "__pycache__" not in str(file):
                data = dist.locate_file(file).read_bytes()
                if requires and file.name == "METADATA":
                    data = re.sub(rb"(?m)^Requires-Python:.*\n", b"", data)
                    data = data.replace(b"\n", b"\nRequires-Python: %s\n" % requires.encode(), 1)
                wheel.writestr(file.as_posix(), data)
    return dist.version, hashlib.sha256(path.read_bytes()).hexdigest()


def test_pyz_from_a_wheel_cache_offline(bare_python, pyz, tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    pins = tmp_path / "pins.txt"
    pins.write_text("".join("%s==%s --hash=sha256:%s\n" % ((d,) + fake_wheel(wheelhouse, d)) for d in DEPENDENCIES))
    from_wheels = tmp_path / "from-wheels.pyz"
    build(from_wheels, "--wheelhouse", str(wheelhouse), "--pins", str(pins), "--offline")
    result = subprocess.run(bare_python + [str(from_wheels), "versions"], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:3] == ["%s %s" % (d, metadata.version(d)) for d in DEPENDENCIES]
    with zipfile.ZipFile(pyz) as a, zipfile.ZipFile(from_wheels) as b:
        # the same files whichever the source; only the manifest comment says where they came from
        assert a.namelist() == b.namelist()
        assert [a.read(n) for n in a.namelist() if n != "__main__.py"] == [
            b.read(n) for n in b.namelist() if n != "__main__.py"]

    # a wheel that is not the pinned one is refused
    (wheelhouse / ("click-%s-py3-none-any.whl" % metadata.version("click"))).write_bytes(b"not the pinned wheel")
    result = subprocess.run([sys.executable, BUILD, "-o", str(tmp_path / "x.pyz"), "--wheelhouse", str(wheelhouse),
                             "--pins", str(pins), "--offline"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "does not match its pinned sha256" in result.stderr
    assert not (tmp_path / "x.pyz").exists()


def test_pinned_wheels_run_on_the_oldest_supported_python():
    """The default pins must not need a newer Python than the package's python_requires (3.9)."""
    with open(os.path.join(REPO_ROOT, "scripts", "pyz-requirements.txt")) as f:
        lines = [line.split("#")[0].split() for line in f]
    pins = dict(words[0].split("==") for words in lines if words)
    assert sorted(pins) == sorted(DEPENDENCIES)
    assert pins["click"].startswith("8.1.")  # click 8.2 dropped Python 3.9


def test_pyz_refuses_a_python_older_than_a_bundled_dependency_needs(bare_python, tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    pins = tmp_path / "pins.txt"
    pins.write_text("".join("%s==%s --hash=sha256:%s\n" % ((d,) + fake_wheel(wheelhouse, d, requires=">=3.99"
                            if d == "sortedcontainers" else None)) for d in DEPENDENCIES))
    future = tmp_path / "future.pyz"
    warning = build(future, "--wheelhouse", str(wheelhouse), "--pins", str(pins), "--offline").stderr
    assert "needs Python 3.99+ (sortedcontainers %s)" % metadata.version("sortedcontainers") in warning
    result = subprocess.run(bare_python + [str(future), "--version"], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == "%s: needs Python 3.99 or newer (for sortedcontainers %s); this is %s\n" % (
        future, metadata.version("sortedcontainers"), ".".join(map(str, sys.version_info[:3])))


def unit_command(name):
    """The arguments after the .pyz in a shipped systemd unit's ExecStart= (continuation lines joined)."""
    with open(os.path.join(REPO_ROOT, "scripts", "systemd", name)) as f:
        text = f.read().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    words = line.split()
    return words[[w.endswith(".pyz") for w in words].index(True) + 1:]


@pytest.mark.parametrize("unit", ["nsqd-threaded.service", "nsqlookupd-threaded.service"])
def test_systemd_units_give_flags_the_command_accepts(unit):
    from nsqd_threaded import cli
    from nsqd_threaded.lookupd import cli as lookupd_cli

    args = unit_command(unit)
    module = lookupd_cli if args[:1] == ["nsqlookupd"] else cli
    assert (module is lookupd_cli) == unit.startswith("nsqlookupd")
    if module is lookupd_cli:
        args = args[1:]
    ctx = module.main.make_context(unit, list(args))
    options, warnings = module.resolve(ctx.params)
    assert warnings == []
    if module is cli:
        assert options.data_path == "/var/lib/nsqd"
        with open(os.path.join(REPO_ROOT, "scripts", "systemd", unit)) as f:
            assert "StateDirectory=nsqd\n" in f.read()
