"""The objects under one ``s3://bucket/prefix``: write, create-only write, read, list, delete,
and directory sync; and :func:`object_store_for`, the one store (and so the one pair of
clients) per location and server in a process.

Examples
--------
>>> ObjectStore("s3://events/prod").url("store", "x.parquet")
's3://events/prod/store/x.parquet'
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from pipeline.storage import sync
from pipeline.storage.connection import Connection, arrow_filesystem, boto3_client
from pipeline.storage.errors import (
    StorageError,
    error_code,
    http_status,
    is_missing,
    lost_create_race,
    request,
)
from pipeline.storage.location import ObjectLocation, check_bucket_name, is_object_url


@dataclass(frozen=True)
class Listed:
    key: str           # the whole key, prefix included
    size: int
    modified: float    # epoch seconds


class ObjectStore:
    """The objects under one ``s3://bucket/prefix``; keys given to methods are whole keys (see
    :meth:`key`). Each store builds its boto3 client and its pyarrow file system once, on first
    use, and reuses them; :func:`object_store_for` gives every caller of a process the same store.

    Parameters
    ----------
    url : str
        ``s3://bucket/prefix``.
    environ : mapping, optional
        Where the ``AWS_*`` variables are read (default ``os.environ``), unless ``connection``.
    connection : Connection, optional
        The server and credentials.
    """

    def __init__(self, url: str, environ: Mapping[str, str] | None = None, *,
                 connection: Connection | None = None):
        self.location = ObjectLocation.parse(url)
        self.connection = connection or Connection.from_environ(environ)

    def __repr__(self) -> str:     # never the secret
        return f"ObjectStore({self.url()!r}, endpoint={self.endpoint!r})"

    # ------------------------------------------------------------------ naming

    @property
    def bucket(self) -> str:
        return self.location.bucket

    @property
    def prefix(self) -> str:
        return self.location.prefix

    @property
    def endpoint(self) -> str | None:
        return self.connection.endpoint

    def key(self, *parts: str) -> str:
        return self.location.key(*parts)

    def url(self, *parts: str) -> str:
        return self.location.url(*parts)

    def fs_path(self, key: str) -> str:
        return self.location.fs_path(key)

    def relative(self, key: str) -> str:
        return self.location.relative(key)

    # ------------------------------------------------------------------ clients (built once)

    @cached_property
    def fs(self):
        """pyarrow's S3 file system, for Parquet."""
        return arrow_filesystem(self.connection)

    @cached_property
    def client(self):
        """The boto3 S3 client, for requests."""
        return boto3_client(self.connection)

    def _call(self, what: str, method: str, **kwargs):
        return request(what, getattr(self.client, method), bucket=self.bucket, where=self.url(),
                       endpoint=self.endpoint, **kwargs)

    # ------------------------------------------------------------------ objects

    def put(self, key: str, data: bytes) -> None:
        """Write (or replace) one object: whole or not at all."""
        self._call("a write", "put_object", Key=key, Body=data)

    def create(self, key: str, data: bytes) -> bool:
        """Create the object only if no object has the key; False if one has (HTTP 412: another
        writer created it first)."""
        from botocore.exceptions import ClientError

        try:
            self._call("a write", "put_object", Key=key, Body=data, IfNoneMatch="*")
        except ClientError as err:
            if lost_create_race(err):
                return False
            raise
        return True

    def get(self, key: str) -> bytes | None:
        """The object's bytes, None if there is none."""
        from botocore.exceptions import ClientError

        try:
            return self._call("a read", "get_object", Key=key)["Body"].read()
        except ClientError as err:
            if is_missing(err):
                return None
            raise

    def get_many(self, keys: list[str]) -> list[bytes | None]:
        """:meth:`get` of each key, 16 at a time."""
        if len(keys) <= 1:
            return [self.get(k) for k in keys]
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(self.get, keys))

    def list(self, key_prefix: str) -> list[Listed]:
        """Every object whose key starts with ``key_prefix`` (a whole key), by key."""
        found, token = [], None
        while True:
            page = self._call("a listing", "list_objects_v2", Prefix=key_prefix,
                              **({"ContinuationToken": token} if token else {}))
            found += [Listed(o["Key"], int(o["Size"]), o["LastModified"].timestamp())
                      for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return sorted(found, key=lambda o: o.key)
            token = page["NextContinuationToken"]

    def delete(self, keys: list[str]) -> None:
        """Delete these objects (missing ones are no error)."""
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start:start + 1000]]
            if batch:
                self._call("a delete", "delete_objects",
                           Delete={"Objects": batch, "Quiet": True})

    def ensure_bucket(self) -> bool:
        """Create the bucket if it does not exist; whether it was created. In a region other
        than us-east-1 AWS wants the region named in the request, so it is."""
        from botocore.exceptions import BotoCoreError, ClientError

        check_bucket_name(self.bucket)
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return False
        except BotoCoreError:
            self._call("a listing", "list_objects_v2", MaxKeys=1)   # says why, in one line
        except ClientError as err:
            if http_status(err) != 404 and error_code(err) not in ("404", "NoSuchBucket"):
                raise StorageError(f"bucket {self.bucket!r} at {self.endpoint or 'AWS'} "
                                   f"refused a check (HTTP {http_status(err)}): it is someone "
                                   "else's, or check AWS_ACCESS_KEY_ID / "
                                   "AWS_SECRET_ACCESS_KEY") from None
        where = self.connection.region
        extra = ({} if where == "us-east-1" else
                 {"CreateBucketConfiguration": {"LocationConstraint": where}})
        try:
            self._call("creating the bucket", "create_bucket", **extra)
        except ClientError as err:
            if error_code(err) == "BucketAlreadyOwnedByYou":
                return False                        # created since the check: by us
            raise StorageError(f"cannot create bucket {self.bucket!r} at "
                               f"{self.endpoint or 'AWS'} ({error_code(err)}): bucket names "
                               "are global on AWS; choose another name") from None
        return True

    # ------------------------------------------------------------------ directories

    def upload_dir(self, local: Path, key_prefix: str) -> list[str]:
        """:func:`pipeline.storage.sync.upload_dir` into this store."""
        return sync.upload_dir(self, local, key_prefix)

    def download_dir(self, key_prefix: str, local: Path) -> int:
        """:func:`pipeline.storage.sync.download_dir` from this store."""
        return sync.download_dir(self, key_prefix, local)


def object_store_for(where, environ: Mapping[str, str] | None = None) -> ObjectStore:
    """The process's one :class:`ObjectStore` for a location: the same object (so the same
    boto3 client and pyarrow file system) for every call with the same URL, server and
    credentials. A forked child builds its own (clients are not shared across a fork).

    Parameters
    ----------
    where : str or Settings
        An ``s3://bucket/prefix`` URL, or settings whose ``store`` is one.
    environ : mapping, optional
        Where the ``AWS_*`` variables are read (default ``os.environ``).

    Examples
    --------
    >>> object_store_for("s3://events/prod") is object_store_for("s3://events/prod/")
    True
    """
    url = where if isinstance(where, str) else getattr(where, "store", None)
    if not is_object_url(url):
        raise ValueError(f"{url!r} is not an object-store URL (expected s3://bucket/prefix)")
    location = ObjectLocation.parse(url)
    return _cached_store(location.url(), Connection.from_environ(environ), os.getpid())


@functools.lru_cache(maxsize=64)
def _cached_store(url: str, connection: Connection, pid: int) -> ObjectStore:
    return ObjectStore(url, connection=connection)
