"""Making redis-py clients from the settings' URL: timeouts, retries, AUTH and TLS.

URLs (redis-py's ``from_url``):

- ``redis://[[user]:password@]host:port/db`` -- plain TCP, optional AUTH (``requirepass`` or ACL)
- ``rediss://...`` -- TLS; certificate options as query arguments, e.g.
  ``rediss://:pw@host:6380/0?ssl_ca_certs=/etc/ca.pem`` (``ssl_certfile``, ``ssl_keyfile`` for
  client certificates, ``ssl_cert_reqs=none`` to skip verification in tests only)
- ``unix:///path/redis.sock?db=0`` -- a local socket (the embedded server)

Examples
--------
A URL in a message or log goes through :func:`pipeline.settings.redact` first.
"""

from __future__ import annotations


def client_from_url(url: str, *, timeout: float | None = None, retries: int = 0):
    """A redis-py client for ``url`` with the hiredis parser (when installed).

    Parameters
    ----------
    url : str
        See the module docstring.
    timeout : float, optional
        Socket connect and read timeout in seconds (``None``: block).
    retries : int
        Reconnect-and-retry attempts on connection errors (redis-py's ``Retry``; 0: fail at
        once, so the caller's own policy decides).

    Examples
    --------
    >>> client_from_url("redis://127.0.0.1:1/0", timeout=0.1).connection_pool.connection_kwargs[
    ...     "socket_timeout"]
    0.1
    """
    import redis
    from redis.backoff import ExponentialBackoff, NoBackoff
    from redis.retry import Retry

    backoff = ExponentialBackoff(cap=1.0, base=0.05) if retries else NoBackoff()
    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                                retry=Retry(backoff, retries))


def as_client(redis_or_url, *, timeout: float | None = None, retries: int = 3):
    """``redis_or_url`` if it already is a client, else :func:`client_from_url`."""
    if isinstance(redis_or_url, str):
        return client_from_url(redis_or_url, timeout=timeout, retries=retries)
    if not hasattr(redis_or_url, "execute_command"):
        raise TypeError(f"expected a Redis URL or a redis-py client, got "
                        f"{type(redis_or_url).__name__}")
    pool = getattr(redis_or_url, "connection_pool", None)
    if pool is not None and pool.connection_kwargs.get("decode_responses"):
        raise ValueError("the Redis client has decode_responses=True; rankstream reads packed "
                         "binary values and needs a client with decode_responses=False")
    return redis_or_url
