"""nsqadmin: the cluster's web UI and JSON API (Go nsqadmin 1.3's routes and field names), and a live
view inside one broker (``/nodes/<node>/inside``, drawn from the broker's ``GET /debug/state``).

::

    with NSQAdmin(http_address="127.0.0.1:0", lookupd_http_addresses=["127.0.0.1:4161"]) as admin:
        admin.http_url      # "http://127.0.0.1:41234"

An application of the package: it talks to brokers and lookupds over HTTP only
(:mod:`.cluster`), and serves on the broker's HTTP edge (:mod:`.http`).
"""

from .nsqadmin import NSQAdmin
from .options import AdminOptions

__all__ = ["NSQAdmin", "AdminOptions"]
