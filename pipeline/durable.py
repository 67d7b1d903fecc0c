"""Durable writes for the pipeline's own files: fsync of a file or a directory, ``mkdir -p``
that survives a crash, and JSON written atomically (temp file, fsync, rename, fsync of the
directory), so a reader sees the old file or the new one, never a part of either.

Model bundles (``arrays.npz`` plus a manifest) are the solvers' persistence format and stay in
:mod:`solvers.persist`; everything else the pipeline writes goes through here.

Examples
--------
>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "state.json")
>>> write_json(path, {"offset": 3}) == read_json(path) == {"offset": 3}
True
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def fsync_file(path) -> None:
    """fsync one file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path) -> None:
    """fsync a directory: what makes a rename or a new entry in it durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_durable(path) -> None:
    """``mkdir -p`` that also fsyncs the parent of every directory it creates."""
    path = Path(path)
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        fsync_dir(directory.parent)


def write_json(path, obj) -> dict:
    """Write ``obj`` as a JSON file atomically and durably; returns ``obj``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return obj


def read_json(path) -> dict | None:
    """A JSON file written by :func:`write_json`, or None if it does not exist."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
