"""The steps of one retrain, each a small function over the run's
:class:`~pipeline.training.run_types.RunContext` that returns a JSON-able summary:

:func:`ingest_step` -> :func:`dataset_step` -> :func:`train_step` (fit with warm start, evaluate,
write artifact and checkpoint) -> :func:`gate_step` (:func:`pipeline.training.gate.decide`) ->
:func:`publish_step` -> :func:`report_step` -> :func:`prune_step`.

Every step after the dataset step reads and writes one run directory
``{runs}/{model}/{run_key}`` whose key is a fingerprint of the data snapshot (the store offsets
of the model's own event kinds), the model config and the warm-start source, so each step is
idempotent: a repeated or retried step finds its output and returns it, and running the same
window twice publishes one version. A run directory holds ``dataset/`` (a bundle: the solver
inputs, its manifest the dataset summary), ``artifact/`` (what the model publishes), one
directory per other candidate (``challenger-NAME``, ``blend-NAME``, ``trivial-NAME``),
``checkpoint/`` (id maps and warm state for the next run) and one JSON summary per later step.
The publish step publishes the gate's choice, then commits the checkpoint: a run that was
rejected, failed or did not publish never becomes a warm start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

from pipeline.durable import read_json, write_json
from pipeline.settings import redact
from pipeline.training import gate
from pipeline.training.checkpoints import (
    commit_checkpoint,
    latest_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    run_dirs,
    set_aside,
    write_checkpoint,
)
from pipeline.training.run_types import (
    DATASET_FORMAT,
    KEEP_RUN_DIRS,
    Choice,
    Decision,
    RunContext,
)
from solvers.persist import read_bundle, read_manifest, write_bundle

log = logging.getLogger(__name__)


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def served_versions(ctx: RunContext) -> list:
    """The model's versions in Redis (:func:`pipeline.serving.versions.served_versions`)."""
    from pipeline.serving.versions import served_versions as versions

    return versions(ctx.model, ctx.client(), namespace=ctx.settings.namespace)


def ingest_step(ctx: RunContext, *, progress: bool = False) -> dict:
    """Drain the Kafka topics of the model's kinds into the store (nothing to do in embedded
    mode)."""
    settings, kinds = ctx.settings, ctx.cfg.kinds
    if not settings.kafka_bootstrap:
        return {"ingested": 0, "mode": "embedded"}
    from pipeline.ingest.events import default_topic
    from pipeline.ingest.kafka import DEFAULT_GROUP, ingest_kafka

    topics = {default_topic(k): k for k in kinds}
    # one consumer group per set of topics: members of one group that subscribe to different
    # topics can be assigned nothing until the group leader's metadata catches up (minutes)
    summary = ingest_kafka(topics, settings=settings, until_end=True, progress=progress,
                           group_id=f"{DEFAULT_GROUP}.{'+'.join(sorted(topics))}")
    return {"ingested": sum(summary.events.values()),
            "dead_letters": sum(summary.dead_letters.values()),
            "seconds": round(summary.seconds, 3), "mode": "kafka"}


