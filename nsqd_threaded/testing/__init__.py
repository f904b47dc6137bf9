"""Real brokers for test suites: in this process (:class:`Broker`) or as a child process (:class:`BrokerProcess`).

::

    from nsqd_threaded.testing import Broker

    with Broker("--msg-timeout=1s", mem_queue_size=100) as nsqd:
        nsqd.tcp_address            # ("127.0.0.1", 40213): the real ephemeral port
        nsqd.http_url               # "http://127.0.0.1:40214"
    # every broker thread joined, every socket and file closed, the data directory removed

A broker takes nsqd's own flags (Go spelling, ``--name=value`` or ``-name value``) as
positional arguments and :class:`~nsqd_threaded.settings.options.Options` fields as keyword arguments
(keywords win; a duration may be given as seconds or as a Go string such as ``"250ms"``).
Unless told otherwise it listens on ``127.0.0.1`` port 0 (TCP and HTTP) and keeps its data in
a new temporary directory that :meth:`~Broker.stop` removes.

Nothing here is module-global: any number of brokers of either kind can run at once.
"""

from .broker import Broker
from .cluster import Cluster
from .faults import FaultProxy
from .flags import resolve_options
from .forkserver import ForkServer
from .logs import LogBuffer
from .lookupd import Lookupd
from .loops import AsyncioLoop, TornadoLoop
from .process import BrokerProcess

__all__ = ["AsyncioLoop", "Broker", "BrokerProcess", "Cluster", "FaultProxy", "ForkServer", "Lookupd", "LogBuffer",
           "TornadoLoop", "resolve_options"]
