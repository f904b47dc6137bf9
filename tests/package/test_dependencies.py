"""The runtime dependencies are exactly sortedcontainers and click, as the installed metadata declares them."""

import re
from importlib import metadata


def runtime_requirements(distribution):
    """The names ``distribution`` requires outside any extra (markers other than extras still count)."""
    names = set()
    for requirement in metadata.requires(distribution) or ():
        if re.search(r"""\bextra\s*==""", requirement.partition(";")[2]):
            continue
        names.add(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0).lower().replace("_", "-"))
    return names


def test_runtime_dependencies_are_exactly_sortedcontainers_and_click():
    assert runtime_requirements("nsqd-threaded") == {"sortedcontainers", "click"}


def test_extras_are_not_runtime_dependencies():
    requires = metadata.requires("nsqd-threaded")
    assert any("extra ==" in r for r in requires)  # the test extra, at least, is declared
    assert all(r.startswith(("sortedcontainers", "click")) for r in requires if "extra" not in r)
