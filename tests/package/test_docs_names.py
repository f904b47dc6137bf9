"""Every dotted code name the README and docs/ write in backticks names something that exists.

Names are resolved by what they name, never by file path, so that modules may move between
packages: ``Class.member`` is looked up in every class of that name anywhere in nsqd_threaded
(methods, class attributes, ``self.x = ...`` in any method, ``__slots__``, annotated fields),
``module.name`` in every module of that short name, ``nsqd_threaded.a.b.Name`` by its last
module's short name, and ``variable.member`` (``consumer.rdy``, ``lookupd.db``) in the classes whose
name ends with the variable's (``Consumer``, ``NSQLookupd``).  The package is read with ``ast``,
nothing is imported from it (the spark modules need pyspark).

Names that are not ours are recognised by a rule, not listed one by one:

* Go's names: inside a ``**Go:**`` paragraph, in a table column whose header says Go, in a
  sentence that begins with "Go" / "Go's", or at most three words after "Go" / "Go's"
  (``(*Topic).messagePump`` is not a dotted name to begin with);
* file names (``nsqd.dat``, ``topic.go``, ``tour_wire.py``);
* the kernel's settings: sysctl keys (``net.core.somaxconn``, ``kernel.pid_max``) and cgroup
  files (``pids.max``);
* the standard library's and the few third-party libraries' (checked for real when importable).
"""

import ast
import collections
import glob
import importlib
import os
import re
import sys
import threading

import pytest

import nsqd_threaded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(nsqd_threaded.__file__)))
PACKAGE = os.path.join(ROOT, "nsqd_threaded")

DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?")
FILE_EXTENSIONS = {"py", "go", "md", "dat", "db", "cfg", "toml", "json", "txt", "pyz", "sh", "service", "log"}
GO_SENTENCE = re.compile(r"\s*(?:In |As |Unlike )?Go(?:'s)?\b")  # a sentence about Go: "Go's `clientV2` keeps a `net.Conn`"
GO_NEAR = re.compile(r"\bGo(?:'s)?(?:\s+\S+){0,3}\s*$")  # "as Go's failed `io.ReadFull`"

# Not ours, and not a module to import: builtin and library classes the docs name by class.
LIBRARY_CLASSES = {
    "bytes": bytes,
    "deque": collections.deque,
    "Condition": threading.Condition,
}
THIRD_PARTY_MODULES = {"nsq", "tornado", "pyspark", "pyarrow", "sortedcontainers", "click"}
# Objects of other libraries that the docs name through a variable, with where they come from.
OTHER_VARIABLES = {
    "spark": "a pyspark SparkSession",
    "df": "a pyspark DataFrame",
    "query": "a pyspark StreamingQuery",
    "mem": "the /stats JSON's memory section (mem.heap_objects, ...): JSON keys, not Python",
}
SORTED_CONTAINERS = {"SortedList"}
# The kernel's names: sysctl keys and cgroup interface files (not code; nothing to resolve).
KERNEL_SETTINGS = re.compile(r"(?:kernel|net|vm|fs)\.\w+(?:\.\w+)*|(?:pids|memory|cpu)\.\w+")


# -- the package's names (ast) ------------------------------------------------------------


class Index:
    def __init__(self):
        self.modules = collections.defaultdict(list)  # short name -> [set of top-level names]
        self.classes = collections.defaultdict(list)  # class name -> [set of member names]
        for dirpath, _, files in os.walk(PACKAGE):
            for name in files:
                if name.endswith(".py"):
                    self._read(os.path.join(dirpath, name))

    def _read(self, path):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
        short = rel[-2] if rel[-1] == "__init__" else rel[-1]
        top = set()
        for node in tree.body:
            top.update(_defined_names(node))
            if isinstance(node, ast.ClassDef):
                self._read_class(node)
        # A package's short name also has its submodules.
        if rel[-1] == "__init__":
            top.update(n[:-3] if n.endswith(".py") else n for n in os.listdir(os.path.dirname(path)))
        self.modules[short].append(top)

    def _read_class(self, node):
        members = set()
        for item in node.body:
            members.update(_defined_names(item))
            if isinstance(item, ast.ClassDef):
                self._read_class(item)
            if isinstance(item, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                    for t in item.targets):
                if isinstance(item.value, (ast.Tuple, ast.List)):
                    members.update(e.value for e in item.value.elts if isinstance(e, ast.Constant))
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(item):
                    targets = []
                    if isinstance(sub, ast.Assign):
                        targets = sub.targets
                    elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
                        targets = [sub.target]
                    for t in targets:
                        for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                            if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                                members.add(e.attr)
        bases = {b.id for b in node.bases if isinstance(b, ast.Name)} | {
            b.attr for b in node.bases if isinstance(b, ast.Attribute)}
        self.classes[node.name].append((members, bases))

    def class_members(self, name, seen=None):
        """Every member of every class called ``name``, with its bases' (ours) members."""
        seen = seen if seen is not None else set()
        if name in seen:
            return set()
        seen.add(name)
        out = set()
        for members, bases in self.classes.get(name, []):
            out |= members
            for base in bases:
                out |= self.class_members(base, seen)
        return out

    def module_names(self, short):
        out = set()
        for names in self.modules.get(short, []):
            out |= names
        return out


