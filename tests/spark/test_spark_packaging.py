"""The spark extra stays optional: the core never imports pyspark (runs without the extra)."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


def test_importing_the_package_and_its_client_never_imports_pyspark():
    code = ("import sys, nsqd_threaded, nsqd_threaded.client, nsqd_threaded.testing, nsqd_threaded.cli; "
            "assert not [m for m in sys.modules if m.startswith(('pyspark', 'pyarrow', 'nsqd_threaded.spark'))]")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=50)


def test_the_spark_extra_names_pyspark_4_and_pyarrow():
    import configparser
    import os

    import nsqd_threaded

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(nsqd_threaded.__file__))), "setup.cfg"))
    extra = cfg["options.extras_require"]["spark"].split()
    assert extra == ["pyspark>=4.0", "pyarrow"]
    assert cfg["options"]["install_requires"].split() == ["sortedcontainers>=2.1", "click>=7.1"]
