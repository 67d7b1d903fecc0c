"""How to reach the object store: the server and credentials of the AWS SDK's own environment
variables, and the two clients built from them (boto3 for requests, conditional puts included;
pyarrow's S3 layer for Parquet).

``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``; for a server other than AWS, e.g.
``http://127.0.0.1:8333``), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``
(or ``AWS_DEFAULT_REGION``; default ``us-east-1``).

Examples
--------
>>> Connection.from_environ({"AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
...                          "AWS_SECRET_ACCESS_KEY": "s"})
Connection(endpoint='http://127.0.0.1:8333', region='us-east-1')
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

CONNECT_TIMEOUT = 5       # seconds
REQUEST_TIMEOUT = 30


@dataclass(frozen=True)
class Connection:
    """Server and credentials (hashable: clients are cached by it; the repr omits secrets)."""

    endpoint: str | None
    region: str
    key_id: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Connection:
        """The connection the ``AWS_*`` variables of ``environ`` (default ``os.environ``) name."""
        env = os.environ if environ is None else environ
        return cls(endpoint=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
                   region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
                   key_id=env.get("AWS_ACCESS_KEY_ID"), secret=env.get("AWS_SECRET_ACCESS_KEY"))


def boto3_client(connection: Connection):
    """A boto3 S3 client (path-style addressing, 4 attempts, 32 pooled connections)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=connection.endpoint, region_name=connection.region,
                        aws_access_key_id=connection.key_id,
                        aws_secret_access_key=connection.secret,
                        config=Config(s3={"addressing_style": "path"},
                                      connect_timeout=CONNECT_TIMEOUT,
                                      read_timeout=REQUEST_TIMEOUT,
                                      retries={"max_attempts": 4, "mode": "standard"},
                                      max_pool_connections=32))


def arrow_filesystem(connection: Connection):
    """A :class:`pyarrow.fs.S3FileSystem` on the same server, with the same credentials."""
    from pyarrow import fs

    scheme, _, host = (connection.endpoint or "").partition("://")
    return fs.S3FileSystem(access_key=connection.key_id, secret_key=connection.secret,
                           region=connection.region, endpoint_override=host or None,
                           scheme=scheme or "https", connect_timeout=CONNECT_TIMEOUT,
                           request_timeout=REQUEST_TIMEOUT)
