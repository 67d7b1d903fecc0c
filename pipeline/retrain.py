"""The retrain loop: "retrain model M from the last window of events, starting from its previous
duals, publish if it is good". Airflow runs the steps as separate tasks; the CLI runs them in
one process through :func:`run`.

Every step reads and writes one run directory ``{home}/runs/{model}/{run_key}`` whose key is a
fingerprint of the data snapshot (store offsets), the model config and the warm-start source, so
each step is idempotent: a repeated or retried step finds its output and returns it, and running
the same window twice publishes one version. A checkpoint (the next run's warm start) is
committed only by a run that passed the gate; a failed or rejected run never becomes a warm
start.

Steps: :func:`ingest_step` -> :func:`dataset_step` -> :func:`train_step` (fit with warm start)
-> :func:`gate_step` (evaluate, compare with the published metric) -> :func:`publish_step`
-> :func:`prune_step`. Each returns a small JSON-able summary (paths, metrics, timings).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from pipeline.model_config import ModelConfig, load_models
from pipeline.settings import Settings
from pipeline.state import latest_checkpoint, prune_checkpoints, run_dirs, write_checkpoint

KEEP_RUN_DIRS = 5


def _json_write(path: Path, obj: dict) -> dict:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    tmp.replace(path)
    return obj


def _json_read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _model(config, name: str) -> ModelConfig:
    models = config if isinstance(config, dict) else load_models(config)
    if name not in models:
        raise KeyError(f"model {name!r} is not configured; configured: {sorted(models)}")
    return models[name]


def _trainer(cfg: ModelConfig):
    from pipeline.trainers import TRAINERS

    return TRAINERS[cfg.algorithm]


def _store(settings: Settings):
    from pipeline.store import EventStore

    return EventStore.from_settings(settings)


def _runs_root(settings: Settings, model: str) -> Path:
    return Path(settings.home) / "runs" / model


def ingest_step(settings: Settings, kinds, *, progress: bool = False) -> dict:
    """Drain the kinds' Kafka topics into the store (nothing to do in embedded mode)."""
    if not settings.kafka_bootstrap:
        return {"ingested": 0, "mode": "embedded"}
    from pipeline.events import default_topic
    from pipeline.ingest import ingest_kafka

    summary = ingest_kafka({default_topic(k): k for k in kinds}, settings=settings,
                           until_end=True, progress=progress)
    return {"ingested": sum(summary.events.values()),
            "dead_letters": sum(summary.dead_letters.values()),
            "seconds": round(summary.seconds, 3), "mode": "kafka"}


def dataset_step(config, model: str, settings: Settings, *, cold: bool = False) -> dict:
    """Build the dataset of the current store snapshot into a (new or existing) run dir."""
    cfg = _model(config, model)
    trainer = _trainer(cfg)
    started = time.perf_counter()
    previous = None if cold else latest_checkpoint(settings.checkpoint_dir, model,
                                                   algorithm=cfg.algorithm)
    store = _store(settings)
    config_key = _digest(cfg.__dict__)
    snapshot = {f"{t}/{p}": o for (t, p), o in sorted(store.next_offsets().items())}
    if (previous is not None and previous.manifest.get("config_key") == config_key
            and previous.manifest.get("window", {}).get("end_offsets") == snapshot):
        # same store snapshot and config: the same window, known without building it
        return {"model": model, "decision": "unchanged", "run_dir": None,
                "reason": f"checkpoint {previous.run_id} was trained on this exact window"}
    arrays, info = trainer.build(store, cfg, None if previous is None else previous.arrays)
    data_key = _digest({"window": info["window"], "config": config_key})
    fingerprint = _digest({"data": data_key, "cold": cold,
                           "warm_from": None if previous is None else previous.run_id})
    for existing in _runs_root(settings, model).glob(f"*-{fingerprint}"):
        done = _json_read(existing / "dataset.json")
        if done:   # same snapshot, config and warm start as an earlier run: reuse it
            return {**done, "reused": True}
    run_key = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + fingerprint
    run_dir = _runs_root(settings, model) / run_key
    run_dir.mkdir(parents=True, exist_ok=True)
    np.savez(run_dir / "dataset.npz", **arrays)
    summary = {"model": model, "algorithm": cfg.algorithm, "run_dir": str(run_dir),
               "run_key": run_key, "data_key": data_key, "config_key": config_key, **info,
               "warm_from": None if previous is None else str(previous.path),
               "dataset_seconds": round(time.perf_counter() - started, 3),
               "decision": "no_data" if info["n_train"] == 0 else "pending"}
    return _json_write(run_dir / "dataset.json", summary)


