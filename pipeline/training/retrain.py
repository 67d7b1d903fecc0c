"""The retrain loop: "retrain model M from the last window of events, starting from its previous
duals, publish if it is good".

:func:`run` runs the steps of :mod:`pipeline.training.steps` in one process, holding the
model's lease, handing each step's values to the next in memory; the Airflow tasks
(:mod:`pipeline.training.airflow_tasks`) run the same steps one task at a time. Both end in
:func:`finish_run`, so a recorded outcome means one thing wherever it was recorded:

- ``decision``: a :class:`~pipeline.training.run_types.Decision`;
- ``seconds``: wall time from the start of the run's dataset step to its decision (the
  ``started_at`` its dataset summary keeps; an ingest before it is measured by ingest).
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from pipeline.durable import write_json
from pipeline.heap import release_freed_memory
from pipeline.settings import Settings
from pipeline.training.lock import model_lock
from pipeline.training.progress import phase, showing
from pipeline.training.run_types import Decision, RunContext
from pipeline.training.steps import (
    dataset_step,
    ensure_served,
    gate_step,
    ingest_step,
    prune_step,
    publish_step,
    report_step,
    train_step,
)


def run(model: str, config, *, settings: Settings | None = None, redis_url: str | None = None,
        cold: bool = False, publish: bool = True, ingest: bool = False,
        progress: bool = False, wait: float = 0.0) -> dict:
    """All steps for one model in this process, holding the model's retrain lock (waiting up
    to ``wait`` seconds for another run to finish); returns a summary for people and XCom."""
    ctx = RunContext.of(config, model, settings, redis_url)
    invoked = time.time()
    with model_lock(ctx.settings, model, wait=wait,
                    redis_url=ctx.redis_url if publish else None) as lease:
        ctx = replace(ctx, fence=lease and lease.token)
        with showing(progress, f"train {model}"):
            summary = _run_steps(ctx, cold, publish, ingest, progress)
        if summary["dataset"].get("run_dir"):
            ctx.runs.push_run(summary["dataset"]["run_dir"])
        # a run that reused an earlier one's steps (the same data, config and warm start) took
        # this call's time, not the time since that run began
        outcome = finish_run(ctx, summary, invoked if summary["dataset"].get("reused") else None)
        summary["seconds"] = outcome["seconds"]
        return summary


def outcome_path(settings: Settings, model: str) -> Path:
    """Where the model's last run outcome is kept: ``HOME/outcomes/{model}.json`` (beside the
    run directories, not among them)."""
    return Path(settings.home) / "outcomes" / f"{model}.json"


def finish_run(ctx: RunContext, summary: dict, started_at: float | None = None) -> dict:
    """Record what the model's run decided (``summary["decision"]`` and ``["reason"]``) and
    how long it took since ``started_at`` (default: the dataset summary's), at
    :func:`outcome_path`: what ``rankstream metrics`` exports."""
    if started_at is None:
        started_at = (summary.get("dataset") or summary)["started_at"]
    path = outcome_path(ctx.settings, ctx.model)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_json(path, {
        "model": ctx.model, "decision": str(summary.get("decision", "")),
        "reason": summary.get("reason", ""), "seconds": round(time.time() - started_at, 3),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})


def _unchanged(ctx: RunContext, ds: dict, summary: dict, publish: bool) -> dict:
    """An empty window, or the one the last checkpoint was trained on: nothing to train; a
    publishing run makes sure Redis still serves the checkpoint."""
    summary.update(decision=ds["decision"], reason=ds.get("reason", "no events in window"))
    if ds["decision"] == Decision.UNCHANGED and publish and ctx.redis_url is not None:
        summary["served"] = ensure_served(ctx, ds["checkpoint"])
        if summary["served"]["republished"]:
            summary.update(decision=Decision.REPUBLISHED, reason=summary["served"]["reason"])
    return summary


def _run_steps(ctx: RunContext, cold: bool, publish: bool, ingest: bool,
               progress: bool) -> dict:
    summary = {"model": ctx.model, "algorithm": ctx.cfg.algorithm}
    if ingest:
        phase("ingest")
        summary["ingest"] = ingest_step(ctx, progress=progress)
    built: dict = {}
    phase("dataset")
    ds = summary["dataset"] = dataset_step(ctx, cold=cold, hand_over=built)
    if ds["decision"] in (Decision.NO_DATA, Decision.UNCHANGED):
        return _unchanged(ctx, ds, summary, publish)
    ctx = ctx.at(ds["run_dir"])
    dataset_upload = ctx.runs.start_push(ctx.run_dir)     # overlaps the fit
    phase("fit")
    summary["train"] = train_step(ctx, trial=not publish, arrays=built.pop("arrays", None))
    release_freed_memory()   # the fits are gone; the publish reads the artifact back
    if dataset_upload is not None:
        dataset_upload.result()
    if not publish:
        phase("report")
        summary["report"] = report_step(ctx)["report"]
        summary["decision"] = Decision.TRAINED
        return summary
    ctx.client()     # a Redis URL is given (the train command checked Redis is up)
    phase("gate")
    summary["gate"] = gate_step(ctx)
    # before the version goes live: a run killed after its flip leaves its run directory
    # (the window a served version was trained on) where every host finds it
    ctx.runs.push_run(ctx.run_dir)
    phase("publish")
    summary["publish"] = publish_step(ctx)
    phase("report")
    summary["report"] = report_step(ctx)["report"]
    summary["prune"] = prune_step(ctx)
    summary["decision"] = Decision.of_publish(summary["publish"])
    summary["reason"] = summary["publish"]["reason"]
    return summary
