"""The package's layers, its import graph read with ``ast``, and the drawing docs/design.md shows.

Each top-level part of ``nsqd_threaded`` (a subpackage or a module) has a rank;
a module may import its own part and any part of a lower rank, nothing above
and nothing beside it.  :func:`violations` lists the imports that break this
(function-level imports included); :func:`drawing` renders the graph between
parts, which docs/design.md shows.
"""

import ast
import os

PACKAGE = "nsqd_threaded"
ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), PACKAGE)

# The stack, bottom first: (rank, parts, what the layer is).
LAYERS = [
    (0, ["internal"], "Go compatibility, the log format, the one HTTP client"),
    (1, ["wire"], "frames, commands, the message record, transports, codecs, protocol V1"),
    (2, ["settings"], "the settings table, Options, config files"),
    (3, ["storage"], "backends, the disk queue, nsqd.dat"),
    (4, ["broker"], "Topic, Channel, Client state, the scanner, stats, auth checks: no sockets"),
    (5, ["server"], "connections, protocol V2 commands, listeners, HTTP API, the NSQD daemon"),
    (6, ["command", "client"], "the app shell every command runs in; the synchronous client"),
    (7, ["cli", "lookupd", "spark", "tools"], "the nsqd command; nsqlookupd; the Spark data source; the operator tools"),
    (8, ["testing", "admin"], "test brokers and clusters; nsqadmin"),
    (9, ["pytest_plugin", "__main__", "__init__"], "the pytest fixtures; python -m; the package's names"),
]
RANK = {part: rank for rank, parts, _ in LAYERS for part in parts}


def modules():
    """``{dotted module name: file path}`` for every module of the package."""
    found = {}
    for dirpath, dirnames, files in os.walk(ROOT):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
            if rel.endswith(".__init__"):
                rel = rel[: -len(".__init__")]
            found[rel] = path
    return found


def part(module):
    """The top-level part a module belongs to (``nsqd_threaded.wire.protocol_v2`` -> ``wire``)."""
    if module == PACKAGE:
        return "__init__"
    return module.split(".")[1]


def imports(module, path, known):
    """``[(line, target module)]``: every import of the package by ``module``, at any depth."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    is_package = path.endswith("__init__.py")
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == PACKAGE or target.startswith(PACKAGE + ".")):
                continue
            for alias in node.names:
                sub = target + "." + alias.name
                found.append((node.lineno, sub if sub in known else target))
    return found


def graph():
    """``[(module, line, target)]`` for every import inside the package."""
    known = modules()
    edges = []
    for module, path in known.items():
        for line, target in imports(module, path, known):
            edges.append((module, line, target))
    return edges


def violations():
    """The imports that run up the stack or sideways, as ``path:line: module imports target (why)``."""
    known = modules()
    found = []
    for module, line, target in graph():
        src, dst = part(module), part(target)
        if src == dst:
            continue
        if src not in RANK or dst not in RANK:
            found.append("%s:%d: %s imports %s (%s has no layer)"
                         % (known[module], line, module, target, src if src not in RANK else dst))
        elif RANK[dst] >= RANK[src]:
            how = "sideways" if RANK[dst] == RANK[src] else "up the stack"
            found.append("%s:%d: %s imports %s (%s, rank %d -> %d)"
                         % (os.path.relpath(known[module], os.path.dirname(ROOT)), line, module, target, how,
                            RANK[src], RANK[dst]))
    return found


def part_edges():
    """``{part: sorted parts it imports}`` (its own part left out)."""
    edges = {}
    for module, _, target in graph():
        src, dst = part(module), part(target)
        if src != dst:
            edges.setdefault(src, set()).add(dst)
    return {src: sorted(dsts, key=lambda p: (-RANK.get(p, -1), p)) for src, dsts in edges.items()}


def drawing():
    """The layer diagram, top layer first: each part's arrows go to the parts it imports, all lower."""
    edges = part_edges()
    lines = []
    for rank, parts, what in reversed(LAYERS):
        lines.append("%d  %s: %s" % (rank, ", ".join(parts), what))
        width = max(len(p) for p in parts)
        for p in parts:
            if edges.get(p):
                lines.append("     %-*s ─▶ %s" % (width, p, ", ".join(edges[p])))
    return "\n".join(lines)


if __name__ == "__main__":
    print(drawing())
