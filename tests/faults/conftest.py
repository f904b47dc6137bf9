"""The fault tests import the harness's package, scripts/faultlib, which is not installed: scripts/ goes
on sys.path here, as scripts/faults.py puts it there for itself."""

import os
import sys

import nsqd_threaded

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(nsqd_threaded.__file__))), "scripts")
if SCRIPTS not in sys.path:
    sys.path.insert(0, SCRIPTS)