def dataset_step(ctx: RunContext, *, cold: bool = False, hand_over: dict | None = None) -> dict:
    """Build the dataset of the current store snapshot into a (new or existing) run dir.
    ``started_at`` (epoch seconds) starts the clock of the run's outcome. ``hand_over`` (a
    dict) receives the dataset's arrays as ``hand_over["arrays"]``, derived ones included,
    for a train step in the same process (:func:`train_step`'s ``arrays``): the bundle is
    written for a step elsewhere or a resumed run, not read back by this one."""
    cfg, model, settings = ctx.cfg, ctx.model, ctx.settings
    started_at, started = time.time(), time.perf_counter()
    if not cold:
        ctx.runs.pull_checkpoints(model)
    previous = None if cold else latest_checkpoint(settings.checkpoint_dir, model,
                                                   algorithm=cfg.algorithm)
    from pipeline.ingest.open_store import open_store

    store = open_store(settings)
    config_key = _digest(cfg.__dict__)
    snapshot = {f"{t}/{p}": o for (t, p), o in sorted(store.next_offsets(kinds=cfg.kinds).items())}
    if (previous is not None and previous.manifest.get("config_key") == config_key
            and previous.manifest.get("window", {}).get("end_offsets") == snapshot):
        # same store snapshot and config: the same window, known without building it
        return {"model": model, "decision": Decision.UNCHANGED, "run_dir": None,
                "checkpoint": str(previous.path), "started_at": started_at,
                "reason": f"checkpoint {previous.run_id} was trained on this exact window"}
    trainer = cfg.family.new_trainer()
    arrays, info = trainer.build(store, cfg, None if previous is None else previous.arrays)
    data_key = _digest({"window": info["window"], "config": config_key})
    fingerprint = _digest({"data": data_key, "cold": cold,
                           "warm_from": None if previous is None else previous.run_id})
    for existing in (settings.runs_dir / model).glob(f"*-{fingerprint}"):
        done = read_manifest(existing / "dataset", fmt=DATASET_FORMAT)
        if done:   # same snapshot, config and warm start as an earlier run: reuse it
            return {**_summary(done), "reused": True}
    # microseconds: run directories and checkpoints are ordered by name, and two runs of a
    # model within one second must not be ordered by their fingerprints
    run_key = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f") + "-" + fingerprint
    run_dir = settings.runs_dir / model / run_key
    summary = {"model": model, "algorithm": cfg.algorithm, "run_dir": str(run_dir),
               "run_key": run_key, "data_key": data_key, "config_key": config_key, **info,
               "warm_from": None if previous is None else str(previous.path),
               "started_at": started_at,
               "dataset_seconds": round(time.perf_counter() - started, 3),
               "decision": Decision.NO_DATA if info["n_train"] == 0 else Decision.PENDING}
    write_bundle(run_dir / "dataset",
                 {k: v for k, v in arrays.items() if k not in trainer.derived},
                 {"format": DATASET_FORMAT, "format_version": 1, **summary})
    if hand_over is not None:
        hand_over["arrays"] = arrays
    return summary


def _summary(manifest: dict) -> dict:
    return {k: v for k, v in manifest.items() if k not in ("format", "format_version")}


def dataset_summary(run_dir: Path) -> dict:
    """The dataset step's summary, as kept in the run directory."""
    return _summary(read_manifest(Path(run_dir) / "dataset", fmt=DATASET_FORMAT))


def _warm(ctx: RunContext, ds: dict):
    """``(warm state, last checkpoint's arrays, same config?, path)`` for the fit."""
    warm_from = ds["warm_from"] and ctx.runs.warm_start(ctx.model, ds["warm_from"])
    if not (warm_from and warm_from.is_dir()):   # the dataset step may have run elsewhere
        return None, None, False, warm_from
    from pipeline.training.trainers import warm_state

    last = read_checkpoint(warm_from)
    same_config = last.manifest.get("config_key") == ds["config_key"]
    return warm_state(last.arrays), last.arrays, same_config, warm_from


def _fit(ctx: RunContext, trainer, arrays, ds: dict, trial: bool):
    """Fit warm; a checkpoint that no longer fits the model (say its rank changed) makes the
    fit cold, and when the cold fit works the checkpoint was the problem: it is set aside for
    good, but only by a run of the very config that made it and that will publish."""
    warm, last_arrays, same_config, warm_from = _warm(ctx, ds)
    try:
        fitted, info = trainer.fit(arrays, ctx.cfg, warm)
        return fitted, info, last_arrays, warm is not None, None
    except Exception as err:
        if warm is None:
            raise
        failed = f"{type(err).__name__}: {err}"
    fitted, info = trainer.fit(arrays, ctx.cfg, None)
    if same_config and not trial:
        set_aside(warm_from, f"cannot warm-start this model ({failed})")
    else:
        warnings.warn(f"checkpoint {Path(ds['warm_from']).name} cannot warm-start this model "
                      f"({failed}); trained cold, the checkpoint is left as it is (it was made "
                      "by another config, or this run will not publish)",
                      RuntimeWarning, stacklevel=3)
    return fitted, info, last_arrays, False, failed


