"""The connection a lookup uses for each bucket of a model: per thread, one raw redis-py
connection per node, and per model a table ``bucket -> connection`` (index ``BUCKETS``: the
node of the model's own hash tag). On a single Redis every entry is the thread's one
connection; on a cluster the table follows the client's slot map, and
:meth:`BucketConnections.refresh` re-reads that map (after a ``MOVED`` reply or a node that
stopped answering) and rebuilds the tables.

The connections are made with the client's pools' settings (timeouts, AUTH, TLS) but owned by
the lookup client: they never go back to a pool, so a thread's lookup pays no pool locking.

Examples
--------
>>> import redis  # doctest: +SKIP
>>> conns = BucketConnections(redis.Redis())  # doctest: +SKIP
>>> table = conns.table(ModelKeys("ns", "m"))  # doctest: +SKIP
>>> len(table), table[0] is table[BUCKETS]  # doctest: +SKIP
(1025, True)
"""

from __future__ import annotations

import os
import threading

from pipeline.serving.layout import BUCKETS, ModelKeys
from pipeline.serving.redis_client import is_cluster


class BucketConnections:
    """Per-thread connection tables of one lookup client (see the module docstring)."""

    def __init__(self, client):
        self.client = client
        self.cluster = is_cluster(client)
        self._local = threading.local()
        self._held: list = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._generation = 0

    def table(self, keys: ModelKeys) -> list:
        """This thread's connections for ``keys``' model, indexed by bucket (``BUCKETS``: the
        model tag's node)."""
        local = self._local
        if self._pid != os.getpid():  # forked: never share the parent's sockets
            self._forget()
            local = self._local
        if getattr(local, "generation", None) != self._generation:
            local.generation = self._generation
            local.tables = {}
            if not hasattr(local, "conns"):
                local.conns = {}
        table = local.tables.get(keys.model)
        if table is None:
            table = local.tables[keys.model] = self._build(keys, local.conns)
        return table

    def _build(self, keys: ModelKeys, conns: dict) -> list:
        if not self.cluster:
            return [self._conn(conns, "", self.client.connection_pool)] * (BUCKETS + 1)
        client = self.client
        table = []
        for route in [*keys.pointers, keys.current]:
            node = client.get_node_from_key(route)
            table.append(self._conn(conns, node.name,
                                    client.get_redis_connection(node).connection_pool))
        return table

    def _conn(self, conns: dict, name: str, pool):
        conn = conns.get(name)
        if conn is None:
            conn = conns[name] = pool.make_connection()
            with self._lock:
                self._held.append(conn)
        return conn

    def refresh(self) -> None:
        """Re-read the cluster's slot map (every thread rebuilds its tables on next use); on a
        single server only the tables are rebuilt. Raises what the cluster client raises when no
        node answers."""
        if self.cluster:
            self.client.nodes_manager.initialize()
        with self._lock:
            self._generation += 1

    def _forget(self) -> None:
        self._local = threading.local()
        self._held = []
        self._pid = os.getpid()

    def close(self) -> None:
        """Close every connection any thread of this client made."""
        with self._lock:
            for conn in self._held:
                conn.disconnect()
            self._held.clear()
        self._local = threading.local()
