"""``rankstream models``: configured models with their served version, metric and last run."""

from __future__ import annotations

from pipeline.cli._redis import add_redis_arguments, fail, model_config, redis_client, settings_of


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per model (for scripts and monitors)")
    add_redis_arguments(parser)


def _fallback_share(client, model: str, namespace: str, current) -> str:
    """Share of the served version's lookups answered from the fallback list (unknown users:
    a window that drops most users shows here first)."""
    from pipeline.serving.versions import fallback_share

    if not current:
        return "-"
    share, total = fallback_share(model, client, current[0].version, namespace=namespace)
    return f"{share:.1%} of {total:,}" if total else "-"


def run(args) -> int:
    import redis

    from pipeline.refresh.stats import read_stats
    from pipeline.serving.versions import served_versions
    from pipeline.training.checkpoints import latest_checkpoint
    from pipeline.training.config import load_models
    from pipeline.training.run_store import open_run_store

    try:
        models = load_models(model_config(settings_of(args)))
        with redis_client(args) as (settings, client):
            rows = [("model", "algorithm", "served", "metric", "fallback answers",
                     "last checkpoint", "healed by the refresher")]
            notes, records = [], []
            for name, cfg in models.items():
                current = [v for v in served_versions(name, client, namespace=settings.namespace)
                           if v.current]
                served = f"v{current[0].version}" if current else "-"
                if current and current[0].served_as != "model":
                    served += f" ({current[0].served_as})"
                warning = _window_warning(settings, name)
                if warning:
                    notes.append(f"{name}: WARNING {warning}")
                value = current[0].metrics.get(cfg.metric) if current else None
                metric = f"{cfg.metric} {value:.4f}" if value is not None else cfg.metric
                open_run_store(settings).pull_checkpoints(name)   # another host's (object store)
                ckpt = latest_checkpoint(settings.checkpoint_dir, name)
                share = _fallback_share(client, name, settings.namespace, current)
                refreshed = read_stats(settings.home, name) or {}
                heals, last_heal = refreshed.get("heals", 0), refreshed.get("last_heal")
                # the served version says when it was republished, whichever host healed it;
                # this host's refresher stats say how often
                healed_at = current[0].healed_at if current else ""
                last_heal = healed_at or last_heal
                rows.append((name, cfg.algorithm, served, metric, share,
                             ckpt.run_id if ckpt else "-",
                             f"{heals}x, last {last_heal}" if heals else
                             f"v{current[0].version} at {healed_at}" if healed_at else "-"))
                records.append({
                    "model": name, "algorithm": cfg.algorithm,
                    "served_version": current[0].version if current else None,
                    "served_as": current[0].served_as if current else None,
                    "metric": cfg.metric, "value": value,
                    "fallback_answers": None if share == "-" else share,
                    "last_checkpoint": ckpt.run_id if ckpt else None, "warning": warning,
                    "heals": heals, "last_heal": last_heal})
    except (ValueError, OSError, redis.RedisError) as err:
        return fail("models", err)
    if args.json:
        import json

        print(json.dumps(records, indent=2, default=str))
        return 0
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    for note in notes:
        print(note)
    return 0


def _window_warning(settings, model: str) -> str | None:
    """The window warning of the model's latest run (a window that drops most events or
    users), or None."""

    from pipeline.training.checkpoints import run_dirs
    from pipeline.training.run_store import open_run_store
    from pipeline.training.run_types import DATASET_FORMAT
    from solvers.persist import read_manifest

    open_run_store(settings).pull_latest_runs(model)     # the newest run may be another host's
    for run in reversed(run_dirs(settings.runs_dir, model)):
        manifest = read_manifest(run / "dataset", fmt=DATASET_FORMAT)
        if manifest:
            return manifest.get("window", {}).get("warning")
    return None
