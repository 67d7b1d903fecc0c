"""Pipelines per node: what publishing, pointer moves and version deletion send, on a single
Redis and on Redis Cluster alike.

A cluster refuses a multi-key command whose keys lie in different slots, and redis-py's cluster
pipeline refuses ``MSET``/``MGET`` outright. So commands are routed here by the slot of a
*route key* (every key of one command shares its hash tag, see ``REDIS_LAYOUT.md``) to the
primary that owns the slot, and sent as one pipeline per node: every node's batch is written
before any reply is read, so the nodes work in parallel. On a single server everything goes to
its one connection pool.

Examples
--------
>>> import redis  # doctest: +SKIP
>>> batch = NodeBatch(redis.Redis())  # doctest: +SKIP
>>> batch.add("{ns:m:3}:current", "GET", "{ns:m:3}:current")  # doctest: +SKIP
>>> batch.execute()  # doctest: +SKIP
[b'7:0a1b2c3d:12']
"""

from __future__ import annotations

import numpy as np

from pipeline.serving.layout import BUCKETS, ModelKeys
from pipeline.serving.redis_client import is_cluster
from pipeline.serving.redis_wire import MsetWriter


def node_pool(client, route_key: str) -> tuple[str, object]:
    """(node name, connection pool) of the primary serving ``route_key``'s slot; the client's
    own pool (name ``""``) for a single server."""
    if not is_cluster(client):
        return "", client.connection_pool
    node = client.get_node_from_key(route_key)
    return node.name, client.get_redis_connection(node).connection_pool


class NodeBatch:
    """A non-transactional pipeline that routes each command by its route key (one pipeline
    per node). :meth:`execute` returns the replies in the order the commands were added, an
    error reply as its exception object (the caller decides), and raises on connection
    errors, after dropping the connections involved (replies may be unread)."""

    def __init__(self, client):
        self.client = client
        self.groups: dict[str, tuple[object, list[int], list[tuple]]] = {}
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def add(self, route_key: str, *command) -> None:
        name, pool = node_pool(self.client, route_key)
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = (pool, [], [])
        group[1].append(self.n)
        group[2].append(command)
        self.n += 1

    def execute(self) -> list:
        import redis

        out: list = [None] * self.n
        held = []
        try:
            for pool, _, commands in self.groups.values():
                conn = pool.get_connection()
                held.append((pool, conn))
                conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            for (pool, conn), (_, order, _) in zip(held, self.groups.values()):
                for i in order:
                    try:
                        out[i] = conn.read_response()
                    except redis.ResponseError as err:   # the reply was read: go on
                        out[i] = err
        except BaseException:
            for _, conn in held:
                conn.disconnect()
            raise
        finally:
            for pool, conn in held:
                pool.release(conn)
            self.groups, self.n = {}, 0
        return out


class ShardWriter:
    """``MSET`` writer for one version of one model: model-level keys go to the node of the
    model's tag; per-key keys are collected per bucket and written as one ``MSET`` per bucket
    (one slot) on the node that owns it, one pipelined connection (:class:`MsetWriter`) per
    node. On a single server all keys go through one :class:`MsetWriter`, many buckets per
    ``MSET``."""

    def __init__(self, client, keys: ModelKeys, flush_bytes: int = 8 << 20,
                 mset_keys: int = 1000):
        self.cluster = is_cluster(client)
        self.flush_bytes = flush_bytes
        self.writers: dict[str, MsetWriter] = {}
        try:
            if not self.cluster:
                single = MsetWriter(client, mset_keys=mset_keys)
                self.writers[""] = single
                self.model_writer = single
                self.bucket_writers = [single] * BUCKETS
                return
            by_pool: dict[str, MsetWriter] = {}
            self.writers = by_pool    # closed on failure, also half-built

            def writer(route_key: str) -> MsetWriter:
                name, pool = node_pool(client, route_key)
                if name not in by_pool:   # each node gets its own share of the bytes
                    by_pool[name] = MsetWriter(pool, mset_keys=mset_keys)
                return by_pool[name]

            self.model_writer = writer(keys.current)
            self.bucket_writers = [writer(keys.pointer(b)) for b in range(BUCKETS)]
        except BaseException:
            self.close(failed=True)
            raise
        self.buffers: list[tuple[list, list]] = [([], []) for _ in range(BUCKETS)]
        self.buffered = 0

    @property
    def n_keys(self) -> int:
        return sum(w.n_keys for w in self.writers.values())

    def set(self, key: str, value) -> None:
        """One model-level key."""
        self.model_writer.set(key, value)

    def set_in(self, bucket: int, key: str, value) -> None:
        """One key of ``bucket``."""
        self.bucket_writers[bucket].set(key, value)

    def mset_buckets(self, keys: list[str], values: list, buckets) -> None:
        """Per-key keys with their buckets (``buckets[i]`` is the bucket of ``keys[i]``)."""
        if not self.cluster:
            self.model_writer.mset(keys, values)
            return
        buffers = self.buffers
        size = 0
        for key, value, b in zip(keys, values, np.asarray(buckets).tolist()):
            buf = buffers[b]
            buf[0].append(key)
            buf[1].append(value)
            size += len(value)
        self.buffered += size + 40 * len(keys)
        if self.buffered >= self.flush_bytes:
            self._drain()

    def _drain(self) -> None:
        if self.cluster:
            for b, (ks, vs) in enumerate(self.buffers):
                if ks:
                    self.bucket_writers[b].mset(ks, vs)
                    self.buffers[b] = ([], [])
            self.buffered = 0
        for w in self.writers.values():
            w.flush()

    def finish(self) -> None:
        """Write everything buffered and read every reply."""
        self._drain()
        for w in self.writers.values():
            w.finish()

    def close(self, failed: bool = False) -> None:
        for w in self.writers.values():
            w.close(failed)
        self.writers = {}

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)