def _defined_names(node):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.If, ast.Try)):  # names defined under `if`/`try` at module level
        out = set()
        for child in ast.iter_child_nodes(node):
            out |= _defined_names(child)
        return out
    if isinstance(node, ast.ExceptHandler):
        out = set()
        for child in node.body:
            out |= _defined_names(child)
        return out
    return set()


INDEX = Index()


def resolves(name):
    """Whether ``name`` (``a.b`` or ``a.b.c``, no ``()``) names something in the package."""
    parts = name.split(".")
    if parts[0] == "nsqd_threaded":
        parts = parts[1:]
        # Skip the subpackage path: the last component that is a module's short name carries on.
        for i in range(len(parts) - 1, -1, -1):
            if parts[i] in INDEX.modules:
                return i == len(parts) - 1 or _in_module(parts[i], parts[i + 1:])
        return False
    head, rest = parts[0], parts[1:]
    if head in OUTSIDE_PACKAGE:  # tests' helpers and the benchmarks, named as they are imported
        return _in_outside_package(OUTSIDE_PACKAGE[head], rest)
    if head in INDEX.modules and _in_module(head, rest):
        return True
    if head in INDEX.classes and _in_class(head, rest):
        return True
    # A variable holding one of ours: `consumer.rdy`, `lookupd.db`, `message.enable_async()`.
    for cls in INDEX.classes:
        if cls.lower().endswith(head.lower().lstrip("_")) and _in_class(cls, rest):
            return True
    # A private attribute holding a library object: `_backlog_ready.notify_all()`.
    if head.startswith("_") and any(head in INDEX.class_members(c) for c in INDEX.classes):
        return True
    return False


# Packages of this repository outside nsqd_threaded, by the name they are imported under.
OUTSIDE_PACKAGE = {"support": ("tests", "support"), "benchmarks": ("scripts", "benchmarks"), "faultlib": ("scripts", "faultlib")}


def _in_outside_package(folder, rest):
    path = os.path.join(ROOT, *folder, rest[0] + ".py")
    if not os.path.exists(path):
        return False
    if len(rest) == 1:
        return True
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    return any(rest[1] in _defined_names(node) for node in tree.body)


def _in_module(short, rest):
    names = INDEX.module_names(short)
    if rest[0] not in names:
        return False
    return len(rest) == 1 or rest[0] not in INDEX.classes or _in_class(rest[0], rest[1:])


def _in_class(cls, rest):
    return rest[0] in INDEX.class_members(cls)


