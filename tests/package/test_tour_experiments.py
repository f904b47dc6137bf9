"""docs/tour.md's experiments, run as written: each prints what the tour says it prints.

The tour's first Python block is the helper module ``tour_wire.py``; every
later Python block is an experiment, followed by a ``text`` block with its
output.  Each experiment runs in its own interpreter (as a reader runs it),
with a real broker on 127.0.0.1 and kernel-chosen ports; it waits on socket
reads (10 s timeouts) and polls with deadlines, never on bare sleeps.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
TOUR = ROOT / "docs" / "tour.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)


def _experiments():
    blocks = BLOCK.findall(TOUR.read_text(encoding="utf-8"))
    helper = None
    experiments = []
    for i, (lang, code) in enumerate(blocks):
        if lang != "python":
            continue
        if helper is None:
            helper = code
            continue
        following = blocks[i + 1] if i + 1 < len(blocks) else ("", "")
        assert following[0] == "text", "an experiment without its output block:\n" + code
        experiments.append((code, following[1]))
    return helper, experiments


HELPER, EXPERIMENTS = _experiments()


def test_tour_has_its_seven_stops():
    assert "def wait_for" in HELPER
    assert len(EXPERIMENTS) == 7


@pytest.mark.timeout(90)
@pytest.mark.parametrize("stop", range(1, len(EXPERIMENTS) + 1))
def test_experiment_prints_what_the_tour_says(stop, tmp_path):
    code, expected = EXPERIMENTS[stop - 1]
    (tmp_path / "tour_wire.py").write_text(HELPER)
    script = tmp_path / ("stop%d.py" % stop)
    script.write_text(code)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=str(tmp_path),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=80,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
