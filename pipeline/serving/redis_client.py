"""Making redis-py clients from the settings' URL: timeouts, retries, AUTH, TLS and Cluster.

URLs (redis-py's ``from_url``):

- ``redis://[[user]:password@]host:port/db`` -- plain TCP, optional AUTH (``requirepass`` or ACL)
- ``rediss://...`` -- TLS; certificate options as query arguments, e.g.
  ``rediss://:pw@host:6380/0?ssl_ca_certs=/etc/ca.pem`` (``ssl_certfile``, ``ssl_keyfile`` for
  client certificates, ``ssl_cert_reqs=none`` to skip verification in tests only)
- ``unix:///path/redis.sock?db=0`` -- a local socket (the embedded server)

**Redis Cluster**: give any node's ``redis://`` or ``rediss://`` URL. A server that reports
``cluster_enabled:1`` (``INFO cluster``, asked once when the client is made) gets a redis-py
``RedisCluster`` client, which discovers the other nodes. The query argument ``cluster=1``
asks for a cluster client without asking the server first (``cluster=0``: never); it is
removed before the URL reaches redis-py. Database numbers other than 0 do not exist in a
cluster. A cluster client connects when it is made (to read the slot map), so making one fails
while the cluster is down; a single-server client connects on first use.

Examples
--------
A URL in a message or log goes through :func:`pipeline.settings.redact` first.

>>> split_cluster_flag("redis://:pw@10.0.0.5:7000/0?cluster=1")
('redis://:pw@10.0.0.5:7000/0', True)
>>> split_cluster_flag("rediss://h:6380/0?ssl_ca_certs=/ca.pem&cluster=no")
('rediss://h:6380/0?ssl_ca_certs=/ca.pem', False)
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit, urlunsplit

_YES = ("1", "yes", "true", "on")
_NO = ("0", "no", "false", "off")


def split_cluster_flag(url: str) -> tuple[str, bool | None]:
    """``url`` without its ``cluster=`` query argument, and what it said (``None``: absent)."""
    parts = urlsplit(url)
    fields = parts.query.split("&") if parts.query else []
    flags = [v.lower() for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if k == "cluster"]
    if not flags:
        return url, None
    if flags[-1] not in _YES + _NO:
        raise ValueError(f"cluster={flags[-1]!r} in the Redis URL: expected 1 or 0")
    rest = "&".join(f for f in fields if f.split("=", 1)[0] != "cluster")  # others verbatim
    return urlunsplit(parts._replace(query=rest)), flags[-1] in _YES


def is_cluster(client) -> bool:
    """Whether ``client`` is a redis-py ``RedisCluster``."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def server_is_cluster(url: str, timeout: float | None = None) -> bool:
    """Whether the server at ``url`` runs in cluster mode (``INFO cluster``); ``False`` when
    it cannot be asked (down, AUTH refused, a unix socket): the plain client then reports the
    problem on first use, as without this check."""
    import redis

    if url.startswith("unix:"):
        return False
    wait = 2.0 if timeout is None else min(float(timeout), 2.0)
    probe = redis.Redis.from_url(url, socket_timeout=wait, socket_connect_timeout=wait)
    try:
        return bool(probe.info("cluster").get("cluster_enabled"))
    except (redis.RedisError, OSError):
        return False
    finally:
        probe.close()


def client_from_url(url: str, *, timeout: float | None = None, retries: int = 0,
                    cluster: bool | None = None):
    """A redis-py client for ``url`` with the hiredis parser (when installed): ``RedisCluster``
    for a cluster (see the module docstring), else ``Redis``.

    Parameters
    ----------
    url : str
        See the module docstring.
    timeout : float, optional
        Socket connect and read timeout in seconds (``None``: block).
    retries : int
        Reconnect-and-retry attempts on connection errors (redis-py's ``Retry``; 0: fail at
        once, so the caller's own policy decides). A cluster client also refreshes its slot
        map between attempts.
    cluster : bool, optional
        Make a cluster client (True) or not (False) whatever the URL says; default: as the URL
        says, else as the server says.

    Examples
    --------
    >>> client_from_url("redis://127.0.0.1:1/0", timeout=0.1).connection_pool.connection_kwargs[
    ...     "socket_timeout"]
    0.1
    """
    import redis
    from redis.backoff import ExponentialBackoff, NoBackoff
    from redis.retry import Retry

    url, asked = split_cluster_flag(url)
    if cluster is None:
        cluster = asked if asked is not None else server_is_cluster(url, timeout)
    backoff = ExponentialBackoff(cap=1.0, base=0.05) if retries else NoBackoff()
    if cluster:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url, socket_timeout=timeout,
                                     socket_connect_timeout=timeout,
                                     retry=Retry(backoff, retries))
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                retry=Retry(backoff, retries))


def as_client(redis_or_url, *, timeout: float | None = None, retries: int = 3):
    """``redis_or_url`` if it already is a client, else :func:`client_from_url`."""
    if isinstance(redis_or_url, str):
        return client_from_url(redis_or_url, timeout=timeout, retries=retries)
    if not hasattr(redis_or_url, "execute_command"):
        raise TypeError(f"expected a Redis URL or a redis-py client, got "
                        f"{type(redis_or_url).__name__}")
    if is_cluster(redis_or_url):
        kwargs = redis_or_url.nodes_manager.connection_kwargs
    else:
        pool = getattr(redis_or_url, "connection_pool", None)
        kwargs = pool.connection_kwargs if pool is not None else {}
    if kwargs.get("decode_responses"):
        raise ValueError("the Redis client has decode_responses=True; rankstream reads packed "
                         "binary values and needs a client with decode_responses=False")
    return redis_or_url
