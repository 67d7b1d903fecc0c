"""``rankstream train MODEL``: dataset -> warm-started fit -> evaluate -> gate -> publish."""

from __future__ import annotations

import json
import sys

from pipeline.cli._redis import (
    add_redis_arguments,
    fail,
    model_config,
    redis_session,
    settings_of,
)


def add_arguments(parser) -> None:
    parser.add_argument("model", help="model name from the config file ([models.NAME])")
    parser.add_argument("--cold", action="store_true", help="ignore checkpoints: cold start")
    parser.add_argument("--no-publish", action="store_true", help="train and evaluate only")
    parser.add_argument("--ingest", action="store_true",
                        help="drain the model's Kafka topics into the store first")
    parser.add_argument("--wait", nargs="?", type=float, const=3600.0, default=0.0,
                        metavar="SECONDS", help="if another run of the model is going on, wait "
                        "for it (up to SECONDS, default an hour) instead of exiting")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_redis_arguments(parser)


def format_summary(s: dict) -> str:
    """A few readable lines from :func:`pipeline.training.retrain.run`'s summary."""
    lines = [f"model {s['model']} ({s['algorithm']}): {s['decision']}"
             + (f" - {s['reason']}" if s.get("reason") else "")]
    ds = s.get("dataset", {})
    if ds.get("stats"):
        stats = ", ".join(f"{k} {v:,}" for k, v in ds["stats"].items()
                          if isinstance(v, (int, float)))
        lines.append(f"  data     {stats}  ({ds.get('dataset_seconds', 0):.2f} s)")
        window = ds.get("window", {})
        if window.get("warning"):
            lines.append(f"  WARNING  {window['warning']}")
        elif window.get("n_dropped"):
            lines.append(f"  window   kept {window['n_events']:,} events, dropped "
                         f"{window['n_dropped']:,} older ones")
        if ds["stats"].get("warning"):
            lines.append(f"  WARNING  {ds['stats']['warning']}")
    tr = s.get("train")
    if tr:
        start = "warm start" if tr["warm_start"] else "cold start"
        lines.append(f"  fit      {start}, {tr['n_iter']} iterations, {tr['fit_seconds']:.2f} s")
        if "reg" in tr:
            path = tr.get("path")
            chosen = (f" chosen on a path of {len(path)} points: "
                      + ", ".join(f"{p['ratio']:.3g}→{p['score']:.4f}" for p in path)
                      if path else "")
            how = {"path": f" = {tr.get('reg_ratio', 0):.3g} x reg_max{chosen}",
                   "last path": " (the last path's λ per comparison: the data grew little)"
                   }.get(tr.get("reg_source"), " (from the config)")
            lines.append(f"  reg      {tr['reg']:.4g}{how}")
        tuning = tr.get("tuning")
        if tuning:
            chosen = ", ".join(f"{k}={v}" for k, v in tuning["choice"].items())
            how = (f"{len(tuning['tried'])} settings scored on validation in "
                   f"{tuning['seconds']:.1f} s" if tuning["source"] == "tuned"
                   else "the last run's choice (the data grew less than 25%)")
            lines.append(f"  tuned    {chosen}, reg_ratio {tuning['reg_ratio']:.3g}: {how}")
        if "refit_seconds" in tr:
            lines.append(f"  refit    on every event, the holdout too: {tr['refit_iterations']} "
                         f"iterations, {tr['refit_seconds']:.2f} s")
        for said in tr.get("warnings", []):
            lines.append(f"  WARNING  {said}")
        metrics = ", ".join(f"{k} {v:.4f}" for k, v in tr["metrics"].items())
        lines.append(f"  metrics  {metrics}")
        ch = tr.get("challenger")
        if ch:
            metric = (s.get("gate") or {}).get("metric") or next(iter(ch["metrics"]), "")
            value = ch["metrics"].get(metric)
            blend = (ch.get("blend") or {}).get("metrics", {}).get(metric)
            lines.append(f"  rival    {ch['name']} {metric} {_num(value)} (tuned: "
                         f"{sum(1 for t in ch['tried'] if 'params' in t)} settings, "
                         f"{ch['fit_seconds']:.2f} s)"
                         + (f"; blend {_num(blend)}" if blend is not None else ""))
    gate = s.get("gate")
    if gate and gate.get("trivial"):
        lifts = ", ".join(f"{name} {value:.4f} (lift {gate['lift_over_trivial'][name]:+.4f})"
                          for name, value in gate["trivial"].items())
        lines.append(f"  trivial  {gate['metric']}: {lifts}")
    pub = s.get("publish")
    if pub and pub.get("published"):
        serves = {"model": "the model"}.get(gate["publishes"], gate["publishes"])
        lines.append(f"  publish  version {pub['version']} serves {serves} "
                     f"({pub['publish_seconds']:.2f} s)")
    return "\n".join(lines)


def check_redis(url: str) -> None:
    """One line, before any training, when the Redis a run will publish to does not answer."""
    import redis

    from pipeline.serving.redis_client import as_client
    from pipeline.settings import redact

    try:
        as_client(url, timeout=2.0, retries=1).ping()
    except (redis.RedisError, OSError) as err:
        raise ValueError(f"Redis at {redact(url)} does not answer ({type(err).__name__}: "
                         f"{err}): start it, fix --redis-url, or train with --no-publish"
                         ) from None


def _num(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def run(args) -> int:
    from pipeline.training import retrain
    from pipeline.training.config import load_models
    from pipeline.training.lock import ModelBusyError

    try:
        config = model_config(settings_of(args))
        models = config if isinstance(config, dict) else load_models(config)
        if args.model not in models:      # before any server starts or any data is read
            raise ValueError(f"model {args.model!r} is not configured; configured: "
                           f"{sorted(models)}")
        with redis_session(args) as (settings, url):
            if not args.no_publish:
                check_redis(url)      # before minutes of training, not after
            summary = retrain.run(args.model, models, settings=settings,
                                  redis_url=url, cold=args.cold, publish=not args.no_publish,
                                  ingest=args.ingest, progress=sys.stderr.isatty(),
                                  wait=args.wait)
    except (ValueError, KeyError, OSError, ModelBusyError) as err:
        return fail("train", err)
    print(json.dumps(summary, indent=2, default=str) if args.json else format_summary(summary))
    return {retrain.Decision.REJECTED: 3, retrain.Decision.FENCED: 4}.get(
        summary.get("decision"), 0)       # see cli/__init__.py
