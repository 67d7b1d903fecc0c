"""The one place that chooses the event store: :func:`open_store` gives the store that
``Settings`` name, local directories or an object store. Callers hold the result as an
:class:`~pipeline.ingest.store.EventStore` and never ask which it is; the file ledger that goes
with a store (which file records it holds) comes from :func:`open_file_ledger`.

Examples
--------
>>> import tempfile
>>> from pipeline.settings import Settings
>>> store = open_store(Settings(home=tempfile.mkdtemp()))
>>> type(store).__name__, store.next_offsets()
('LocalEventStore', {})
"""

from __future__ import annotations

from contextlib import contextmanager

from pipeline.ingest.ledger import FILE_TOPIC, FileLedger
from pipeline.ingest.local_store import LocalEventStore
from pipeline.ingest.object_store import ObjectEventStore, ObjectFileLedger
from pipeline.ingest.store import EventStore


def open_store(settings, *, compression: str = "lz4") -> EventStore:
    """The event store of a :class:`pipeline.settings.Settings`.

    Parameters
    ----------
    settings : Settings
        ``settings.store`` an ``s3://bucket/prefix`` URL: an :class:`ObjectEventStore` there
        (server and credentials from the ``AWS_*`` environment, one client per process);
        otherwise a :class:`LocalEventStore` in ``settings.store_dir`` and
        ``settings.dead_letter_dir``.
    compression : str
        Parquet codec of new segments (default ``"lz4"``).
    """
    if settings.remote:
        return ObjectEventStore(settings.store, compression=compression)
    return LocalEventStore(settings.store_dir, settings.dead_letter_dir, compression=compression)


@contextmanager
def open_file_ledger(store: EventStore):
    """The file ledger of ``store`` (:mod:`pipeline.ingest.ledger`), held for one ingestion of
    files: a local store's is beside its directories, held under the file log's ``flock`` (one
    ingestion of files at a time); an object store's is under its prefix
    (:class:`~pipeline.ingest.object_store.ObjectFileLedger`) and needs no lock: the commits
    of the file log fence its writers."""
    if isinstance(store, ObjectEventStore):
        yield ObjectFileLedger(store)
        return
    with store.lock(f"{FILE_TOPIC}.ingest", 0):
        yield FileLedger(store.root)
