"""The benchmarks: ``scripts/bench [NAME] ...`` (``python -m benchmarks`` with ``scripts/`` on the path).

Layers, each importing only those below it:

* ``common``: broker child processes, /proc readings (listening port, CPU time,
  load average), the worker-process launcher;
* the loads and probes: ``writer``, ``reader``, ``roundtrip``, ``memory``, ``floor``;
* ``tools`` (Go's load tools or ours behind one interface) and the standalone
  benchmarks (``apps``, ``connections``, ``drain``, ``features``, ``fixture``, ``policies``,
  ``snappy``, ``spark``);
* ``compare`` (Go nsqd and ours side by side), then ``cli`` (the default table and
  the dispatch to the others).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:  # the project's package, whatever the working directory
    sys.path.insert(1, ROOT)