def train_step(ctx: RunContext, *, trial: bool = False, arrays: dict | None = None) -> dict:
    """Fit, warm-started from the checkpoint the dataset step chose; evaluate; write the
    run's artifact, its trivial lists, its challenger and its checkpoint, once. ``arrays``:
    the dataset as the dataset step of this process built it (else read from the run
    directory's bundle)."""
    run_dir, cfg, model = ctx.run_dir, ctx.cfg, ctx.model
    done = read_json(run_dir / "train.json")
    if done:
        return done
    from pipeline.training.trainers import CHALLENGER_PREFIX, warm_state

    trainer = cfg.family.new_trainer()
    trainer.ray_address = cfg.ray_address or ctx.settings.ray_address
    if arrays is None:
        ds, arrays = read_bundle(run_dir / "dataset", fmt=DATASET_FORMAT, version=1)
    else:
        ds = dataset_summary(run_dir)
    fitted, fit_info, last_arrays, warm, warm_failed = _fit(ctx, trainer, arrays, ds, trial)
    # the challengers' part alone: the model's duals (0.2 GB at 7M comparisons) are spent and
    # need not outlive the fit into the refit's peak
    last_warm = warm_state(last_arrays, CHALLENGER_PREFIX) if last_arrays else None
    del last_arrays
    metrics = trainer.evaluate(fitted.model, arrays, cfg)
    trained_at = datetime.now(timezone.utc).isoformat()
    fit_info.update(trainer.refit(fitted, arrays, cfg))   # the holdout learned from too
    artifact = trainer.artifact(fitted.served, arrays, cfg, params=cfg.params,
                                metrics=metrics, trained_at=trained_at)
    if artifact.kind != cfg.family.artifact_kind:   # the registry entry is the contract
        raise TypeError(f"the {cfg.algorithm} trainer made a {artifact.kind!r} artifact, its "
                        f"registry entry says {cfg.family.artifact_kind!r}")
    watermark = ds["window"]["end_offsets"]     # what every candidate learned from
    artifact.watermark = watermark
    numbered(artifact, arrays).save(run_dir / "artifact")
    baselines, found = {}, trainer.baselines(arrays, cfg)
    for name, (scores_metrics, scores) in found.items():
        baselines[name] = scores_metrics
        trivial = trainer.trivial_artifact(scores, arrays, algorithm=f"{cfg.algorithm}:{name}",
                                           params={"trivial": name}, metrics=scores_metrics,
                                           trained_at=trained_at, served_as="trivial")
        trivial.watermark = watermark
        numbered(trivial, arrays).save(run_dir / f"trivial-{name}")
    challenger = _challenger(ctx, trainer, fitted, arrays, last_warm, trained_at, watermark)
    # after the challengers: the warm state copies every dual (7M comparisons: 0.28 GB)
    checkpoint_arrays = trainer.checkpoint(fitted, arrays)
    fitted_challenger = None
    if challenger is not None:
        challenger, warm_arrays, fitted_challenger = challenger
        checkpoint_arrays.update({CHALLENGER_PREFIX + k: v for k, v in warm_arrays.items()})
    from pipeline.training.report_intervals import holdout_intervals

    intervals = holdout_intervals(trainer, arrays, cfg, model=fitted.model, metrics=metrics,
                                  baselines=found, challenger=fitted_challenger)
    fit_info = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in fit_info.items()}
    write_checkpoint(run_dir / "checkpoint", arrays=checkpoint_arrays,
                     manifest={"model": model, "algorithm": cfg.algorithm,
                               "params": cfg.params, "metrics": metrics,
                               "window": ds["window"], "data_key": ds["data_key"],
                               "config_key": ds["config_key"], "train": fit_info,
                               "trained_at": trained_at})
    return write_json(run_dir / "train.json", {
        "model": model, "run_dir": str(run_dir), "warm_start": warm, **fit_info,
        "metrics": metrics, "baselines": baselines, "trained_at": trained_at,
        **({"challenger": challenger} if challenger else {}),
        **({"holdout_intervals": intervals} if intervals else {}),
        **({"warm_start_failed": warm_failed} if warm_failed else {})})


def numbered(artifact, arrays: dict):
    """``artifact``, its scorer told how the training rows numbered their features
    (``feature_base``: 1 when no row used index 0, as SVMlight, LIBSVM and LETOR files number
    them; else 0), so that a dense list given to ``/rank`` is read in that numbering."""
    scorer = artifact.scorer
    if scorer is not None and "X_indices" in arrays:
        used = arrays["X_indices"][arrays["X_indices"] < int(scorer.params["n_features"])]
        scorer.params["feature_base"] = int(len(used) > 0 and int(used.min()) >= 1)
    return artifact


