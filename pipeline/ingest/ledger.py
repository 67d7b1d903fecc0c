"""Which file records the store already holds, by content.

Files are ingested into one log, :data:`FILE_TOPIC` (a name no Kafka topic can have), whose
offsets are append positions. Every record of a file has a 64-bit key, BLAKE2b of its content
(the JSON line, the CSV cells with their header, the Parquet row, the ``u.data`` line) and of
how it is read (format and default kind). A record whose key the store holds is not stored
again, so:

- the same file again, or a copy of it under another path, adds nothing;
- an edited file adds its changed and appended records: a changed record keeps its event id,
  and being stored later it is the latest of that id (datasets keep the latest event per id
  or key, by ``(ts, offset)``), so re-reading never double counts;
- records removed from a file stay in the store (events are facts) and are reported.

The keys of each segment group are written next to the store *before* the group
(``{store}/.files/keys/{first}-{last}.npy``): a key file whose group never reached the store is
a crash leftover, dropped on the next run, so a killed ingestion stores its records once. The
keys a path held at its last ingestion (``.files/paths/{hash of the path}.npy``) tell what
was removed since.

Examples
--------
>>> import tempfile
>>> ledger = FileLedger(tempfile.mkdtemp())
>>> ledger.add(0, 1, [record_key(b"a"), record_key(b"b")])
>>> len(ledger.stored_keys(next_offset=2)), len(ledger.stored_keys(next_offset=0))
(2, 0)
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from pipeline.durable import fsync_dir, fsync_file, makedirs_durable

FILE_TOPIC = "~files"


def record_key(content: bytes) -> int:
    """The 64-bit key of a record's content: two distinct records share one with probability
    about n² / 2**65 (3e-8 for a million records).

    >>> record_key(b'{"event_id": "e1"}') == record_key(b'{"event_id": "e1"}')
    True
    """
    return int.from_bytes(hashlib.blake2b(content, digest_size=8).digest(), "little")


class FileLedger:
    """The record keys of the file log, kept under ``{store root}/.files``."""

    def __init__(self, store_root: str | Path):
        self.dir = Path(store_root) / ".files"

    def stored_keys(self, next_offset: int) -> np.ndarray:
        """Sorted keys of every record in the log's groups below ``next_offset`` (the store's);
        key files of groups at or past it are leftovers of a crash and are deleted."""
        parts = [np.load(path, allow_pickle=False)
                 for path in sorted((self.dir / "legacy").glob("*.npy"))]
        for path in sorted((self.dir / "keys").glob("*.npy")):
            first = int(path.stem.split("-")[0])
            if first >= next_offset:
                path.unlink(missing_ok=True)
            else:
                parts.append(np.load(path, allow_pickle=False))
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.uint64)

    def add(self, first: int, last: int, keys) -> None:
        """Durably record the keys of the group ``first..last`` (before the group is written)."""
        _save(self.dir / "keys" / f"{first:020d}-{last:020d}.npy", keys)

    def add_legacy(self, path: str | Path, keys) -> None:
        """Record the keys of ``path``'s records that a store written before the ledger holds
        under the file's own topic."""
        _save(self.dir / "legacy" / self._path_file(path).name, keys)

    def last_seen(self, path: str | Path) -> np.ndarray | None:
        """Sorted keys of ``path``'s records at its last ingestion, ``None`` if never."""
        file = self._path_file(path)
        return np.load(file, allow_pickle=False) if file.exists() else None

    def remember(self, path: str | Path, keys) -> None:
        """Keep ``path``'s record keys of this ingestion, to report removals next time."""
        _save(self._path_file(path), keys)

    def _path_file(self, path) -> Path:
        resolved = str(Path(path).resolve()).encode()
        return self.dir / "paths" / f"{hashlib.sha256(resolved).hexdigest()[:24]}.npy"


def contains(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Which of ``keys`` are in ``sorted_keys`` (ascending), by binary search.

    >>> contains(np.array([2, 5, 9], np.uint64), np.array([5, 6, 9], np.uint64)).tolist()
    [True, False, True]
    """
    if not len(sorted_keys):
        return np.zeros(len(keys), bool)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[at] == keys


def _save(path: Path, keys) -> None:
    makedirs_durable(path.parent)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temp, "wb") as fh:
        np.save(fh, np.unique(np.asarray(keys, np.uint64)), allow_pickle=False)
    fsync_file(temp)
    os.replace(temp, path)
    fsync_dir(path.parent)
