"""The retrain loop: "retrain model M from the last window of events, starting from its previous
duals, publish if it is good". Airflow runs the steps as separate tasks; the CLI runs them in
one process through :func:`run`.

Every step reads and writes one run directory ``{runs}/{model}/{run_key}``
(``Settings.runs_dir``; with an object store, a local copy of ``s3://.../runs/...``, see
:mod:`pipeline.training.remote`) whose key is a fingerprint of the data snapshot (the store
offsets of the model's own event kinds), the model config and the warm-start source, so each
step is idempotent: a repeated or retried step finds its output and returns it, and running the
same window twice publishes one version.

A run directory holds ``dataset/`` (a bundle: the solver inputs, its manifest the dataset
summary), ``artifact/`` (the :class:`~pipeline.serving.artifact.ModelArtifact` to publish),
``checkpoint/`` (id maps and warm state for the next run) and one JSON summary per later step.
The publish step publishes the artifact, then commits the checkpoint (renames it into the
checkpoint directory): a run that was rejected, failed or did not publish never becomes a
warm start.

Steps: :func:`ingest_step` -> :func:`dataset_step` -> :func:`train_step` (fit with warm start,
evaluate, write artifact and checkpoint) -> :func:`gate_step` (compare with the published
metric) -> :func:`publish_step` -> :func:`prune_step`. Each takes the run's
:class:`RunContext` and returns a small JSON-able summary; a run's outcome is a
:class:`Decision`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from enum import StrEnum
from pathlib import Path

from pipeline.settings import Settings
from pipeline.training import remote
from pipeline.training.checkpoints import (
    commit_checkpoint,
    latest_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    run_dirs,
    set_aside,
    write_checkpoint,
)
from pipeline.training.config import ModelConfig, load_models
from pipeline.training.lock import model_lock
from solvers.persist import read_bundle, read_json, read_manifest, write_bundle, write_json

KEEP_RUN_DIRS = 5
DATASET_FORMAT = "rankstream.dataset"


class Decision(StrEnum):
    """What a run did (``summary["decision"]``): a ``str``, so JSON and XCom carry it as is."""

    PENDING = "pending"            # the dataset is built; training comes next
    NO_DATA = "no_data"            # the window holds nothing to train on
    UNCHANGED = "unchanged"        # the window the last checkpoint was trained on
    REPUBLISHED = "republished"    # unchanged, and Redis had lost it: published again
    TRAINED = "trained"            # trained, and not meant to publish (a trial run)
    PUBLISHED = "published"
    REJECTED = "rejected"          # the gate kept what is served
    FENCED = "fenced"              # the run lost its lease on the model: its flip was refused


@dataclass(frozen=True)
class RunContext:
    """What every step of one model's run reads: the model's config (parsed once), the
    settings, the Redis URL (``None``: a run that does not publish) and, from the dataset
    step on, the run directory."""

    model: str
    cfg: ModelConfig
    settings: Settings
    redis_url: str | None = None
    run_dir: Path | None = None
    fence: int | None = None      # the model's Redis lease token its publish is checked against

    @classmethod
    def of(cls, config, model: str, settings: Settings | None = None,
           redis_url: str | None = None, run_dir=None) -> "RunContext":
        """``config``: a models TOML path, or a dict of parsed configs; ``run_dir``: a path, or
        the URL of a run directory in the object store (copied here first)."""
        settings = settings or Settings.load()
        return cls(model, _model(config, model), settings, redis_url,
                   None if run_dir is None else remote.pull_run(settings, run_dir))

    def at(self, run_dir) -> "RunContext":
        return replace(self, run_dir=Path(run_dir))

    def client(self):
        if self.redis_url is None:
            raise ValueError("publishing needs a Redis URL (settings.redis_url or redis_url=)")
        from pipeline.serving.redis_client import as_client

        return as_client(self.redis_url)


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _model(config, name: str) -> ModelConfig:
    models = config if isinstance(config, dict) else load_models(config)
    if name not in models:
        raise KeyError(f"model {name!r} is not configured; configured: {sorted(models)}")
    return models[name]


def _store(settings: Settings):
    from pipeline.ingest.store import EventStore

    return EventStore.from_settings(settings)


def _runs_root(settings: Settings, model: str) -> Path:
    return settings.runs_dir / model


def _dataset(run_dir: Path) -> tuple[dict, dict]:
    return read_bundle(run_dir / "dataset", fmt=DATASET_FORMAT, version=1)


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


def dataset_step(ctx: RunContext, *, cold: bool = False) -> dict:
    """Build the dataset of the current store snapshot into a (new or existing) run dir."""
    cfg, model, settings = ctx.cfg, ctx.model, ctx.settings
    trainer = cfg.family.new_trainer()
    started = time.perf_counter()
    if not cold:
        remote.pull_checkpoints(settings, model)
    previous = None if cold else latest_checkpoint(settings.checkpoint_dir, model,
                                                   algorithm=cfg.algorithm)
    store = _store(settings)
    config_key = _digest(cfg.__dict__)
    snapshot = {f"{t}/{p}": o for (t, p), o in sorted(store.next_offsets(kinds=cfg.kinds).items())}
    if (previous is not None and previous.manifest.get("config_key") == config_key
            and previous.manifest.get("window", {}).get("end_offsets") == snapshot):
        # same store snapshot and config: the same window, known without building it
        return {"model": model, "decision": Decision.UNCHANGED, "run_dir": None,
                "checkpoint": str(previous.path),
                "reason": f"checkpoint {previous.run_id} was trained on this exact window"}
    arrays, info = trainer.build(store, cfg, None if previous is None else previous.arrays)
    data_key = _digest({"window": info["window"], "config": config_key})
    fingerprint = _digest({"data": data_key, "cold": cold,
                           "warm_from": None if previous is None else previous.run_id})
    for existing in _runs_root(settings, model).glob(f"*-{fingerprint}"):
        done = read_manifest(existing / "dataset", fmt=DATASET_FORMAT)
        if done:   # same snapshot, config and warm start as an earlier run: reuse it
            return {**_summary(done), "reused": True}
    # microseconds: run directories and checkpoints are ordered by name, and two runs of a
    # model within one second must not be ordered by their fingerprints
    run_key = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%f") + "-" + fingerprint
    run_dir = _runs_root(settings, model) / run_key
    summary = {"model": model, "algorithm": cfg.algorithm, "run_dir": str(run_dir),
               "run_key": run_key, "data_key": data_key, "config_key": config_key, **info,
               "warm_from": None if previous is None else str(previous.path),
               "dataset_seconds": round(time.perf_counter() - started, 3),
               "decision": Decision.NO_DATA if info["n_train"] == 0 else Decision.PENDING}
    write_bundle(run_dir / "dataset", arrays,
                 {"format": DATASET_FORMAT, "format_version": 1, **summary})
    return summary


def _summary(manifest: dict) -> dict:
    return {k: v for k, v in manifest.items() if k not in ("format", "format_version")}


def train_step(ctx: RunContext, *, trial: bool = False) -> dict:
    """Fit, warm-started from the checkpoint the dataset step chose; evaluate; write the
    run's artifact and checkpoint once. A checkpoint that cannot warm-start the model is set
    aside only by a run of the very config that made it; a ``trial`` run (one that will not
    publish) or a run of another config trains cold and leaves it alone."""
    run_dir, cfg, model = ctx.run_dir, ctx.cfg, ctx.model
    done = read_json(run_dir / "train.json")
    if done:
        return done
    trainer = cfg.family.new_trainer()
    ds, arrays = _dataset(run_dir)
    warm, warm_failed, last_arrays, same_config = None, None, None, False
    warm_from = ds["warm_from"] and remote.warm_start(ctx.settings, model, ds["warm_from"])
    if warm_from and warm_from.is_dir():    # the dataset step may have run on another host
        from pipeline.training.trainers import warm_state

        last = read_checkpoint(warm_from)
        last_arrays, warm = last.arrays, warm_state(last.arrays)
        same_config = last.manifest.get("config_key") == ds["config_key"]
    try:
        fitted, fit_info = trainer.fit(arrays, cfg, warm)
    except Exception as err:
        if warm is None:
            raise
        # a checkpoint that no longer fits the model (say its rank changed): train cold; if
        # that works, the checkpoint was the problem, and it is set aside for good
        fitted, fit_info = trainer.fit(arrays, cfg, None)
        warm_failed = f"{type(err).__name__}: {err}"
        if same_config and not trial:
            set_aside(warm_from, f"cannot warm-start this model ({warm_failed})")
        else:
            import warnings

            warnings.warn(f"checkpoint {Path(ds['warm_from']).name} cannot warm-start this "
                          f"model ({warm_failed}); trained cold, the checkpoint is left as it "
                          "is (it was made by another config, or this run will not publish)",
                          RuntimeWarning, stacklevel=2)
        warm = None
    metrics = trainer.evaluate(fitted.model, arrays, cfg)
    trained_at = datetime.now(timezone.utc).isoformat()
    fit_info.update(trainer.refit(fitted, arrays, cfg))   # the holdout learned from too
    artifact = trainer.artifact(fitted.served, arrays, cfg, params=cfg.params,
                                metrics=metrics, trained_at=trained_at)
    if artifact.kind != cfg.family.artifact_kind:   # the registry entry is the contract
        raise TypeError(f"the {cfg.algorithm} trainer made a {artifact.kind!r} artifact, its "
                        f"registry entry says {cfg.family.artifact_kind!r}")
    artifact.save(run_dir / "artifact")
    baselines = {}
    for name, (scores_metrics, scores) in trainer.baselines(arrays, cfg).items():
        baselines[name] = scores_metrics
        trainer.trivial_artifact(scores, arrays, algorithm=f"{cfg.algorithm}:{name}",
                                 params={"trivial": name}, metrics=scores_metrics,
                                 trained_at=trained_at, served_as="trivial",
                                 ).save(run_dir / f"trivial-{name}")
    checkpoint_arrays = trainer.checkpoint(fitted, arrays)
    challenger = _challenger(trainer, fitted, arrays, cfg, last_arrays, run_dir,
                             trained_at=trained_at)
    if challenger is not None:
        from pipeline.training.trainers import CHALLENGER_PREFIX

        checkpoint_arrays.update({CHALLENGER_PREFIX + k: v for k, v in challenger[1].items()})
        challenger = challenger[0]
    fit_info = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in fit_info.items()}
    write_checkpoint(run_dir / "checkpoint", arrays=checkpoint_arrays,
                     manifest={"model": model, "algorithm": cfg.algorithm,
                               "params": cfg.params,
                               "metrics": metrics, "window": ds["window"],
                               "data_key": ds["data_key"], "config_key": ds["config_key"],
                               "train": fit_info, "trained_at": trained_at})
    return write_json(run_dir / "train.json", {
        "model": model, "run_dir": str(run_dir), "warm_start": warm is not None, **fit_info,
        "metrics": metrics, "baselines": baselines, "trained_at": trained_at,
        **({"challenger": challenger} if challenger else {}),
        **({"warm_start_failed": warm_failed} if warm_failed else {})})


def _challenger(trainer, fitted, arrays, cfg, last_arrays, run_dir: Path, *,
                trained_at: str):
    """Fit the configured challenger (warm from the last checkpoint's challenger arrays), save
    its artifact (and its blend's) in the run directory; ``(summary, warm arrays)`` or None."""
    name = cfg.gate["challenger"]
    if name == "none":
        return None
    from pipeline.training.trainers import CHALLENGER_PREFIX, warm_state

    def save(artifact, served_as: str, metrics: dict) -> None:
        """Save as ``run_dir/served_as``, marked as what it serves."""
        artifact.served_as, artifact.algorithm = served_as, f"{cfg.algorithm}:{served_as}"
        artifact.metrics, artifact.trained_at = metrics, trained_at
        artifact.save(run_dir / served_as)

    warm = warm_state(last_arrays, CHALLENGER_PREFIX) if last_arrays else None
    ch = trainer.challenger(fitted, arrays, cfg, warm or None)
    save(ch.artifact, f"challenger-{ch.name}", ch.metrics)
    summary = {"name": ch.name, "metrics": ch.metrics, "tried": ch.tried,
               "fit_seconds": round(ch.fit_seconds, 4)}
    if ch.blend is not None:
        blend_metrics, blend_artifact, info = ch.blend
        save(blend_artifact, f"blend-{ch.name}", blend_metrics)
        summary["blend"] = {"metrics": blend_metrics, **info}
    return summary, ch.warm


def served_versions(settings: Settings, client, model: str) -> list:
    from pipeline.serving.versions import served_versions as kept

    return kept(model, client, namespace=settings.namespace)


def gate_step(ctx: RunContext) -> dict:
    """Choose what users get, in the metric's own direction:

    1. the model, or its challenger (``gate.challenger``) when the model is worse than it by
       more than ``gate.challenger_tolerance``, or their blend (``challenger_mode = "blend"``)
       when the blend beats both;
    2. that candidate must beat every trivial model by ``gate.trivial_margin``; otherwise
       ``gate.if_trivial = "publish_trivial"`` publishes the best trivial list instead, and so
       does a model that has nothing served yet (users are never served nothing);
    3. and must not be worse than the served version by more than ``gate.tolerance``.

    Records the decision, the reason, the lift over every trivial model and the margin to the
    challenger."""
    run_dir, cfg, model = ctx.run_dir, ctx.cfg, ctx.model
    done = read_json(run_dir / "gate.json")
    if done:
        return done
    trained = read_json(run_dir / "train.json")
    metric = cfg.metric
    sign = 1.0 if cfg.family.higher_is_better(metric) else -1.0
    own = trained["metrics"].get(metric)
    candidate, value, notes = "model", own, []
    ch = trained.get("challenger")
    vs_challenger = None
    if ch is not None:
        ch_value = ch["metrics"].get(metric)
        name = ch["name"]
        if ch_value is not None and own is not None:
            vs_challenger = round(sign * (own - ch_value), 5)
        if ch_value is not None and (own is None or sign * (own - ch_value)
                                     < -float(cfg.gate["challenger_tolerance"])):
            candidate, value = f"challenger-{name}", ch_value
            lost_by = None if own is None else sign * (ch_value - own)
            notes.append(f"the model's {metric} {_fmt(own)} loses to the challenger {name}'s "
                         f"{ch_value:.4f} by {_fmt(lost_by)} (tolerance "
                         f"{cfg.gate['challenger_tolerance']}): serving {name}")
        blend = ch.get("blend")
        blend_value = blend and blend["metrics"].get(metric)
        if (cfg.gate["challenger_mode"] == "blend" and blend_value is not None
                and sign * (blend_value - max((v for v in (own, ch_value) if v is not None),
                                              key=lambda v: sign * v)) > 0):
            candidate, value = f"blend-{name}", blend_value
            notes.append(f"the blend (weight {blend.get('weight')}) {blend_value:.4f} beats "
                         f"both: serving it")
    trivial = {name: m[metric] for name, m in trained.get("baselines", {}).items()
               if m.get(metric) is not None}
    lift = {name: None if value is None else round(sign * (value - v), 5)
            for name, v in trivial.items()}
    best_trivial = max(trivial, key=lambda n: sign * trivial[n]) if trivial else None
    margin = float(cfg.gate["trivial_margin"])
    publish = candidate
    served = served_versions(ctx.settings, ctx.client(), model)
    never_served = not served
    if value is None or (best_trivial is not None
                         and sign * (value - trivial[best_trivial]) < margin):
        why = (f"no {metric} could be computed (empty or one-class holdout)" if value is None
               else f"{metric} {value:.4f} does not beat the trivial {best_trivial} model "
                    f"({trivial[best_trivial]:.4f}) by the margin {margin}")
        if best_trivial is not None and (cfg.gate["if_trivial"] == "publish_trivial"
                                         or never_served):
            publish = f"trivial-{best_trivial}"
            why += ("; publishing the trivial list instead" if not never_served else
                    "; nothing is served yet, so the trivial list is published (marked "
                    "'trivial') rather than nothing")
        else:
            publish = None
        notes.append(why)
    else:
        current = [v for v in served if v.current]
        tolerance = float(cfg.gate["tolerance"])
        beats = (f"; beats {best_trivial} {trivial[best_trivial]:.4f}"
                 if best_trivial is not None else "")
        if not current or current[0].metrics.get(metric) is None:
            notes.append(f"nothing served yet; {metric} = {value:.4f}{beats}")
        else:
            was, version = current[0].metrics[metric], current[0].version
            if sign * (value - was) >= -tolerance:
                notes.append(f"{metric} {value:.4f} is within tolerance {tolerance} of served "
                             f"v{version} {was:.4f}{beats}")
            else:
                publish = None
                notes.append(f"{metric} {value:.4f} is worse than served v{version} "
                             f"{was:.4f} by more than tolerance {tolerance}")
    return write_json(run_dir / "gate.json", {
        "model": model, "run_dir": str(run_dir), "metric": metric, "value": value,
        "model_value": own, "trivial": trivial, "lift_over_trivial": lift,
        **({"challenger": ch["name"], "challenger_value": ch["metrics"].get(metric),
            "model_vs_challenger": vs_challenger} if ch is not None else {}),
        "publish": publish is not None, "publishes": publish, "reason": "; ".join(notes)})


def _fmt(value) -> str:
    return "none" if value is None else f"{value:.4f}"


def _artifact_dir(run_dir: Path, publishes: str) -> Path:
    """Where the gate's choice lives in the run directory."""
    return run_dir / ("artifact" if publishes == "model" else publishes)


def publish_step(ctx: RunContext) -> dict:
    """Publish the run's artifact as a new version, then commit its checkpoint; once per run
    (a retried step after a crash finds the version it already published by ``trained_at``)."""
    run_dir, cfg, model, settings = ctx.run_dir, ctx.cfg, ctx.model, ctx.settings
    done = read_json(run_dir / "published.json")
    if done:
        return done
    gate = read_json(run_dir / "gate.json")
    if not gate["publish"]:
        return write_json(run_dir / "published.json", {
            "model": model, "published": False, "version": None, "reason": gate["reason"]})
    from pipeline.serving.artifact import ModelArtifact
    from pipeline.serving.publish import FencedError, SupersededError, publish

    ds = _summary(read_manifest(run_dir / "dataset", fmt=DATASET_FORMAT))
    trained = read_json(run_dir / "train.json")
    client = ctx.client()
    published_artifact = _artifact_dir(run_dir, gate["publishes"])
    already = [v for v in served_versions(settings, client, model)
               if v.trained_at == trained["trained_at"] and v.status == "complete"]
    if already:
        version, seconds = already[0].version, 0.0
    else:
        artifact = published_artifact
        if not artifact.is_dir():    # moved into the checkpoint by an interrupted attempt
            artifact = run_dir / "checkpoint" / "artifact"
        try:
            result = publish(model, ModelArtifact.load(artifact), client,
                             top_k=int(cfg.publish["top_k"]),
                             keep_versions=int(cfg.publish["keep_versions"]),
                             namespace=settings.namespace, fence=ctx.fence)
        except SupersededError as err:     # FencedError too: the lease was lost
            return write_json(run_dir / "published.json", {
                "model": model, "published": False, "version": None, "reason": str(err),
                "fenced": isinstance(err, FencedError)})
        version, seconds = result.version, result.seconds
    # what was published (the model, or the trivial list the gate chose instead) is kept with
    # the checkpoint, so that ensure_served republishes the same thing after Redis lost it
    if published_artifact.is_dir():
        os.replace(published_artifact, run_dir / "checkpoint" / "artifact")
    ckpt = commit_checkpoint(run_dir / "checkpoint", settings.checkpoint_dir, model,
                             ds["run_key"])
    remote.commit_checkpoint(settings, model, ckpt)
    return write_json(run_dir / "published.json", {
        "model": model, "published": True, "version": version, "checkpoint": str(ckpt),
        "publish_seconds": round(seconds, 3), "reason": gate["reason"]})


def ensure_served(ctx: RunContext, checkpoint) -> dict:
    """After an "unchanged" window: if Redis serves nothing for the model (it was restarted
    empty or flushed), publish the last checkpoint's artifact again. A version that is served
    (even an older one an operator rolled back to) is left alone."""
    from pipeline.serving.artifact import ModelArtifact
    from pipeline.serving.publish import publish

    cfg, model, client = ctx.cfg, ctx.model, ctx.client()
    if served_versions(ctx.settings, client, model):
        return {"republished": False}
    result = publish(model, ModelArtifact.load(Path(checkpoint) / "artifact"), client,
                     top_k=int(cfg.publish["top_k"]),
                     keep_versions=int(cfg.publish["keep_versions"]),
                     namespace=ctx.settings.namespace, fence=ctx.fence)
    return {"republished": True, "version": result.version,
            "reason": f"Redis served nothing for {model!r}: republished checkpoint "
                      f"{Path(checkpoint).name} as version {result.version}"}


def prune_step(ctx: RunContext) -> dict:
    """Keep the newest checkpoints (``publish.keep_versions``) and run directories."""
    cfg, model, settings = ctx.cfg, ctx.model, ctx.settings
    removed = prune_checkpoints(settings.checkpoint_dir, model,
                                keep=int(cfg.publish["keep_versions"]))
    runs = run_dirs(settings.runs_dir, model)
    for old in runs[:-KEEP_RUN_DIRS]:
        shutil.rmtree(old, ignore_errors=True)
    remote.prune(settings, model, keep_checkpoints=int(cfg.publish["keep_versions"]),
                 keep_runs=KEEP_RUN_DIRS)
    return {"model": model, "checkpoints_removed": len(removed),
            "runs_removed": max(0, len(runs) - KEEP_RUN_DIRS)}


def run(model: str, config, *, settings: Settings | None = None, redis_url: str | None = None,
        cold: bool = False, publish: bool = True, ingest: bool = False,
        progress: bool = False, wait: float = 0.0) -> dict:
    """All steps for one model in this process, holding the model's retrain lock (waiting up
    to ``wait`` seconds for another run to finish); returns a summary for people and XCom."""
    ctx = RunContext.of(config, model, settings, redis_url)
    with model_lock(ctx.settings, model, wait=wait,
                    redis_url=ctx.redis_url if publish else None) as lease:
        return _run(replace(ctx, fence=lease and lease.token), cold, publish, ingest,
                    progress)


def outcome_path(settings: Settings, model: str) -> Path:
    """Where the model's last run outcome is kept: ``HOME/outcomes/{model}.json`` (beside the
    run directories, not among them)."""
    return Path(settings.home) / "outcomes" / f"{model}.json"


def record_outcome(settings: Settings, model: str, summary: dict, seconds: float) -> dict:
    """Keep what the model's last run decided, and how long it took (what ``rankstream
    metrics`` exports), at :func:`outcome_path`."""
    path = outcome_path(settings, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_json(path, {
        "model": model, "decision": str(summary.get("decision", "")),
        "reason": summary.get("reason", ""), "seconds": round(seconds, 3),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})


def _run(ctx: RunContext, cold: bool, publish: bool, ingest: bool, progress: bool) -> dict:
    started = time.perf_counter()
    summary = _run_steps(ctx, cold, publish, ingest, progress)
    if summary["dataset"].get("run_dir"):
        remote.push_run(ctx.settings, summary["dataset"]["run_dir"])
    summary["seconds"] = round(time.perf_counter() - started, 3)
    record_outcome(ctx.settings, ctx.model, summary, summary["seconds"])
    return summary


def _run_steps(ctx: RunContext, cold: bool, publish: bool, ingest: bool,
               progress: bool) -> dict:
    summary = {"model": ctx.model, "algorithm": ctx.cfg.algorithm}
    if ingest:
        summary["ingest"] = ingest_step(ctx, progress=progress)
    ds = dataset_step(ctx, cold=cold)
    summary["dataset"] = ds
    if ds["decision"] in (Decision.NO_DATA, Decision.UNCHANGED):
        summary.update(decision=ds["decision"], reason=ds.get("reason", "no events in window"))
        if ds["decision"] == Decision.UNCHANGED and publish and ctx.redis_url is not None:
            summary["served"] = ensure_served(ctx, ds["checkpoint"])
            if summary["served"]["republished"]:
                summary.update(decision=Decision.REPUBLISHED,
                               reason=summary["served"]["reason"])
        return summary
    from pipeline.training.report import report_step

    ctx = ctx.at(ds["run_dir"])
    dataset_upload = remote.start_push(ctx.settings, ctx.run_dir)     # overlaps the fit
    summary["train"] = train_step(ctx, trial=not publish)
    if dataset_upload is not None:
        dataset_upload.result()
    if publish:
        ctx.client()     # a Redis URL is given (the train command checked Redis is up)
        summary["gate"] = gate_step(ctx)
        # before the version goes live: a run killed after its flip leaves its run directory
        # (the window a served version was trained on) where every host finds it
        remote.push_run(ctx.settings, ctx.run_dir)
        summary["publish"] = publish_step(ctx)
        summary["report"] = report_step(ctx)["report"]
        summary["prune"] = prune_step(ctx)
        summary["decision"] = (Decision.PUBLISHED if summary["publish"]["published"] else
                               Decision.FENCED if summary["publish"].get("fenced") else
                               Decision.REJECTED)
        summary["reason"] = summary["publish"]["reason"]
    else:
        summary["report"] = report_step(ctx)["report"]
        summary["decision"] = Decision.TRAINED
    return summary