def _load(run_dir: Path, name: str) -> dict:
    with np.load(run_dir / name, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def train_step(config, model: str, run_dir) -> dict:
    """Fit, warm-started from the checkpoint the dataset step chose; save the candidate."""
    run_dir = Path(run_dir)
    done = _json_read(run_dir / "train.json")
    if done:
        return done
    cfg = _model(config, model)
    trainer = _trainer(cfg)
    ds = _json_read(run_dir / "dataset.json")
    arrays = _load(run_dir, "dataset.npz")
    warm = None
    if ds["warm_from"]:
        from pipeline.state import read_checkpoint
        from pipeline.trainers import warm_state

        warm = warm_state(read_checkpoint(ds["warm_from"]).arrays)
    fitted, fit_info = trainer.fit(arrays, cfg, warm)
    metrics = trainer.evaluate(fitted, arrays, cfg)
    np.savez(run_dir / "candidate.npz", **trainer.checkpoint(fitted, arrays))
    fitted.save(run_dir / "model")
    summary = {"model": model, "run_dir": str(run_dir), "warm_start": warm is not None,
               **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in fit_info.items()},
               "metrics": metrics, "trained_at": datetime.now(timezone.utc).isoformat()}
    return _json_write(run_dir / "train.json", summary)


def served_versions(settings: Settings, client, model: str) -> list:
    from pipeline.model_versions import versions
    from pipeline.redis_layout import UnknownModelError

    try:
        return versions(model, client, namespace=settings.namespace)
    except UnknownModelError:
        return []


def published_metric(settings: Settings, redis_url: str, model: str, metric: str):
    """The recorded ``metric`` of the version ``model`` currently serves (None if none)."""
    from pipeline.redis_client import as_client

    current = [v for v in served_versions(settings, as_client(redis_url), model) if v.current]
    return (current[0].metrics.get(metric), current[0].version) if current else (None, None)


def gate_step(config, model: str, run_dir, settings: Settings, redis_url: str) -> dict:
    """Publish only if the candidate's metric is not worse than the served version's by more
    than the configured tolerance; record the decision and the reason."""
    run_dir = Path(run_dir)
    done = _json_read(run_dir / "gate.json")
    if done:
        return done
    cfg = _model(config, model)
    trained = _json_read(run_dir / "train.json")
    value = trained["metrics"].get(cfg.metric)
    served, version = published_metric(settings, redis_url, model, cfg.metric)
    tolerance = float(cfg.gate.get("tolerance", 0.0))
    if value is None:
        ok, reason = False, f"no {cfg.metric} could be computed (empty or one-class holdout)"
    elif served is None:
        ok, reason = True, f"nothing served yet; {cfg.metric} = {value:.4f}"
    elif value >= served - tolerance:
        ok, reason = True, (f"{cfg.metric} {value:.4f} >= served v{version} {served:.4f} "
                            f"- tolerance {tolerance}")
    else:
        ok, reason = False, (f"{cfg.metric} {value:.4f} < served v{version} {served:.4f} "
                             f"- tolerance {tolerance}")
    return _json_write(run_dir / "gate.json", {
        "model": model, "run_dir": str(run_dir), "metric": cfg.metric, "value": value,
        "served_value": served, "served_version": version, "publish": ok, "reason": reason})


