"""nsqd-threaded: NSQ's nsqd 1.3 broker in pure Python, threaded, wire-compatible."""

from .server.nsqd import NSQD
from .settings.options import VERSION, Options

__version__ = VERSION
__all__ = ["NSQD", "Options", "__version__"]
