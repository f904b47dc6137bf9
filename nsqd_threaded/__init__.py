"""nsqd-threaded: NSQ's nsqd 1.3 broker in pure Python, threaded, wire-compatible.

``NSQD`` is imported on first use (PEP 562): importing one subpackage, such as the
client or the Spark source in a freshly started Spark Python worker, does not load
the whole broker with it.
"""

from .settings.options import VERSION, Options

__version__ = VERSION
__all__ = ["NSQD", "Options", "__version__"]


def __getattr__(name):
    if name == "NSQD":
        from .server.nsqd import NSQD

        return NSQD
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
