"""Checkpoints: what the next retrain of a model warm-starts from, one per published run.

Layout: ``{root}/{model}/{run_id}/``, a bundle (:mod:`solvers.persist`: ``arrays.npz`` with the
id maps and the solver's warm state, ``manifest.json`` with the algorithm, params, metrics, the
event-store window, timings). The train step writes a run's checkpoint into its run directory;
the publish step *commits* it after the version is live in Redis, by renaming it (with the
run's artifact inside, ``artifact/``, so the last published model can be published again) into
``{root}/{model}/``. So a checkpoint exists only for a run that passed the gate and published,
it appears whole or not at all, and it is never used as a warm start otherwise. Run ids sort by
time. A checkpoint that cannot warm-start its model (unreadable, another model's, another
algorithm's, or incompatible with a changed config) is set aside to ``.set-aside/`` with a
warning, and the run trains cold; pruning keeps the newest few of each.
"""

from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

from pipeline.durable import fsync_dir, makedirs_durable
from solvers.persist import read_bundle, write_bundle

FORMAT = "rankstream.checkpoint"
FORMAT_VERSION = 2


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    manifest: dict
    arrays: dict

    @property
    def run_id(self) -> str:
        return self.path.name


def write_checkpoint(path, *, arrays: dict, manifest: dict) -> Path:
    """Write a checkpoint bundle at ``path`` (atomically; an existing one is replaced)."""
    return write_bundle(path, arrays, {**manifest, "format": FORMAT,
                                       "format_version": FORMAT_VERSION})


def commit_checkpoint(source, root, model: str, run_id: str) -> Path:
    """Move the checkpoint bundle ``source`` (a run's) to ``{root}/{model}/{run_id}`` in one
    rename, durably; a no-op when it is there already (a retried publish step)."""
    target = Path(root) / model / run_id
    if target.exists():
        return target
    makedirs_durable(target.parent)
    os.replace(source, target)
    fsync_dir(target.parent)
    fsync_dir(Path(source).parent)
    return target


def read_checkpoint(path) -> Checkpoint:
    """Load one checkpoint; ``ValueError`` if it is incomplete, corrupt or of another format."""
    try:
        manifest, arrays = read_bundle(path, fmt=FORMAT, version=FORMAT_VERSION)
    except FileNotFoundError as err:
        raise ValueError(f"checkpoint {path} is incomplete: {err}") from None
    except ValueError as err:
        raise ValueError(f"checkpoint {err}") from None
    return Checkpoint(Path(path), manifest, arrays)


def run_dirs(root, model: str) -> list[Path]:
    """Completed directories of ``model`` under ``root``, oldest first (temp dirs excluded)."""
    model_dir = Path(root) / model
    if not model_dir.is_dir():
        return []
    return sorted(p for p in model_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def set_aside(path, reason: str) -> Path:
    """Move a checkpoint that cannot warm-start its model to ``.set-aside/`` beside it (kept for
    a person to look at, never used again) with a ``RuntimeWarning`` that says why."""
    path = Path(path)
    target = path.parent / ".set-aside" / path.name
    makedirs_durable(target.parent)
    if target.exists():
        shutil.rmtree(target)
    os.replace(path, target)
    fsync_dir(path.parent)
    warnings.warn(f"checkpoint {path} {reason}; moved to {target}; this run trains cold",
                  RuntimeWarning, stacklevel=3)
    return target


def latest_checkpoint(root, model: str, *, algorithm: str | None = None) -> Checkpoint | None:
    """The newest usable checkpoint of ``model`` (of ``algorithm``, if given), or None.

    A newer one that is unreadable, of another format, of another model or of another
    algorithm is set aside (:func:`set_aside`) with a warning that says why, and the next
    older one is tried.
    """
    for path in reversed(run_dirs(root, model)):
        try:
            ckpt = read_checkpoint(path)
        except ValueError as err:
            set_aside(path, f"cannot be read ({err})")
            continue
        owner = ckpt.manifest.get("model")
        if owner != model:
            set_aside(path, f"belongs to model {owner!r}, not {model!r}")
            continue
        if algorithm and ckpt.manifest.get("algorithm") != algorithm:
            set_aside(path, f"is for algorithm {ckpt.manifest.get('algorithm')!r}, the model "
                            f"now uses {algorithm!r}")
            continue
        return ckpt
    return None


def prune_checkpoints(root, model: str, keep: int = 3) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints, all but the newest ``keep`` set-aside
    ones (kept for a person to look at, but a config that changes every run must not fill the
    disk), and leftovers of interrupted writes; returns what was removed."""
    model_dir = Path(root) / model
    removed = _all_but_newest(run_dirs(root, model), keep)
    if model_dir.is_dir():
        aside = model_dir / ".set-aside"
        if aside.is_dir():
            removed += _all_but_newest(sorted(p for p in aside.iterdir() if p.is_dir()), keep)
        removed += [p for p in model_dir.iterdir()
                    if p.name.startswith(".") and p.name.endswith((".tmp", ".old"))]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def _all_but_newest(paths: list[Path], keep: int) -> list[Path]:
    """``paths`` (oldest first) but the last ``keep``."""
    return paths[:-keep] if keep > 0 else list(paths)
