"""nsqlookupd, the NSQ lookup daemon, in the same threaded stdlib style as the broker.

:class:`NSQLookupd` runs one in this process; ``nsqlookupd-threaded`` (or
``python -m nsqd_threaded.lookupd``) runs one as a command.
"""

from .nsqlookupd import LookupdOptions, NSQLookupd

__all__ = ["LookupdOptions", "NSQLookupd"]
