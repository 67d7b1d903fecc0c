"""Raw RESP on one redis-py connection: the two hot paths of serving go through here.

Why not redis-py's ``Pipeline`` or ``Redis.mget``: each builds Python objects per command and
per reply (a pipeline object, command stacks, response callbacks). A steady-state lookup is
one ``MGET`` whose whole cost is about 50 µs; that overhead would be most of it. So the lookup
client writes the packed command itself and reads the replies on a connection it owns
(:func:`round_trip`), and the publisher packs ``MSET`` commands with hiredis straight into the
wire format and sends them in large writes (:class:`MsetWriter`). Everything else (scripts,
meta hashes, version lists) uses the ordinary client API.
"""

from __future__ import annotations


def round_trip(conn, commands: list[tuple]) -> list:
    """Send ``commands`` in one write on ``conn`` and read their replies (one round trip).

    On any error the connection is dropped (replies may be left unread) and the error is
    raised: the caller decides about retries.
    """
    try:
        if len(commands) == 1:
            conn.send_command(*commands[0], check_health=False)
        else:
            conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        return [conn.read_response() for _ in commands]
    except BaseException:
        conn.disconnect()
        raise


def round_trips(batches: list[tuple]) -> list[list]:
    """:func:`round_trip` on several connections at once: every ``(conn, commands)`` batch is
    sent before any reply is read (the servers work in parallel); replies per batch. On any
    error every connection involved is dropped and the error raised."""
    try:
        for conn, commands in batches:
            conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        return [[conn.read_response() for _ in commands] for conn, commands in batches]
    except BaseException:
        for conn, _ in batches:
            conn.disconnect()
        raise


SEND_BYTES = 4 << 10    # bytes a round of pipelined MSETs (see MsetWriter)


class MsetWriter:
    """Sends ``MSET`` commands of at most ``mset_keys`` keys and ``mset_bytes`` bytes (one key
    alone may be more), so the server never blocks other clients for long: Redis runs one
    command at a time, so the time of the longest command is added to a lookup that arrives
    during it (``bench/publish_load.py`` reports the slowest ones). Packed by hiredis (no
    per-argument Python work) and sent in rounds of ``send_bytes`` like a non-transactional
    pipeline; the replies of one round are read just before the next one is sent (and by
    :meth:`finish`), so the server works through a round while the caller prepares the next.

    A round is small (:data:`SEND_BYTES`) because Redis 7 reads as much of one client's
    pipeline as its grown query buffer holds and runs every command in it before it serves
    another client: rounds of 8 MiB put the p99 of lookups beside a publish at 6-9x idle on
    two cores, rounds of 16 KiB at 2-3x, for about 15% less publish throughput; 4 KiB makes a
    round one ``MSET`` of per-user values (with the publish at batch niceness, 1.5-2.1x).

    Use it as a context manager: the connection goes back to its pool, or is dropped after an
    error (replies may be unread). ``client`` is a redis-py client or a connection pool (one
    node of a cluster: every key of one ``MSET`` must then be in one slot, which the caller
    arranges).
    """

    def __init__(self, client, send_bytes: int = SEND_BYTES, mset_keys: int = 1000,
                 mset_bytes: int = 1 << 20):
        self.pool = getattr(client, "connection_pool", client)
        self.conn = self.pool.get_connection()
        try:
            from hiredis import pack_command
        except ImportError:  # plain redis-py packing
            pack_command = self.conn.pack_command
        self.pack = pack_command
        self.send_bytes = send_bytes
        self.mset_keys = mset_keys
        self.mset_bytes = mset_bytes
        self.chunks: list = []
        self.n_cmds = 0
        self.unread = 0
        self.pending = 0
        self.n_keys = 0

    def mset(self, keys: list[str], values: list) -> None:
        for i in range(0, len(keys), self.mset_keys):
            self._mset(keys[i:i + self.mset_keys], values[i:i + self.mset_keys])

    def _mset(self, ks: list[str], vs: list) -> None:
        """One ``MSET``, or halves of it while it packs to over ``mset_bytes``."""
        args: list = [None] * (2 * len(ks) + 1)
        args[0] = "MSET"
        args[1::2] = ks
        args[2::2] = vs
        packed = self.pack(tuple(args))
        size = len(packed) if isinstance(packed, bytes) else sum(map(len, packed))
        if size > self.mset_bytes and len(ks) > 1:
            half = len(ks) // 2
            self._mset(ks[:half], vs[:half])
            self._mset(ks[half:], vs[half:])
            return
        self.chunks.append(packed)
        self.n_cmds += 1
        self.pending += size
        self.n_keys += len(ks)
        if self.pending >= self.send_bytes:
            self.flush()

    def set(self, key: str, value) -> None:
        self.mset([key], [value])

    def _read(self) -> None:
        replies = [self.conn.read_response() for _ in range(self.unread)]
        self.unread = 0
        if any(r is not True and r != b"OK" for r in replies):
            raise RuntimeError(f"Redis refused a write: {replies[:3]}")

    def flush(self) -> None:
        """Read the replies of the previous send, then send what is buffered."""
        self._read()
        if self.n_cmds:
            chunks = [c for p in self.chunks for c in ([p] if isinstance(p, bytes) else p)]
            self.conn.send_packed_command(chunks, check_health=False)
            self.unread = self.n_cmds
            self.chunks, self.n_cmds, self.pending = [], 0, 0

    def finish(self) -> None:
        """Send what is buffered and read every reply: all writes are acknowledged."""
        self.flush()
        self._read()

    def __enter__(self) -> MsetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)

    def close(self, failed: bool = False) -> None:
        """Give the connection back (dropped first when ``failed`` or replies are unread)."""
        if failed or self.unread or self.n_cmds:
            self.conn.disconnect()
        self.pool.release(self.conn)
