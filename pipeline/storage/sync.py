"""A local directory and the objects under one key prefix, made equal in either direction (run
directories and checkpoints travel this way). Works on any :class:`~pipeline.storage.ObjectStore`
(``list``, ``get``, ``put``, ``delete``)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

THREADS = 8


def upload_dir(objects, local: Path, key_prefix: str) -> list[str]:
    """Make the objects under ``key_prefix/`` equal the files under ``local``: upload what is
    new or changed in size, delete what is gone. Returns the uploaded keys."""
    local = Path(local)
    have = {o.key: o.size for o in objects.list(key_prefix + "/")}
    files = {f"{key_prefix}/{p.relative_to(local).as_posix()}": p
             for p in sorted(local.rglob("*")) if p.is_file() and not is_temporary(p)}
    todo = [(k, p) for k, p in files.items() if have.get(k) != p.stat().st_size]
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda kp: objects.put(kp[0], kp[1].read_bytes()), todo))
    objects.delete([k for k in have if k not in files])
    return [k for k, _ in todo]


def download_dir(objects, key_prefix: str, local: Path) -> int:
    """Make the files under ``local`` equal the objects under ``key_prefix/``: download what is
    missing or differs in size (each file written to a temporary name and renamed), delete
    local files the store does not hold. Returns how many objects it fetched."""
    local = Path(local)
    listed = objects.list(key_prefix + "/")
    wanted = {local / o.key[len(key_prefix) + 1:]: o for o in listed}
    todo = [(p, o) for p, o in wanted.items() if not p.is_file() or p.stat().st_size != o.size]

    def fetch(item):
        path, obj = item
        data = objects.get(obj.key)
        if data is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temp.write_bytes(data)
        os.replace(temp, path)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(fetch, todo))
    if local.is_dir():
        for path in local.rglob("*"):
            if path.is_file() and path not in wanted and not is_temporary(path):
                path.unlink()
    return len(todo)


def is_temporary(path: Path) -> bool:
    """A file being written or replaced (``.NAME.tmp``, ``.NAME.old``): never synced."""
    return path.name.startswith(".") and path.name.endswith((".tmp", ".old"))