def publish_step(config, model: str, run_dir, settings: Settings, redis_url: str) -> dict:
    """Commit the checkpoint and publish a new version, once per run (a retried step after a
    crash finds the version it already published by its ``trained_at`` stamp)."""
    run_dir = Path(run_dir)
    done = _json_read(run_dir / "published.json")
    if done:
        return done
    gate = _json_read(run_dir / "gate.json")
    if not gate["publish"]:
        return _json_write(run_dir / "published.json", {
            "model": model, "published": False, "version": None, "reason": gate["reason"]})
    from pipeline.publish import publish
    from pipeline.redis_client import as_client

    cfg = _model(config, model)
    trainer = _trainer(cfg)
    ds, trained = _json_read(run_dir / "dataset.json"), _json_read(run_dir / "train.json")
    ckpt = write_checkpoint(settings.checkpoint_dir, model, ds["run_key"],
                            arrays=_load(run_dir, "candidate.npz"),
                            manifest={"algorithm": cfg.algorithm, "params": cfg.params,
                                      "metrics": trained["metrics"], "window": ds["window"],
                                      "data_key": ds["data_key"],
                                      "config_key": ds["config_key"], "train": trained})
    client = as_client(redis_url)
    already = [v for v in served_versions(settings, client, model)
               if v.trained_at == trained["trained_at"] and v.status == "complete"]
    if already:
        version, seconds = already[0].version, 0.0
    else:
        fitted = _estimator_class(cfg).load(run_dir / "model")
        art = trainer.artifact(fitted, _load(run_dir, "dataset.npz"), cfg,
                               params=cfg.params, metrics=trained["metrics"],
                               trained_at=trained["trained_at"])
        result = publish(model, art, client, top_k=int(cfg.publish["top_k"]),
                         keep_versions=int(cfg.publish["keep_versions"]),
                         namespace=settings.namespace)
        version, seconds = result.version, result.seconds
    return _json_write(run_dir / "published.json", {
        "model": model, "published": True, "version": version, "checkpoint": str(ckpt),
        "publish_seconds": round(seconds, 3), "reason": gate["reason"]})


def _estimator_class(cfg: ModelConfig):
    import solvers

    return {"altsvm": solvers.AltSVM, "toppush": solvers.TopPush}[cfg.algorithm]


def prune_step(config, model: str, settings: Settings) -> dict:
    """Keep the newest checkpoints (``publish.keep_versions``) and run directories."""
    cfg = _model(config, model)
    removed = prune_checkpoints(settings.checkpoint_dir, model,
                                keep=int(cfg.publish["keep_versions"]))
    runs = run_dirs(Path(settings.home) / "runs", model)
    for old in runs[:-KEEP_RUN_DIRS]:
        shutil.rmtree(old, ignore_errors=True)
    return {"model": model, "checkpoints_removed": len(removed),
            "runs_removed": max(0, len(runs) - KEEP_RUN_DIRS)}


def run(model: str, config, *, settings: Settings | None = None, redis_url: str | None = None,
        cold: bool = False, publish: bool = True, ingest: bool = False,
        progress: bool = False) -> dict:
    """All steps for one model in this process; returns a summary for people and XCom."""
    settings = settings or Settings.load()
    cfg = _model(config, model)
    started = time.perf_counter()
    summary = {"model": model, "algorithm": cfg.algorithm}
    if ingest:
        summary["ingest"] = ingest_step(settings, cfg.kinds, progress=progress)
    ds = dataset_step(config, model, settings, cold=cold)
    summary["dataset"] = ds
    if ds["decision"] in ("no_data", "unchanged"):
        summary.update(decision=ds["decision"], reason=ds.get("reason", "no events in window"))
        return summary
    summary["train"] = train_step(config, model, ds["run_dir"])
    if publish:
        if redis_url is None:
            raise ValueError("publishing needs a Redis URL (settings.redis_url or redis_url=)")
        gate = gate_step(config, model, ds["run_dir"], settings, redis_url)
        summary["gate"] = gate
        summary["publish"] = publish_step(config, model, ds["run_dir"], settings, redis_url)
        summary["prune"] = prune_step(config, model, settings)
        summary["decision"] = "published" if summary["publish"]["published"] else "rejected"
        summary["reason"] = gate["reason"]
    else:
        summary["decision"] = "trained"
    summary["seconds"] = round(time.perf_counter() - started, 3)
    return summary
