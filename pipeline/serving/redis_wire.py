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


class MsetWriter:
    """Sends ``MSET`` commands of at most ``mset_keys`` keys (so the server never blocks other
    clients for long), packed by hiredis (no per-argument Python work) and flushed every
    ``flush_bytes`` like a non-transactional pipeline. Use it as a context manager: the
    connection goes back to the pool, or is dropped after an error (replies may be unread)."""

    def __init__(self, client, flush_bytes: int = 8 << 20, mset_keys: int = 1000):
        self.pool = client.connection_pool
        self.conn = self.pool.get_connection()
        try:
            from hiredis import pack_command
        except ImportError:  # plain redis-py packing
            pack_command = self.conn.pack_command
        self.pack = pack_command
        self.flush_bytes = flush_bytes
        self.mset_keys = mset_keys
        self.chunks: list = []
        self.n_cmds = 0
        self.pending = 0
        self.n_keys = 0

    def mset(self, keys: list[str], values: list) -> None:
        for i in range(0, len(keys), self.mset_keys):
            ks, vs = keys[i:i + self.mset_keys], values[i:i + self.mset_keys]
            args: list = [None] * (2 * len(ks) + 1)
            args[0] = "MSET"
            args[1::2] = ks
            args[2::2] = vs
            packed = self.pack(tuple(args))
            self.chunks.append(packed)
            self.n_cmds += 1
            self.pending += len(packed) if isinstance(packed, bytes) else self.flush_bytes
            self.n_keys += len(ks)
            if self.pending >= self.flush_bytes:
                self.flush()

    def set(self, key: str, value) -> None:
        self.mset([key], [value])

    def flush(self) -> None:
        if self.n_cmds:
            chunks = [c for p in self.chunks for c in ([p] if isinstance(p, bytes) else p)]
            self.conn.send_packed_command(chunks)
            replies = [self.conn.read_response() for _ in range(self.n_cmds)]
            self.chunks, self.n_cmds, self.pending = [], 0, 0
            if any(r is not True and r != b"OK" for r in replies):
                raise RuntimeError(f"Redis refused a write: {replies[:3]}")

    def __enter__(self) -> MsetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.conn.disconnect()
        self.pool.release(self.conn)
