"""``rankstream models``: configured models with their served version, metric and last run."""

from __future__ import annotations

from pipeline.cli._redis import add_redis_arguments, fail, model_config, redis_client, settings_of


def add_arguments(parser) -> None:
    add_redis_arguments(parser)


def _fallback_share(client, model: str, namespace: str, current) -> str:
    """Share of the served version's lookups answered from the fallback list (unknown users:
    a window that drops most users shows here first)."""
    from pipeline.serving.versions import answer_counts

    if not current:
        return "-"
    counts = answer_counts(model, client, namespace=namespace).get(current[0].version, {})
    total = sum(counts.values())
    return f"{counts.get('fallback', 0) / total:.1%} of {total:,}" if total else "-"


def run(args) -> int:
    import redis

    from pipeline.training.checkpoints import latest_checkpoint
    from pipeline.training.config import load_models
    from pipeline.training.retrain import served_versions

    try:
        models = load_models(model_config(settings_of(args)))
        with redis_client(args) as (settings, client):
            rows = [("model", "algorithm", "served", "metric", "fallback answers",
                     "last checkpoint")]
            for name, cfg in models.items():
                current = [v for v in served_versions(settings, client, name) if v.current]
                served = f"v{current[0].version}" if current else "-"
                value = current[0].metrics.get(cfg.metric) if current else None
                metric = f"{cfg.metric} {value:.4f}" if value is not None else cfg.metric
                ckpt = latest_checkpoint(settings.checkpoint_dir, name)
                rows.append((name, cfg.algorithm, served, metric,
                             _fallback_share(client, name, settings.namespace, current),
                             ckpt.run_id if ckpt else "-"))
    except (ValueError, OSError, redis.RedisError) as err:
        return fail("models", err)
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0
