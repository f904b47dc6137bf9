"""Runs scenarios one cluster at a time, each in a work directory and namespaces of its own."""

import atexit
import os
import shutil
import tempfile

from .cluster import Cluster
from .scenarios import SCENARIOS


class Runner:
    """Runs scenarios one cluster at a time and removes each cluster (and, at exit, anything left)."""

    def __init__(self, keep=False, log=print):
        self.keep = keep
        self.log = log
        self.root = tempfile.mkdtemp(prefix="nsqf-%d-" % os.getpid())
        self.prefix = os.path.basename(self.root) + "-"  # unique per runner, also within one process
        self.live = []  # clusters not yet closed
        self.counter = 0
        atexit.register(self.close)

    def run(self, scenario, impl, go_dir=None, short=True, minutes=None):
        self.counter += 1
        workdir = os.path.join(self.root, "%s-%s" % (scenario, impl))
        os.makedirs(workdir)
        # a namespace name must be unique per run and short: the prefix plus a counter
        cluster = Cluster(impl, go_dir, workdir, "%s%d-" % (self.prefix, self.counter), log=self.log)
        cluster.registration_host = "b1"
        self.live.append(cluster)
        self.log("%s (%s, %s)" % (scenario, impl, "short" if short else "full"))
        try:
            fn = SCENARIOS[scenario]
            result = fn(cluster, short, minutes) if scenario == "soak" else fn(cluster, short)
        finally:
            cluster.close()
            self.live.remove(cluster)
        result["workdir"] = workdir
        return result

    def close(self):
        for cluster in list(self.live):
            cluster.close()
        self.live = []
        if not self.keep and os.path.isdir(self.root):
            shutil.rmtree(self.root, ignore_errors=True)