def _challenger(ctx: RunContext, trainer, fitted, arrays, last_warm, trained_at: str,
                watermark: dict):
    """Fit the configured challenger (warm from the last checkpoint's challenger state), save
    its artifact (and its blend's) in the run directory; ``(summary, warm arrays, the fitted
    challenger)`` or None."""
    cfg = ctx.cfg
    from pipeline.training.run_types import Served
    from pipeline.training.trainers import challenger_names

    if not challenger_names(cfg.gate["challenger"]):
        return None

    def save(artifact, choice: Choice, metrics: dict) -> None:
        artifact.served_as, artifact.algorithm = str(choice), f"{cfg.algorithm}:{choice}"
        artifact.metrics, artifact.trained_at = metrics, trained_at
        artifact.watermark = watermark
        numbered(artifact, arrays).save(ctx.run_dir / choice.dir_name)

    def one(c) -> dict:
        if c.skipped is not None:     # not fitted (too large, say): the gate leaves it out
            return {"name": c.name, "skipped": c.skipped, "metrics": {}, "tried": c.tried,
                    "fit_seconds": round(c.fit_seconds, 4)}
        save(c.artifact, Choice(Served.CHALLENGER, c.name), c.metrics)
        return {"name": c.name, "metrics": c.metrics, "tried": c.tried,
                "fit_seconds": round(c.fit_seconds, 4),
                **({"warning": c.warning} if c.warning else {})}

    ch = trainer.challenger(fitted, arrays, cfg, last_warm or None)
    summary = one(ch)
    if ch.others:
        summary["others"] = [one(c) for c in ch.others]
    if ch.validations:
        summary["validation"] = ch.validations
    if ch.holdout_errors:
        summary["holdout_errors"] = ch.holdout_errors
    if ch.blend is not None:
        blend_metrics, blend_artifact, info = ch.blend
        save(blend_artifact, Choice(Served.BLEND, info.get("name", ch.name)), blend_metrics)
        summary["blend"] = {"metrics": blend_metrics, **info}
    return summary, ch.warm, ch


def _scores(trained: dict, ctx: RunContext) -> gate.Scores:
    """The gate's inputs from the train step's summary."""
    from pipeline.training.report_intervals import gate_lifts

    metric = ctx.cfg.metric
    ch = trained.get("challenger") or {}
    blend = ch.get("blend") or {}
    fitted = [c for c in [ch, *ch.get("others", [])] if c and "skipped" not in c]
    return gate.Scores(
        metric=metric, higher_is_better=ctx.cfg.family.higher_is_better(metric),
        model=trained["metrics"].get(metric),
        trivial={name: m[metric] for name, m in trained.get("baselines", {}).items()
                 if m.get(metric) is not None},
        challengers={c["name"]: c.get("metrics", {}).get(metric) for c in fitted},
        blend_value=blend.get("metrics", {}).get(metric), blend_weight=blend.get("weight"),
        blend_name=blend.get("name"), blend_margin=float(blend.get("margin") or 0.0),
        validation=ch.get("validation") or {}, holdout_errors=ch.get("holdout_errors") or {},
        **gate_lifts(trained.get("holdout_intervals") or {}, metric))



def _current(versions: list, metric: str) -> gate.Current:
    live = [v for v in versions if v.current]
    if not live:
        return gate.Current(never_served=not versions)
    return gate.Current(False, live[0].version, live[0].metrics.get(metric), live[0].served_as)


def gate_step(ctx: RunContext) -> dict:
    """Choose what users get (:func:`pipeline.training.gate.decide`) and record it with the
    reason, the lift over every trivial model and the margin to the challenger."""
    done = read_json(ctx.run_dir / "gate.json")
    if done:
        return done
    scores = _scores(read_json(ctx.run_dir / "train.json"), ctx)
    rule, current = gate.Rule.of(ctx.cfg.gate), _current(served_versions(ctx), scores.metric)
    verdict = gate.decide(scores, rule, current)
    rival, rival_value = scores.best_rival()
    challenger = ({} if rival is None else {
        "challenger": rival, "challenger_value": rival_value,
        "model_vs_challenger": verdict.model_vs_challenger,
        **({"challengers": scores.rivals} if len(scores.rivals) > 1 else {})})
    return write_json(ctx.run_dir / "gate.json", {
        "model": ctx.model, "run_dir": str(ctx.run_dir), "metric": scores.metric,
        "value": verdict.value, "model_value": scores.model, "trivial": scores.trivial,
        "lift_over_trivial": verdict.lift_over_trivial, **challenger,
        "publish": verdict.publishes is not None,
        "publishes": None if verdict.publishes is None else str(verdict.publishes),
        "candidate": str(verdict.candidate), "higher_is_better": scores.higher_is_better,
        "served_before": {"version": current.version, "value": current.value},
        "rule": vars(rule), "reason": verdict.reason})


def _publish(ctx: RunContext, artifact):
    """Publish ``artifact`` (a :class:`~pipeline.serving.artifact.ModelArtifact`, or the
    directory it was saved in) as the model's next version under the run's lease."""
    from pipeline.serving.artifact import ModelArtifact
    from pipeline.serving.publish import publish

    if not isinstance(artifact, ModelArtifact):
        artifact = ModelArtifact.load(artifact)
    return publish(ctx.model, artifact, ctx.client(),
                   top_k=int(ctx.cfg.publish["top_k"]),
                   keep_versions=int(ctx.cfg.publish["keep_versions"]),
                   namespace=ctx.settings.namespace, fence=ctx.fence)


