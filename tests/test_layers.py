"""The package's layers: every import points down the stack (see docs/design.md)."""

import dataclasses

from nsqd_threaded import Options
from nsqd_threaded.lookupd import LookupdOptions
from nsqd_threaded.lookupd.options import SETTINGS as LOOKUPD_SETTINGS
from nsqd_threaded.settings.options import SETTINGS, field_problems

from support import layers


def test_every_module_has_a_layer():
    parts = {layers.part(m) for m in layers.modules()}
    assert parts <= set(layers.RANK), sorted(parts - set(layers.RANK))


def test_imports_point_down_the_stack():
    assert layers.violations() == []


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    """A module importing up the stack inside a function is caught, naming its line."""
    pkg = tmp_path / "nsqd_threaded"
    (pkg / "wire").mkdir(parents=True)
    (pkg / "server").mkdir()
    for d in (pkg, pkg / "wire", pkg / "server"):
        (d / "__init__.py").write_text("")
    (pkg / "server" / "nsqd.py").write_text("")
    (pkg / "wire" / "frames.py").write_text("import os\n\n\ndef f():\n    from ..server import nsqd\n")
    known = {"nsqd_threaded": "", "nsqd_threaded.wire": "", "nsqd_threaded.server": "",
             "nsqd_threaded.server.nsqd": "", "nsqd_threaded.wire.frames": ""}
    found = layers.imports("nsqd_threaded.wire.frames", str(pkg / "wire" / "frames.py"), known)
    assert found == [(5, "nsqd_threaded.server.nsqd")]
    assert layers.RANK[layers.part(found[0][1])] > layers.RANK["wire"]


def test_the_drawing_shows_every_part_and_no_upward_arrow():
    text = layers.drawing()
    for part in layers.RANK:
        if part != "admin":  # not written yet on every branch
            assert part in text
    for src, dsts in layers.part_edges().items():
        for dst in dsts:
            assert layers.RANK[dst] < layers.RANK[src], (src, dst)


def test_options_fields_are_the_settings_table():
    """Options and LookupdOptions declare exactly the table's fields, types and defaults, in its order."""
    assert field_problems(Options, SETTINGS) == []
    assert field_problems(LookupdOptions, LOOKUPD_SETTINGS) == []
    assert [f.name for f in dataclasses.fields(Options)] == [s.field for s in SETTINGS if s.field]
    assert [f.name for f in dataclasses.fields(LookupdOptions)] == [s.field for s in LOOKUPD_SETTINGS if s.field]
    defaults = Options()
    for s in SETTINGS:
        if s.field and s.factory is None:
            assert getattr(defaults, s.field) == (list(s.default) if isinstance(s.default, tuple) else s.default)


def test_a_disagreeing_options_class_is_refused():
    from nsqd_threaded.settings.options import options_class

    table = [s for s in SETTINGS if s.field][:2]

    class Swapped:
        pass

    Swapped.__annotations__ = {table[1].field: table[1].kind.type, table[0].field: table[0].kind.type}
    try:
        options_class(table)(Swapped)
    except TypeError as e:
        assert "disagrees with its settings table" in str(e)
    else:
        raise AssertionError("a class with the fields out of order was accepted")


def test_the_broker_core_touches_no_sockets():
    """broker/ and storage/ import no network module: the sockets are the server's."""
    import ast

    network = {"socket", "ssl", "select", "selectors", "socketserver", "http", "urllib.request"}
    for module, path in layers.modules().items():
        if layers.part(module) not in ("broker", "storage"):
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                assert name.split(".")[0] not in network and name not in network, "%s:%d imports %s" % (
                    path, node.lineno, name)
