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
committed by a create-only marker written after their files (:mod:`pipeline.training.run_store`).

Parquet goes through pyarrow's own S3 layer (:class:`pyarrow.fs.S3FileSystem`); conditional
puts through boto3, since pyarrow's layer does not expose them.

=========================================  ===================================================
module                                     what it does
=========================================  ===================================================
:mod:`pipeline.storage.location`           ``s3://`` URLs; keys and paths under a location
:mod:`pipeline.storage.connection`         server and credentials; building the two clients
:mod:`pipeline.storage.errors`             a failed request as a one-line :class:`StorageError`
:mod:`pipeline.storage.objects`            :class:`ObjectStore` (requests) and
                                           :func:`object_store_for` (one per location)
:mod:`pipeline.storage.sync`               a local directory and a key prefix made equal
=========================================  ===================================================

Callers get a store with ``object_store_for(settings)`` (or a URL): one per process, location
and server, so one boto3 client and one pyarrow file system, built on first use.
"""

from pipeline.storage.connection import Connection
from pipeline.storage.errors import StorageError
from pipeline.storage.location import OBJECT_SCHEME, ObjectLocation, is_object_url, split_url
from pipeline.storage.objects import Listed, ObjectStore, object_store_for

__all__ = ["OBJECT_SCHEME", "Connection", "Listed", "ObjectLocation", "ObjectStore",
           "StorageError", "is_object_url", "object_store_for", "split_url"]
