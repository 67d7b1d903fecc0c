"""Run directories and checkpoints when the store is an object store (``RANKSTREAM_STORE=
s3://bucket/prefix``): every host works in a local copy under its own ``HOME``, and the object
store holds what the hosts share.

- **Run directories** live at ``{prefix}/runs/{model}/{run_key}/``. A step starts from a copy
  of it (:func:`pull_run`: an Airflow task on another host is handed the URL) and, once its
  output is written, makes the object store's copy equal to its own (:func:`push_run`). Only
  the holder of the model's lease runs a step, so one host at a time writes a run directory;
  a step killed before its push left nothing there, and its retry (on any host) does it again.
- **Checkpoints** live at ``{prefix}/checkpoints/{model}/{run_id}/``. A checkpoint's files are
  uploaded first and a ``COMMITTED`` marker is created after them (:func:`commit_checkpoint`),
  with a create-only put; readers take only checkpoints with the marker, so a warm start never
  reads a checkpoint whose upload was cut short. :func:`pull_checkpoints` copies the newest
  committed ones into the host's local checkpoint directory, where
  :func:`pipeline.training.checkpoints.latest_checkpoint` finds them as it always has.

With a local store every function here is a no-op: URLs are plain paths.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.settings import Settings

COMMITTED = "COMMITTED"
PULLED_CHECKPOINTS = 2      # the newest few: a warm start uses the newest that reads well


def _objects(settings: Settings):
    if not settings.remote:
        return None
    from pipeline.storage import ObjectStore

    return ObjectStore(settings.store)


def _run_key(settings: Settings, run_dir: Path) -> str:
    """``runs/{model}/{run_key}`` of a local run directory."""
    return Path(run_dir).relative_to(settings.runs_dir).as_posix()


def push_run(settings: Settings, run_dir) -> str:
    """Make the object store's copy of ``run_dir`` equal the local one; its URL (the local
    path with a local store)."""
    objects = _objects(settings)
    if objects is None or run_dir is None:
        return str(run_dir)
    key = objects.key("runs", _run_key(settings, Path(run_dir)))
    objects.upload_dir(Path(run_dir), key)
    return objects.url("runs", _run_key(settings, Path(run_dir)))


def start_push(settings: Settings, run_dir):
    """:func:`push_run` in a background thread (a dataset's upload overlaps the fit); a future
    whose ``result()`` is the URL, or None with a local store."""
    if not settings.remote or run_dir is None:
        return None
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1, thread_name_prefix="rankstream-push")
    future = pool.submit(push_run, settings, run_dir)
    pool.shutdown(wait=False)
    return future


def pull_run(settings: Settings, run_dir) -> Path:
    """The local copy of a run directory given by URL (or path), made equal to the object
    store's copy."""
    objects = _objects(settings)
    text = str(run_dir)
    if objects is None or not text.startswith("s3://"):
        return Path(text)
    prefix = objects.url("runs") + "/"
    if not text.startswith(prefix):
        raise ValueError(f"run directory {text} is not under this store's runs, {prefix}")
    relative = text[len(prefix):]
    local = settings.runs_dir / relative
    objects.download_dir(objects.key("runs", relative), local)
    return local


def pull_latest_runs(settings: Settings, model: str, n: int = 1) -> None:
    """Copy the model's newest ``n`` run directories in the object store to this host (what a
    report or ``rankstream models`` reads on a host that did not train them)."""
    objects = _objects(settings)
    if objects is None:
        return
    for run_key in _run_keys(objects, model)[-n:]:
        pull_run(settings, objects.url("runs", model, run_key))


def commit_checkpoint(settings: Settings, model: str, local: Path) -> None:
    """Upload a committed local checkpoint, then create its ``COMMITTED`` marker (a retried
    publish step repeats both harmlessly)."""
    objects = _objects(settings)
    if objects is None:
        return
    key = objects.key("checkpoints", model, Path(local).name)
    if objects.get(f"{key}/{COMMITTED}") is not None:
        return
    objects.upload_dir(Path(local), key)
    objects.create(f"{key}/{COMMITTED}", b"")


def _run_keys(objects, model: str) -> list[str]:
    """Run keys of the model's run directories in the object store, oldest first."""
    prefix = objects.key("runs", model) + "/"
    return sorted({o.key[len(prefix):].split("/", 1)[0] for o in objects.list(prefix)})


def _committed(objects, model: str) -> list[str]:
    """Run ids of the model's committed checkpoints in the object store, oldest first."""
    prefix = objects.key("checkpoints", model) + "/"
    return sorted(o.key[len(prefix):-len(COMMITTED) - 1] for o in objects.list(prefix)
                  if o.key.endswith("/" + COMMITTED) and "/" not in o.key[len(prefix):][
                      :-len(COMMITTED) - 1])


def pull_checkpoint(settings: Settings, model: str, run_id: str) -> Path:
    """The local copy of one committed checkpoint (downloaded if this host lacks it)."""
    local = settings.checkpoint_dir / model / run_id
    objects = _objects(settings)
    if objects is None or local.is_dir():
        return local
    key = objects.key("checkpoints", model, run_id)
    if objects.get(f"{key}/{COMMITTED}") is None:
        return local       # not committed (or pruned): there is nothing to warm-start from
    staging = local.with_name(f".{run_id}.pull.tmp")
    objects.download_dir(key, staging)
    (staging / COMMITTED).unlink(missing_ok=True)
    from solvers.persist import fsync_dir

    staging.rename(local)          # whole or not at all, like a local commit
    fsync_dir(local.parent)
    return local


def warm_start(settings: Settings, model: str, checkpoint) -> Path:
    """The local path of the checkpoint a dataset step chose to warm-start from, which may have
    run on another host: there, ``checkpoint`` is that host's path, so it is found by name."""
    if not settings.remote:
        return Path(checkpoint)
    return pull_checkpoint(settings, model, Path(checkpoint).name)


def pull_checkpoints(settings: Settings, model: str) -> None:
    """Copy the model's newest committed checkpoints that this host lacks (and has not set
    aside) into its local checkpoint directory."""
    objects = _objects(settings)
    if objects is None:
        return
    aside = settings.checkpoint_dir / model / ".set-aside"
    for run_id in _committed(objects, model)[-PULLED_CHECKPOINTS:]:
        if not (aside / run_id).exists():
            pull_checkpoint(settings, model, run_id)


def prune(settings: Settings, model: str, *, keep_checkpoints: int, keep_runs: int) -> None:
    """Delete all but the newest checkpoints and run directories of ``model`` in the object
    store (what the prune step does to the local ones)."""
    objects = _objects(settings)
    if objects is None:
        return
    old = _committed(objects, model)[:-keep_checkpoints] if keep_checkpoints > 0 else []
    doomed = []
    for run_id in old:     # the marker first: a half-deleted checkpoint is never read
        objects.delete([objects.key("checkpoints", model, run_id, COMMITTED)])
        doomed += [o.key for o in objects.list(objects.key("checkpoints", model, run_id) + "/")]
    prefix = objects.key("runs", model) + "/"
    runs = _run_keys(objects, model)
    for run_key in runs[:-keep_runs] if keep_runs > 0 else runs:
        doomed += [o.key for o in objects.list(f"{prefix}{run_key}/")]
    objects.delete(doomed)