def not_ours_but_real(name):
    """Whether ``name`` is a library's (standard or third-party) and exists there; None when
    the head is not a library this rule knows."""
    parts = name.split(".")
    head = parts[0]
    if head in OTHER_VARIABLES or KERNEL_SETTINGS.fullmatch(name):
        return True
    if head in LIBRARY_CLASSES:
        return hasattr(LIBRARY_CLASSES[head], parts[1])
    if head in SORTED_CONTAINERS:
        sortedcontainers = pytest.importorskip("sortedcontainers")
        return hasattr(getattr(sortedcontainers, head), parts[1])
    stdlib = getattr(sys, "stdlib_module_names", None)
    is_stdlib = head in stdlib if stdlib is not None else _importable_outside_package(head)
    if not is_stdlib and head not in THIRD_PARTY_MODULES:
        return None
    try:
        obj = importlib.import_module(head)
    except ImportError:
        return head in THIRD_PARTY_MODULES  # e.g. pyspark, not installed on this runtime
    for i, part in enumerate(parts[1:], 1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ImportError:
            # CPython-only names (`sys.getallocatedblocks`, `gc.callbacks`) are checked on CPython.
            return sys.implementation.name != "cpython" and head not in THIRD_PARTY_MODULES
    return True


def _importable_outside_package(head):
    try:
        module = importlib.import_module(head)
    except ImportError:
        return False
    return not getattr(module, "__file__", "").startswith(PACKAGE)


# -- the docs' names, with their context ---------------------------------------------------


def doc_files():
    return [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def doc_names(path):
    """``(name, line number, is_go_context)`` of every dotted name in backticks outside code blocks."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    in_fence = False
    go_paragraph = False
    sentence = ""  # the current sentence's text so far (prose spans lines)
    go_columns = set()
    table_header = None
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if not line.strip():
            go_paragraph = False
            sentence = ""
        elif line.startswith("**Go"):
            go_paragraph = True
        elif line.startswith("**"):
            go_paragraph = False
        if line.startswith("|"):
            cells = line.strip().strip("|").split("|")
            if table_header is None:
                table_header = cells
                go_columns = {i for i, c in enumerate(cells) if re.search(r"\bGo\b", c)}
            for column, text in enumerate(cells):
                for m in re.finditer(r"`([^`]+)`", text):
                    before = re.split(r"[.!?]\s", text[: m.start()])[-1]
                    go = column in go_columns or bool(GO_SENTENCE.match(before) or GO_NEAR.search(before))
                    out.append((m.group(1), number, go))
            continue
        table_header = None
        go_columns = set()
        start = len(sentence) + 1
        sentence = sentence + " " + line
        for m in re.finditer(r"`([^`]+)`", line):
            before = sentence[: start + m.start()]
            before = re.split(r"[.!?]\s", before)[-1]  # this sentence only
            go = go_paragraph or bool(GO_SENTENCE.match(before) or GO_NEAR.search(before))
            out.append((m.group(1), number, go))
    return [(span, number, go) for span, number, go in out if DOTTED.fullmatch(span)]


def checked_names():
    for path in doc_files():
        for span, number, go in doc_names(path):
            yield os.path.relpath(path, ROOT), number, span, go


def test_the_docs_name_dotted_code_names():
    """The extraction finds names (a broken regex would make the next test pass on nothing)."""
    names = {span for _, _, span, _ in checked_names()}
    assert {"Topic.publish", "Channel._waiting", "Client.identify"} <= names
    assert len(names) > 100


def test_every_dotted_name_in_the_docs_exists():
    stale = []
    for path, number, span, go in checked_names():
        name = span[:-2] if span.endswith("()") else span
        if go:
            continue  # Go's own name
        if name.rsplit(".", 1)[1] in FILE_EXTENSIONS:
            continue  # a file name
        if resolves(name):
            continue
        verdict = not_ours_but_real(name)
        if verdict:
            continue
        stale.append("%s:%d: `%s`%s" % (path, number, span, " (not in that library)" if verdict is False else ""))
    assert not stale, "names in the docs that exist nowhere:\n" + "\n".join(stale)


def test_the_resolver_finds_stale_names():
    """The rules reject names that do not exist (the test above cannot pass on a resolver that
    accepts everything)."""
    for name in ["Client.apply_identify", "ProtocolV2._commands", "Topic.no_such_member",
                 "nsqd_threaded.broker.no_such_module", "protocol.no_such_function", "consumer.no_such_attribute"]:
        assert not resolves(name), name
    if sys.implementation.name == "cpython":
        assert not_ours_but_real("threading.NoSuchThing") is False
        assert not_ours_but_real("time.Now") is False  # Go's name outside a Go context is caught
    for name in ["Channel._waiting", "Client.identify", "Message.encode", "nsqd_threaded.testing.Broker",
                 "consumer.rdy", "lookupd.db", "message.from_records", "LookupPeer._sock_lock"]:
        assert resolves(name), name
