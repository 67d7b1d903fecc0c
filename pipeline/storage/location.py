"""Where objects live: ``s3://bucket/prefix`` URLs, and the keys and paths of the objects under
one such location. Pure string work, no client.

Examples
--------
>>> where = ObjectLocation.parse("s3://events/prod/")
>>> where.key("store", "x.parquet"), where.url("store"), where.fs_path("prod/a")
('prod/store/x.parquet', 's3://events/prod/store', 'events/prod/a')
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OBJECT_SCHEME = "s3://"


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


_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def check_bucket_name(bucket: str) -> None:
    """``ValueError`` for a name S3 refuses for a new bucket, saying what it takes.

    >>> check_bucket_name("rankstream-events")
    """
    if not _BUCKET_NAME.fullmatch(bucket) or ".." in bucket:
        raise ValueError(f"bucket name {bucket!r}: S3 takes 3 to 63 lowercase letters, digits, "
                         "dots and hyphens, starting and ending with a letter or digit")


@dataclass(frozen=True)
class ObjectLocation:
    """One ``s3://bucket/prefix``: names of the objects under it. Parts given to :meth:`key` and
    :meth:`url` are relative to the prefix; a *whole key* includes it."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> ObjectLocation:
        return cls(*split_url(url))

    def key(self, *parts: str) -> str:
        """The whole key of ``parts`` under the prefix."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def url(self, *parts: str) -> str:
        """The ``s3://`` URL of ``parts`` under the prefix (of the location itself if none)."""
        return f"{OBJECT_SCHEME}{self.bucket}/{self.key(*parts)}".rstrip("/")

    def fs_path(self, key: str) -> str:
        """A whole key as pyarrow's S3 layer names it (``bucket/key``)."""
        return f"{self.bucket}/{key}"

    def relative(self, key: str) -> str:
        """A whole key without the prefix."""
        return key[len(self.prefix) + 1:] if self.prefix else key
