"""scripts/setup and scripts/test decide well: install what they may, name the fixing command otherwise.

The scripts run for real, with a PATH that holds only the tools they need, so that pypy3, apt-get,
chromium... are present or absent as each test wants.  Nothing here installs anything: a test that
could reach apt-get gets a stand-in that only records that it was called.
"""

import os
import shutil
import subprocess
import tempfile

import pytest

import nsqd_threaded

pytestmark = pytest.mark.timeout(120)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(nsqd_threaded.__file__)))
TOOLS = ["bash", "env", "dirname", "id", "sed", "tail", "tee", "mktemp", "rm", "cat", "ls", "grep", "sort",
         "paste", "touch"]


@pytest.fixture
def bin_dir():
    """A PATH directory (readable by every user) with the shell tools and nothing else."""
    path = tempfile.mkdtemp(prefix="nsqd-scripts-bin-")
    os.chmod(path, 0o755)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        os.symlink(found, os.path.join(path, tool))
    yield path
    shutil.rmtree(path)


def run(argv, bin_dir, user=None, **env):
    environ = {"PATH": bin_dir, "HOME": bin_dir, "PYENV_ROOT": bin_dir}  # no pyenv CPython either
    environ.update(env)
    if user is not None:
        argv = ["setpriv", "--reuid=%d" % user, "--regid=%d" % user, "--clear-groups"] + argv
        argv[0] = shutil.which("setpriv")
    return subprocess.run(argv, cwd=REPO_ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=60)


def summary(output):
    return output.split("=== summary ===", 1)[1] if "=== summary ===" in output else ""


def test_ci_without_a_way_to_install_fails_with_the_command_that_fixes_it(bin_dir):
    """No pypy3 and no apt-get: under CI the run fails, and says which command would fix it."""
    sudo = "" if os.getuid() == 0 else "sudo "
    result = run(["scripts/test", "-q"], bin_dir, CI="true", NSQD_TEST_RUNTIMES="pypy3")
    assert result.returncode != 0, result.stdout
    fix = "%sapt-get install -y pypy3" % sudo
    assert "pypy3: MISSING; required when CI is set; to install: %s" % fix in summary(result.stdout), result.stdout
    # chromium, chromedriver and Java are missing from this PATH too: named in one command.
    assert "to install: %sapt-get install -y openjdk-17-jre-headless chromium chromium-driver" % sudo in result.stdout
    assert not os.path.exists(os.path.join(REPO_ROOT, ".venv-pypy3", "bin", "pypy3")) or shutil.which("pypy3")


def test_without_ci_a_missing_runtime_is_a_warning(bin_dir):
    result = run(["scripts/test", "-q"], bin_dir, NSQD_TEST_RUNTIMES="pypy3")
    assert result.returncode == 0, result.stdout
    assert "scripts/test: warning: pypy3 is missing (to install: " in result.stdout


def test_a_pyenv_cpython_named_but_absent_names_pyenv_install(bin_dir):
    result = run(["scripts/test", "-q"], bin_dir, CI="1", NSQD_TEST_RUNTIMES="3.9")
    assert result.returncode != 0
    assert "3.9: MISSING; required when CI is set; to install: pyenv install 3.9" in summary(result.stdout)


def _apt_stand_in(bin_dir):
    """An apt-get that only records its calls; ``update`` succeeds, ``install`` fails (nothing is installed)."""
    calls = os.path.join(bin_dir, "apt-calls")
    with open(os.path.join(bin_dir, "apt-get"), "w") as f:
        f.write("#!%s\necho \"$*\" >>%s\ncase \" $* \" in *\" update \"*) exit 0 ;; esac\nexit 100\n"
                % (shutil.which("bash"), calls))
    os.chmod(os.path.join(bin_dir, "apt-get"), 0o755)
    return calls