def publish_step(ctx: RunContext) -> dict:
    """Publish the gate's choice as a new version, then commit the run's checkpoint; once per
    run (a retried step after a crash finds the version it already published by
    ``trained_at``)."""
    run_dir, model = ctx.run_dir, ctx.model
    done = read_json(run_dir / "published.json")
    if done:
        return done
    verdict = read_json(run_dir / "gate.json")
    if not verdict["publish"]:
        return write_json(run_dir / "published.json", {
            "model": model, "published": False, "version": None, "reason": verdict["reason"]})
    from pipeline.serving.publish import FencedError, SupersededError

    trained = read_json(run_dir / "train.json")
    chosen = run_dir / Choice.parse(verdict["publishes"]).dir_name
    already = [v for v in served_versions(ctx)
               if v.trained_at == trained["trained_at"] and v.status == "complete"]
    if already:
        version, seconds = already[0].version, 0.0
    else:
        try:   # a missing choice was moved into the checkpoint by an interrupted attempt
            result = _publish(ctx, chosen if chosen.is_dir()
                              else run_dir / "checkpoint" / "artifact")
        except SupersededError as err:     # FencedError too: the lease was lost
            return write_json(run_dir / "published.json", {
                "model": model, "published": False, "version": None, "reason": str(err),
                "fenced": isinstance(err, FencedError)})
        version, seconds = result.version, result.seconds
    # what was published (the model, or the trivial list the gate chose instead) is kept with
    # the checkpoint, so that ensure_served republishes the same thing after Redis lost it
    if chosen.is_dir():
        os.replace(chosen, run_dir / "checkpoint" / "artifact")
    ckpt = commit_checkpoint(run_dir / "checkpoint", ctx.settings.checkpoint_dir, model,
                             dataset_summary(run_dir)["run_key"])
    ctx.runs.commit_checkpoint(model, ckpt)
    return write_json(run_dir / "published.json", {
        "model": model, "published": True, "version": version, "checkpoint": str(ckpt),
        "publish_seconds": round(seconds, 3), "reason": verdict["reason"]})


def ensure_served(ctx: RunContext, checkpoint) -> dict:
    """After an "unchanged" window: if Redis serves nothing for the model (it was restarted
    empty or flushed), publish the last checkpoint's artifact again. A version that is served
    (even an older one an operator rolled back to) is left alone."""
    from pipeline.serving.artifact import ModelArtifact

    if served_versions(ctx):
        return {"republished": False}
    artifact = ModelArtifact.load(Path(checkpoint) / "artifact")
    artifact.healed_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result = _publish(ctx, artifact)
    return {"republished": True, "version": result.version,
            "reason": f"Redis served nothing for {ctx.model!r}: republished checkpoint "
                      f"{Path(checkpoint).name} as version {result.version}"}


def report_step(ctx: RunContext) -> dict:
    """Write the run's report page after the gate (and publish) steps. A report is for
    people, so it never fails a run: any error becomes a logged warning and
    ``{"report": None, "report_error": ...}``."""
    from pipeline.training.report import write_report

    try:
        path = write_report(ctx.run_dir, ctx.settings.runs_dir)
    except Exception as err:     # noqa: BLE001 - nothing here may stop a retrain
        reason = redact(f"{type(err).__name__}: {err}")
        log.warning("run %s: no report written (%s); the run goes on", ctx.run_dir, reason)
        return {"report": None, "report_error": reason}
    return {"report": str(path)}


def prune_step(ctx: RunContext) -> dict:
    """Keep the newest checkpoints (``publish.keep_versions``) and run directories."""
    model, settings = ctx.model, ctx.settings
    keep = int(ctx.cfg.publish["keep_versions"])
    removed = prune_checkpoints(settings.checkpoint_dir, model, keep=keep)
    runs = run_dirs(settings.runs_dir, model)
    for old in runs[:-KEEP_RUN_DIRS]:
        shutil.rmtree(old, ignore_errors=True)
    ctx.runs.prune(model, keep_checkpoints=keep, keep_runs=KEEP_RUN_DIRS)
    return {"model": model, "checkpoints_removed": len(removed),
            "runs_removed": max(0, len(runs) - KEEP_RUN_DIRS)}
