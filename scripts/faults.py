#!/usr/bin/env python3
"""The fault harness's command: ``scripts/faults.py --scenario NAME [--short] [--go DIR] [--report]``.

The harness itself is the package ``faultlib`` beside this file (its docstring says what it does);
the clients it starts inside the hosts run this same file in a client mode (``faults.py _producer``)."""

import os
import sys

# scripts/ is not installed: the package is found beside this file.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from faultlib.cli import main  # noqa: E402 - after the path is set

if __name__ == "__main__":
    sys.exit(main() or 0)