def test_installed_programs_cost_no_apt_call(bin_dir):
    programs = {name: shutil.which(name) for name in ("chromium", "chromedriver", "java")}
    if not all(programs.values()):
        pytest.skip("needs chromium, chromedriver and java installed: %s" % programs)
    for name, path in programs.items():
        os.symlink(path, os.path.join(bin_dir, name))
    calls = _apt_stand_in(bin_dir)
    result = run(["scripts/setup", "--programs"], bin_dir)
    assert result.returncode == 0, result.stdout
    assert result.stdout == ""
    assert not os.path.exists(calls)


@pytest.mark.skipif(os.getuid() != 0, reason="as root: runs the script as another user")
def test_not_root_names_the_sudo_command_and_never_calls_apt(bin_dir):
    calls = _apt_stand_in(bin_dir)
    result = run(["scripts/setup", "--programs"], bin_dir, user=65534)
    assert result.returncode == 3, result.stdout
    assert "to install: sudo apt-get install -y openjdk-17-jre-headless chromium chromium-driver" in result.stdout
    assert not os.path.exists(calls)


@pytest.mark.skipif(os.getuid() != 0, reason="the install path runs as root")
def test_as_root_a_failing_install_refreshes_the_index_once_then_names_the_command(bin_dir):
    """The install is tried, then ``apt-get update`` and the install again; all failing: the command."""
    calls = _apt_stand_in(bin_dir)
    result = run(["scripts/setup", "--programs"], bin_dir)
    assert result.returncode == 3, result.stdout
    assert "chromium chromium-driver missing: installing (apt-get install -y" in result.stdout
    assert "could not install openjdk-17-jre-headless chromium chromium-driver; to install: apt-get install -y" \
        in result.stdout
    with open(calls) as f:
        verbs = [("install" if " install " in line else line.split()[-1]) for line in f.read().splitlines()]
    assert verbs == ["install", "update", "install"], verbs


def _copy_checkout(dest):
    """The files a checkout has (as on this disk, committed or not), without any virtualenv."""
    listing = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, universal_newlines=True, timeout=30)
    if listing.returncode != 0:
        pytest.skip("not a git checkout")
    for rel in listing.stdout.splitlines():
        src = os.path.join(REPO_ROOT, rel)
        if rel.startswith(("scripts/", "nsqd_threaded/")) or "/" not in rel:
            if os.path.isfile(src):
                os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                shutil.copy2(src, os.path.join(dest, rel))


# (marked spark: it installs the spark extra, and scripts/setup runs under python3 whichever runtime runs
# pytest, so the other runtimes, run with -m "not spark", would only repeat it)
@pytest.mark.spark
@pytest.mark.timeout(900)
def test_one_venv_serves_scripts_run_and_scripts_test(tmp_path):
    """scripts/run's set-up makes .venv once (and says how to activate it); the test set-up then adds
    the extras into that same venv instead of rebuilding it; every later set-up is a no-op."""
    _copy_checkout(str(tmp_path))
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)

    def setup(*args):
        result = subprocess.run([str(tmp_path / "scripts" / "setup")] + list(args), env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                                timeout=600)
        assert result.returncode == 0, result.stdout
        return [line for line in result.stdout.splitlines() if line.startswith("scripts/setup:")]

    assert setup() == ["scripts/setup: made .venv; to put nsqd-threaded, nsqlookupd-threaded and its python "
                       "first on PATH: . .venv/bin/activate"]
    venv = tmp_path / ".venv"
    (venv / "kept").write_text("made by scripts/run's set-up")
    assert setup() == []
    assert setup("--test", "main") == ["scripts/setup: installing extras [snappy,spark,test] into .venv"]
    assert (venv / "kept").exists()
    assert subprocess.run([str(venv / "bin" / "python"), "-c", "import pytest, nsq, pyspark"],
                          timeout=120).returncode == 0
    assert setup("--test", "main") == []
    assert setup() == []  # scripts/run after scripts/test: the extras stay
    assert (venv / ".setup").read_text().splitlines()[1] == "snappy,spark,test"
