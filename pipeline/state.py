"""Checkpoints: one directory per model and successful run, written atomically.

Layout: ``{root}/{model}/{run_id}/`` holding ``arrays.npz`` (id maps, solver warm state, primal
factors/weights; ``allow_pickle=False``) and ``manifest.json`` (format version, algorithm, params,
metrics, event-store window used, timings, decision). A run's directory appears only after it
has been fully written and fsynced (temp dir + rename), so the checkpoint of a failed or killed
run never exists and is never used as a warm start. Run ids sort by time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.durable import fsync_dir

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    manifest: dict
    arrays: dict

    @property
    def run_id(self) -> str:
        return self.path.name


def write_checkpoint(root, model: str, run_id: str, *, arrays: dict, manifest: dict) -> Path:
    """Write ``{root}/{model}/{run_id}`` atomically; an existing one of that id is replaced."""
    model_dir = Path(root) / model
    model_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{run_id}-", dir=model_dir))
    try:
        bad = [k for k, v in arrays.items() if np.asarray(v).dtype == object]
        if bad:
            raise TypeError(f"checkpoint arrays {bad} have dtype object; pickle is not allowed")
        with open(tmp / "arrays.npz", "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        full = {**manifest, "format_version": FORMAT_VERSION, "model": model, "run_id": run_id}
        with open(tmp / "manifest.json", "w") as fh:
            json.dump(full, fh, indent=2, sort_keys=True, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(tmp)
        final = model_dir / run_id
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(model_dir)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_checkpoint(path) -> Checkpoint:
    """Load one checkpoint; ``ValueError`` if it is incomplete, corrupt or of another format."""
    path = Path(path)
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        with np.load(path / "arrays.npz", allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, json.JSONDecodeError) as err:
        raise ValueError(f"checkpoint {path} is unreadable: {err}") from err
    except Exception as err:  # zipfile.BadZipFile and friends
        raise ValueError(f"checkpoint {path} is corrupt: {type(err).__name__}: {err}") from err
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"checkpoint {path} has format_version "
                         f"{manifest.get('format_version')!r}, expected {FORMAT_VERSION}")
    return Checkpoint(path, manifest, arrays)


def run_dirs(root, model: str) -> list[Path]:
    """Completed run directories of ``model``, oldest first."""
    model_dir = Path(root) / model
    if not model_dir.is_dir():
        return []
    return sorted(p for p in model_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def latest_checkpoint(root, model: str, *, algorithm: str | None = None) -> Checkpoint | None:
    """The newest readable checkpoint of ``model`` (of ``algorithm``, if given), or None.

    An unreadable or incompatible newest checkpoint gives a ``RuntimeWarning`` naming it and
    the reason, and is skipped; it is never deleted (a person may want to look at it).
    """
    for path in reversed(run_dirs(root, model)):
        try:
            ckpt = read_checkpoint(path)
        except ValueError as err:
            warnings.warn(f"{err}; skipping it (cold start if no older one is usable)",
                          RuntimeWarning, stacklevel=2)
            continue
        if algorithm and ckpt.manifest.get("algorithm") != algorithm:
            warnings.warn(f"checkpoint {path} is for algorithm "
                          f"{ckpt.manifest.get('algorithm')!r}, the model now uses "
                          f"{algorithm!r}; skipping it", RuntimeWarning, stacklevel=2)
            continue
        return ckpt
    return None


def prune_checkpoints(root, model: str, keep: int = 3) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints (and stale temp dirs); return removed."""
    removed = run_dirs(root, model)[:-keep] if keep > 0 else run_dirs(root, model)
    model_dir = Path(root) / model
    if model_dir.is_dir():
        removed += [p for p in model_dir.iterdir() if p.name.startswith(".tmp-")]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed
