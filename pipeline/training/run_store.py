"""Where run directories and checkpoints are shared between hosts, chosen once by
:func:`open_run_store`: a :class:`LocalRunStore` when the store is a directory (one host, or a
shared POSIX file system: a run directory's URL is its path, and there is nothing to copy), an
:class:`ObjectRunStore` when it is ``s3://bucket/prefix``. Steps call the same methods on
either; none of them asks which one it has.

On an object store every host works in a local copy under its own ``HOME``:

- **Run directories** live at ``{prefix}/runs/{model}/{run_key}/``. A step starts from a copy
  of it (:meth:`~RunStore.pull_run`: an Airflow task on another host is handed the URL) and,
  once its output is written, makes the object store's copy equal to its own
  (:meth:`~RunStore.push_run`). Only the holder of the model's lease runs a step, so one host
  at a time writes a run directory; a step killed before its push left nothing there, and its
  retry (on any host) does it again.
- **Checkpoints** live at ``{prefix}/checkpoints/{model}/{run_id}/``. A checkpoint's files are
  uploaded first and a ``COMMITTED`` marker is created after them, with a create-only put;
  readers take only checkpoints with the marker, so a warm start never reads a checkpoint
  whose upload was cut short. :meth:`~RunStore.pull_checkpoints` copies the newest committed
  ones into the host's local checkpoint directory, where
  :func:`pipeline.training.checkpoints.latest_checkpoint` finds them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from pipeline.durable import fsync_dir
from pipeline.settings import Settings

COMMITTED = "COMMITTED"
PULLED_CHECKPOINTS = 2      # the newest few: a warm start uses the newest that reads well


class RunStore(ABC):
    """How run directories and checkpoints pass between hosts."""

    def __init__(self, settings: Settings):
        self.settings = settings

    @abstractmethod
    def push_run(self, run_dir) -> str:
        """Share ``run_dir``; the URL another host (an Airflow task) is handed for it."""

    @abstractmethod
    def start_push(self, run_dir) -> Future | None:
        """:meth:`push_run` in the background (a dataset's upload overlaps the fit); None
        when there is nothing to copy."""

    @abstractmethod
    def pull_run(self, run_dir) -> Path:
        """The local copy of a run directory given by URL (or path)."""

    @abstractmethod
    def pull_latest_runs(self, model: str, n: int = 1) -> None:
        """Copy the model's newest ``n`` run directories of other hosts here."""

    @abstractmethod
    def commit_checkpoint(self, model: str, local: Path) -> None:
        """Share a checkpoint committed on this host."""

    @abstractmethod
    def warm_start(self, model: str, checkpoint) -> Path:
        """The local path of the checkpoint a dataset step (maybe on another host) chose."""

    @abstractmethod
    def pull_checkpoints(self, model: str) -> None:
        """Copy the model's newest shared checkpoints that this host lacks."""

    @abstractmethod
    def prune(self, model: str, *, keep_checkpoints: int, keep_runs: int) -> None:
        """Delete all but the newest shared checkpoints and run directories of ``model``."""


class LocalRunStore(RunStore):
    """Run directories and checkpoints on this host's file system (or a shared one): a URL is
    a path, and every hand-over between hosts is a no-op."""

    def push_run(self, run_dir) -> str:
        return str(run_dir)

    def start_push(self, run_dir) -> None:
        return None

    def pull_run(self, run_dir) -> Path:
        return Path(str(run_dir))

    def pull_latest_runs(self, model: str, n: int = 1) -> None:
        return None

    def commit_checkpoint(self, model: str, local: Path) -> None:
        return None

    def warm_start(self, model: str, checkpoint) -> Path:
        return Path(checkpoint)

    def pull_checkpoints(self, model: str) -> None:
        return None

    def prune(self, model: str, *, keep_checkpoints: int, keep_runs: int) -> None:
        return None


class ObjectRunStore(RunStore):
    """Run directories and checkpoints shared through an object store."""

    def __init__(self, settings: Settings):
        super().__init__(settings)
        from pipeline.storage import object_store_for

        self.objects = object_store_for(settings.store)

    def _relative(self, run_dir) -> str:
        """``{model}/{run_key}`` of a local run directory."""
        return Path(run_dir).relative_to(self.settings.runs_dir).as_posix()

    def push_run(self, run_dir) -> str:
        objects, relative = self.objects, self._relative(run_dir)
        objects.upload_dir(Path(run_dir), objects.key("runs", relative))
        return objects.url("runs", relative)

    def start_push(self, run_dir) -> Future:
        pool = ThreadPoolExecutor(1, thread_name_prefix="rankstream-push")
        future = pool.submit(self.push_run, run_dir)
        pool.shutdown(wait=False)
        return future

    def pull_run(self, run_dir) -> Path:
        text = str(run_dir)
        if not text.startswith("s3://"):
            return Path(text)
        prefix = self.objects.url("runs") + "/"
        if not text.startswith(prefix):
            raise ValueError(f"run directory {text} is not under this store's runs, {prefix}")
        relative = text[len(prefix):]
        local = self.settings.runs_dir / relative
        self.objects.download_dir(self.objects.key("runs", relative), local)
        return local

    def pull_latest_runs(self, model: str, n: int = 1) -> None:
        for run_key in self._run_keys(model)[-n:]:
            self.pull_run(self.objects.url("runs", model, run_key))

    def commit_checkpoint(self, model: str, local: Path) -> None:
        """Upload, then create the ``COMMITTED`` marker (a retried publish step repeats both
        harmlessly)."""
        key = self.objects.key("checkpoints", model, Path(local).name)
        if self.objects.get(f"{key}/{COMMITTED}") is not None:
            return
        self.objects.upload_dir(Path(local), key)
        self.objects.create(f"{key}/{COMMITTED}", b"")

    def _run_keys(self, model: str) -> list[str]:
        """Run keys of the model's run directories in the object store, oldest first."""
        prefix = self.objects.key("runs", model) + "/"
        return sorted({o.key[len(prefix):].split("/", 1)[0] for o in self.objects.list(prefix)})

    def _committed(self, model: str) -> list[str]:
        """Run ids of the model's committed checkpoints, oldest first."""
        prefix = self.objects.key("checkpoints", model) + "/"
        ids = (o.key[len(prefix):-len(COMMITTED) - 1] for o in self.objects.list(prefix)
               if o.key.endswith("/" + COMMITTED))
        return sorted(run_id for run_id in ids if "/" not in run_id)

    def _pull_checkpoint(self, model: str, run_id: str) -> Path:
        """The local copy of one committed checkpoint (downloaded if this host lacks it)."""
        local = self.settings.checkpoint_dir / model / run_id
        if local.is_dir():
            return local
        key = self.objects.key("checkpoints", model, run_id)
        if self.objects.get(f"{key}/{COMMITTED}") is None:
            return local     # not committed (or pruned): there is nothing to warm-start from
        staging = local.with_name(f".{run_id}.pull.tmp")
        self.objects.download_dir(key, staging)
        (staging / COMMITTED).unlink(missing_ok=True)
        staging.rename(local)          # whole or not at all, like a local commit
        fsync_dir(local.parent)
        return local

    def warm_start(self, model: str, checkpoint) -> Path:
        """There, ``checkpoint`` is the other host's path, so it is found by name."""
        return self._pull_checkpoint(model, Path(checkpoint).name)

    def pull_checkpoints(self, model: str) -> None:
        aside = self.settings.checkpoint_dir / model / ".set-aside"
        for run_id in self._committed(model)[-PULLED_CHECKPOINTS:]:
            if not (aside / run_id).exists():
                self._pull_checkpoint(model, run_id)

    def prune(self, model: str, *, keep_checkpoints: int, keep_runs: int) -> None:
        objects, doomed = self.objects, []
        old = self._committed(model)[:-keep_checkpoints] if keep_checkpoints > 0 else []
        for run_id in old:     # the marker first: a half-deleted checkpoint is never read
            objects.delete([objects.key("checkpoints", model, run_id, COMMITTED)])
            doomed += [o.key for o in objects.list(objects.key("checkpoints", model, run_id)
                                                   + "/")]
        prefix = objects.key("runs", model) + "/"
        runs = self._run_keys(model)
        for run_key in runs[:-keep_runs] if keep_runs > 0 else runs:
            doomed += [o.key for o in objects.list(f"{prefix}{run_key}/")]
        objects.delete(doomed)


def open_run_store(settings: Settings) -> RunStore:
    """The run store of ``settings`` (cheap: an object store's client is made once per
    process, :func:`pipeline.storage.object_store_for`)."""
    return ObjectRunStore(settings) if settings.remote else LocalRunStore(settings)
