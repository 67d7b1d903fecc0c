"""``rankstream models``: configured models with their served version, metric and last run."""

from __future__ import annotations

from pipeline.commands._redis import add_redis_arguments, fail, model_config, redis_session


def add_arguments(parser) -> None:
    add_redis_arguments(parser)


def run(args) -> int:
    from pipeline.model_config import load_models
    from pipeline.redis_client import as_client
    from pipeline.retrain import served_versions
    from pipeline.state import latest_checkpoint

    try:
        with redis_session(args) as (settings, url):
            client = as_client(url)
            rows = [("model", "algorithm", "served", "metric", "last checkpoint")]
            for name, cfg in load_models(model_config(settings)).items():
                current = [v for v in served_versions(settings, client, name) if v.current]
                served = f"v{current[0].version}" if current else "-"
                value = current[0].metrics.get(cfg.metric) if current else None
                metric = f"{cfg.metric} {value:.4f}" if value is not None else cfg.metric
                ckpt = latest_checkpoint(settings.checkpoint_dir, name)
                rows.append((name, cfg.algorithm, served, metric,
                             ckpt.run_id if ckpt else "-"))
    except (ValueError, OSError) as err:
        return fail("models", err)
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0
