"""How a lookup reaches Redis: round trips on this thread's connection to the node that serves
a bucket (:class:`~pipeline.serving.bucket_connections.BucketConnections`), a batch in one
round trip per node, and what a failure means.

A dropped connection (e.g. after a Redis restart) or, on a cluster, a ``MOVED`` reply or a
node that stopped answering refreshes the connections and is tried once more; a server that is
gone, slower than the timeout or failing over raises :class:`Down`, for the caller's failure
policy. A timeout is never retried at once: the caller's latency budget is spent. Every round
trip that gets its replies is reported to the client's circuit breaker
(:class:`~pipeline.serving.fallback.Breaker`), whose window weighs the failures against them.
"""

from __future__ import annotations

from pipeline.serving.bucket_connections import BucketConnections
from pipeline.serving.layout import ModelKeys
from pipeline.serving.redis_client import (
    as_client,
    client_from_url,
    is_cluster,
    server_is_cluster,
    split_cluster_flag,
)
from pipeline.serving.redis_wire import round_trip, round_trips
from pipeline.settings import redact


class Down(Exception):
    """Redis did not answer (gone, slow, failing over); ``err`` is what was raised."""

    def __init__(self, err):
        super().__init__(str(err))
        self.err = err


class Transport:
    """The connections of one lookup client.

    ``client`` answers lookups (``timeout``), ``bulk`` reads a new version's item ids,
    factors and scorer (``load_timeout``: bigger values); ``where`` names the server in
    messages, without a password; ``breaker`` (optional) hears of every round trip that got
    its replies.
    """

    def __init__(self, redis, *, timeout: float, load_timeout: float, breaker=None):
        self.breaker = breaker
        if isinstance(redis, str):
            url, cluster = split_cluster_flag(redis)
            if cluster is None:   # ask the server once, for both clients
                cluster = server_is_cluster(url, timeout)
            self.client = client_from_url(url, timeout=timeout, cluster=cluster)
            self.bulk = client_from_url(url, timeout=load_timeout, cluster=cluster)
            self.where = redact(redis)
        else:
            self.client = self.bulk = as_client(redis)
            self.where = _describe(self.client)
        self.connections = BucketConnections(self.client)
        self.cluster = is_cluster(self.client)

    def send(self, keys: ModelKeys, bucket: int, commands: list[tuple]) -> list:
        """:func:`~pipeline.serving.redis_wire.round_trip` on this thread's connection to the
        node serving ``bucket`` of ``keys``' model (``BUCKETS``: the model tag)."""
        for attempt in (0, 1):
            try:
                replies = round_trip(self.connections.table(keys)[bucket], commands)
            except Exception as err:
                self._retry_or_raise(err, attempt)
                continue
            if self.breaker is not None:
                self.breaker.success()
            return replies

    def send_many(self, keys: ModelKeys, commands: list[tuple[int, tuple]]) -> list:
        """``(bucket, command)`` pairs in one round trip per node, all nodes at once; replies
        in order."""
        for attempt in (0, 1):
            table = self.connections.table(keys)
            groups: dict[int, tuple] = {}
            for i, (bucket, command) in enumerate(commands):
                conn = table[bucket]
                group = groups.get(id(conn))
                if group is None:
                    group = groups[id(conn)] = (conn, [], [])
                group[1].append(i)
                group[2].append(command)
            try:
                replies = round_trips([(conn, cmds) for conn, _, cmds in groups.values()])
            except Exception as err:
                self._retry_or_raise(err, attempt)
                continue
            if self.breaker is not None:
                self.breaker.success()
            out: list = [None] * len(commands)
            for (_, order, _), got in zip(groups.values(), replies):
                for i, reply in zip(order, got):
                    out[i] = reply
            return out

    def bucket_mget(self, st, buckets: list[int], names: list[str], per: int = 1,
                    extra: list[tuple[int, tuple]] = ()) -> tuple[list, list, list]:
        """Read ``names`` (``per`` consecutive keys for each item; item ``i``'s keys lie in
        bucket ``buckets[i]``) with the pointer of every bucket involved, in one round trip:
        (pointer values, the values in the order of ``names``, replies of the ``extra``
        commands). A single Redis gets one ``MGET`` (atomic over all of it); a cluster one
        ``MGET`` per bucket (its pointer and keys share a slot), pipelined per node. ``st`` is
        the :class:`~pipeline.serving.version_cache.VersionState` whose pointers are read."""
        ptr_keys = st.pointer_keys
        if not self.cluster:
            distinct = list(dict.fromkeys(buckets))
            n = len(distinct)
            command = ("MGET", *[ptr_keys[b] for b in distinct], *names)
            if not extra:
                reply = self.send(st.keys, 0, [command])[0]
                return reply[:n], reply[n:], []
            replies = self.send(st.keys, 0, [*(c for _, c in extra), command])
            return replies[-1][:n], replies[-1][n:], replies[:-1]
        rows_of: dict[int, list[int]] = {}
        for i, b in enumerate(buckets):
            rows = rows_of.get(b)
            if rows is None:
                rows_of[b] = [i]
            else:
                rows.append(i)
        commands = list(extra)
        for b, rows in rows_of.items():
            commands.append((b, ("MGET", ptr_keys[b],
                                 *[names[j] for i in rows for j in range(i * per, i * per + per)])))
        replies = self.send_many(st.keys, commands)
        pointers = []
        values: list = [None] * len(names)
        for rows, reply in zip(rows_of.values(), replies[len(extra):]):
            pointers.append(reply[0])
            at = 1
            for i in rows:
                values[i * per:i * per + per] = reply[at:at + per]
                at += per
        return pointers, values, replies[:len(extra)]

    def _retry_or_raise(self, err: Exception, attempt: int) -> None:
        """Return to try again, or raise: :class:`Down` for a server that is gone, slow or
        (cluster) failing over; the error itself otherwise. On a cluster every such failure
        re-reads the slot map first (a timeout too: a primary cut off by the network is
        failed over like a dead one, and the next attempt after the retry interval must go to
        its replica)."""
        import redis
        from redis.exceptions import AskError, ClusterDownError, TryAgainError

        if isinstance(err, (AskError, TryAgainError)):   # MOVED/ASK: the slot map changed
            self._refresh_connections(err)
            if attempt:
                raise Down(err) from err
        elif isinstance(err, ClusterDownError):
            raise Down(err) from err
        elif isinstance(err, (redis.ResponseError, redis.AuthenticationError)):
            raise err
        elif isinstance(err, (redis.ConnectionError, redis.TimeoutError, OSError)):
            if self.cluster:
                self._refresh_connections(err)
            if attempt or isinstance(err, redis.TimeoutError):
                raise Down(err) from err
        else:
            raise err

    def _refresh_connections(self, err: Exception) -> None:
        try:
            self.connections.refresh()
        except Exception as failed:   # no node answers
            raise Down(failed) from err

    def close(self) -> None:
        self.connections.close()
        self.client.close()
        if self.bulk is not self.client:
            self.bulk.close()


def _describe(client) -> str:
    """Where a given client connects, for messages (no password)."""
    if is_cluster(client):
        node = client.get_default_node()
        return f"cluster node {node.host}:{node.port}" if node else "a cluster"
    kw = client.connection_pool.connection_kwargs
    return kw.get("path") or f"{kw.get('host')}:{kw.get('port')}"
