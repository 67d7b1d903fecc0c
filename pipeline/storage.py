"""Objects in an S3-compatible object store, under one ``s3://bucket/prefix`` location.

``Settings.store`` (``RANKSTREAM_STORE``) names where the event store, dead letters, run
directories and checkpoints live: unset, a local directory (the default, ``HOME``), or an
object-store URL. The server and credentials come from the AWS SDK's own environment variables:
``AWS_ENDPOINT_URL`` (for a server other than AWS, e.g. ``http://127.0.0.1:8333``),
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION`` (default ``us-east-1``).

An object store has no rename, so nothing here is made visible by moving it into place. What
makes a write visible is a **create-only put** (``If-None-Match: *``): of two writers creating
the same key, exactly one succeeds and the other gets HTTP 412, whatever their clocks say. The
event store commits each flush that way (:mod:`pipeline.ingest.object_store`), checkpoints are
committed by a create-only marker written after their files (:mod:`pipeline.training.remote`).

Parquet goes through pyarrow's own S3 layer (:class:`pyarrow.fs.S3FileSystem`); conditional
puts through boto3, since pyarrow's layer does not expose them.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

OBJECT_SCHEME = "s3://"


class StorageError(RuntimeError):
    """The object store cannot be reached or refused a request; the message says what to do."""


def is_object_url(location) -> bool:
    """Whether ``location`` names an object store rather than a local directory.

    >>> is_object_url("s3://events/prod"), is_object_url("/data/rankstream"), is_object_url(None)
    (True, False, False)
    """
    return isinstance(location, str) and location.startswith(OBJECT_SCHEME)


def split_url(url: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of ``s3://bucket/prefix`` (prefix without slashes at its ends).

    >>> split_url("s3://events/prod/eu/"), split_url("s3://events")
    (('events', 'prod/eu'), ('events', ''))
    """
    if not is_object_url(url):
        raise ValueError(f"{url!r} is not an object-store URL (expected s3://bucket/prefix)")
    bucket, _, prefix = url[len(OBJECT_SCHEME):].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket (expected s3://bucket/prefix)")
    return bucket, prefix.strip("/")


@dataclass(frozen=True)
class Listed:
    key: str           # the whole key, prefix included
    size: int
    modified: float    # epoch seconds


class ObjectStore:
    """The objects under one ``s3://bucket/prefix``; keys given to methods are relative to it.

    Examples
    --------
    >>> ObjectStore("s3://events/prod").url("store", "x.parquet")
    's3://events/prod/store/x.parquet'
    """

    def __init__(self, url: str, environ=None):
        self.bucket, self.prefix = split_url(url)
        env = os.environ if environ is None else environ
        self.endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        self.region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        self._key_id = env.get("AWS_ACCESS_KEY_ID")
        self._secret = env.get("AWS_SECRET_ACCESS_KEY")

    def __repr__(self) -> str:     # never the secret
        return f"ObjectStore({self.url()!r}, endpoint={self.endpoint!r})"

    # ------------------------------------------------------------------ naming

    def key(self, *parts: str) -> str:
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def url(self, *parts: str) -> str:
        return f"{OBJECT_SCHEME}{self.bucket}/{self.key(*parts)}".rstrip("/")

    def fs_path(self, key: str) -> str:
        """A whole key as pyarrow's S3 layer names it (``bucket/key``)."""
        return f"{self.bucket}/{key}"

    def relative(self, key: str) -> str:
        return key[len(self.prefix) + 1:] if self.prefix else key

    # ------------------------------------------------------------------ clients

    @cached_property
    def fs(self):
        from pyarrow import fs

        scheme, _, host = (self.endpoint or "").partition("://")
        return fs.S3FileSystem(access_key=self._key_id, secret_key=self._secret,
                               region=self.region, endpoint_override=host or None,
                               scheme=scheme or "https", connect_timeout=5, request_timeout=30)

    @cached_property
    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=self.region,
                            aws_access_key_id=self._key_id,
                            aws_secret_access_key=self._secret,
                            config=Config(s3={"addressing_style": "path"},
                                          connect_timeout=5, read_timeout=30,
                                          retries={"max_attempts": 4, "mode": "standard"},
                                          max_pool_connections=32))

    def _call(self, what: str, fn, **kwargs):
        """One request; an unreachable server or a refusal becomes a one-line StorageError."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(Bucket=self.bucket, **kwargs)
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchBucket",):
                raise StorageError(f"bucket {self.bucket!r} does not exist at "
                                   f"{self.endpoint or 'AWS'}: create it, or point "
                                   "RANKSTREAM_STORE at one that does") from None
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise StorageError(f"the object store refused {what} in {self.url()} ({code}): "
                                   "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY") from None
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (404, 409, 412) or code in ("NoSuchKey", "404"):
                raise                                   # answers the callers handle
            raise StorageError(f"the object store failed {what} in {self.url()} "
                               f"(HTTP {status} {code}) after retries; try again") from None
        except BotoCoreError as err:
            raise StorageError(f"cannot reach the object store for {self.url()} "
                               f"({type(err).__name__}: {err}); is it running? "
                               "(AWS_ENDPOINT_URL)") from None

    # ------------------------------------------------------------------ objects

    def put(self, key: str, data: bytes) -> None:
        """Write (or replace) one object: whole or not at all."""
        self._call("a write", self.client.put_object, Key=key, Body=data)

    def create(self, key: str, data: bytes) -> bool:
        """Create the object only if no object has the key; False if one has (HTTP 412: another
        writer created it first)."""
        from botocore.exceptions import ClientError

        try:
            self._call("a write", self.client.put_object, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as err:
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (409, 412):
                return False
            raise
        return True

    def get(self, key: str) -> bytes | None:
        """The object's bytes, None if there is none."""
        from botocore.exceptions import ClientError

        try:
            return self._call("a read", self.client.get_object, Key=key)["Body"].read()
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
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
            page = self._call("a listing", self.client.list_objects_v2, Prefix=key_prefix,
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
                self._call("a delete", self.client.delete_objects,
                           Delete={"Objects": batch, "Quiet": True})

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (for tests and local servers)."""
        from botocore.exceptions import ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError:
            self._call("creating the bucket", self.client.create_bucket)

    # ------------------------------------------------------------------ directories

    def upload_dir(self, local: Path, key_prefix: str) -> list[str]:
        """Make the objects under ``key_prefix/`` equal the files under ``local``: upload what
        is new or changed in size, delete what is gone. Returns the uploaded keys."""
        local = Path(local)
        have = {o.key: o.size for o in self.list(key_prefix + "/")}
        files = {f"{key_prefix}/{p.relative_to(local).as_posix()}": p
                 for p in sorted(local.rglob("*")) if p.is_file() and not _temporary(p)}
        todo = [(k, p) for k, p in files.items() if have.get(k) != p.stat().st_size]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda kp: self.put(kp[0], kp[1].read_bytes()), todo))
        self.delete([k for k in have if k not in files])
        return [k for k, _ in todo]

    def download_dir(self, key_prefix: str, local: Path) -> int:
        """Make the files under ``local`` equal the objects under ``key_prefix/``: download
        what is missing or differs in size (each file written to a temporary name and renamed),
        delete local files the store does not hold. Returns how many objects it fetched."""
        local = Path(local)
        listed = self.list(key_prefix + "/")
        wanted = {local / o.key[len(key_prefix) + 1:]: o for o in listed}
        todo = [(p, o) for p, o in wanted.items()
                if not p.is_file() or p.stat().st_size != o.size]

        def fetch(item):
            path, obj = item
            data = self.get(obj.key)
            if data is None:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            temp.write_bytes(data)
            os.replace(temp, path)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(fetch, todo))
        if local.is_dir():
            for path in local.rglob("*"):
                if path.is_file() and path not in wanted and not _temporary(path):
                    path.unlink()
        return len(todo)


def _temporary(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith((".tmp", ".old"))
