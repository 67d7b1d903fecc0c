"""Durable "bundles": a directory holding ``arrays.npz`` and ``manifest.json``, written so that a
reader sees the old bundle or the new one, never a part of either, and no moment where the path
is missing. The one writer behind solver ``save``, model artifacts and checkpoints.

How: the new bundle is written into a temporary sibling directory, every file is fsynced, then
the directory; it then takes the bundle's path by one ``rename`` (a new path) or by
``renameat2(RENAME_EXCHANGE)`` (an existing bundle: the two directories swap in one step, and
the old one is deleted afterwards). Where the exchange is not available (not Linux) the old
bundle is moved aside first, leaving a window of a few microseconds in which the path is
missing. The parent directory is fsynced after the rename, which is what makes it durable.

Arrays are saved with ``np.savez`` and loaded with ``allow_pickle=False``; an object array is
refused at write time (``np.savez`` would pickle it silently).

Examples
--------
>>> import tempfile, os, numpy as np
>>> path = os.path.join(tempfile.mkdtemp(), "bundle")
>>> _ = write_bundle(path, {"w": np.arange(3.0)}, {"format": "example", "format_version": 1})
>>> manifest, arrays = read_bundle(path, fmt="example", version=1)
>>> arrays["w"].tolist(), manifest["format_version"]
([0.0, 1.0, 2.0], 1)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

ARRAYS, MANIFEST = "arrays.npz", "manifest.json"
_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _fsync_dir(path) -> None:
    """fsync a directory: what makes a rename or a new entry in it durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs_durable(path) -> None:
    """``mkdir -p`` that also fsyncs the parent of every directory it creates."""
    path = Path(path)
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        _fsync_dir(directory.parent)


def _libc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    lib = ctypes.CDLL(name, use_errno=True)
    return lib if hasattr(lib, "renameat2") else None


_LIBC = _libc()


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries atomically (Linux ``renameat2``); False if unsupported."""
    if _LIBC is None:
        return False
    rc = _LIBC.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # file system cannot exchange
        return False
    raise OSError(err, os.strerror(err), str(b))


def write_bundle(path, arrays: dict, manifest: dict) -> Path:
    """Write ``arrays`` (name -> array-like) and ``manifest`` (JSON-able) as the bundle ``path``.

    Raises ``TypeError`` for an array of object dtype. Returns the path.
    """
    path = Path(path)
    arrays = {name: np.asarray(value) for name, value in arrays.items()}
    pickled = sorted(name for name, value in arrays.items() if value.dtype.hasobject)
    if pickled:
        raise TypeError(f"arrays {pickled} have dtype object; a bundle holds plain numeric or "
                        "string arrays only (pickle is not allowed)")
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n"
    _makedirs_durable(path.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        with open(tmp / ARRAYS, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if not path.exists():
            os.replace(tmp, path)
        elif not _exchange(tmp, path):
            aside = tmp.with_name(tmp.name + ".old")
            os.replace(path, aside)
            os.replace(tmp, path)
            tmp = aside
        _fsync_dir(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the old bundle after a swap, or a failed write
    return path


def read_bundle(path, *, fmt: str, version: int | None = None) -> tuple[dict, dict]:
    """``(manifest, arrays)`` of a bundle whose manifest says ``"format": fmt``.

    Raises ``FileNotFoundError`` if ``path`` holds no bundle and ``ValueError`` if it is
    corrupt, of another format, or of another ``format_version`` than ``version``.
    """
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} holds no saved bundle: {MANIFEST} is missing") from None
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}/{MANIFEST} is unreadable: {err}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{path} holds a {found!r} bundle, expected {fmt!r}")
    if version is not None and manifest.get("format_version") != version:
        raise ValueError(f"{path} has {fmt} format_version {manifest.get('format_version')!r}, "
                         f"this rankstream reads {version}")
    try:
        with np.load(path / ARRAYS, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except FileNotFoundError:
        raise ValueError(f"{path} is incomplete: {ARRAYS} is missing") from None
    except Exception as err:  # zipfile.BadZipFile, ValueError (pickled data), EOFError ...
        raise ValueError(f"{path}/{ARRAYS} is corrupt: {type(err).__name__}: {err}") from None
    return manifest, arrays


def read_manifest(path, *, fmt: str) -> dict | None:
    """The manifest of the bundle at ``path`` without loading its arrays, or None if there is
    no bundle there (a bundle of another format is a ``ValueError``)."""
    try:
        manifest = json.loads((Path(path) / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise ValueError(f"{path} does not hold a {fmt!r} bundle")
    return manifest
