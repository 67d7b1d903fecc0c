"""``rankstream train MODEL``: dataset -> warm-started fit -> evaluate -> gate -> publish."""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
    parser.add_argument("--no-progress", action="store_true",
                        help="no status line (the phase, the settings scored, the seconds) "
                             "on a terminal")
    add_redis_arguments(parser, kafka=True)     # --ingest drains Kafka first


def format_summary(s: dict) -> str:
    """A few readable lines from :func:`pipeline.training.retrain.run`'s summary: first what
    users get now and why (:mod:`pipeline.training.report_wording`), then the data, the fit,
    every candidate and the publish."""
    lines = _head(s)
    ds = s.get("dataset", {})
    if ds.get("reused"):
        lines.append(f"  reused   run {Path(ds['run_dir']).name}: the same data, config and warm "
                     "start as this call's (its results below; --cold with the same window "
                     "reuses a cold run too)")
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
        lines += _fit_lines(tr)
        lines += _candidate_lines(s)
    gate = s.get("gate")
    if gate and gate.get("trivial"):
        lifts = ", ".join(f"{name} {value:.4f} (lift {gate['lift_over_trivial'][name]:+.4f})"
                          for name, value in gate["trivial"].items())
        lines.append(f"  trivial  {gate['metric']}: {lifts}")
    pub = s.get("publish")
    if pub and pub.get("published"):
        from pipeline.training.report_wording import Candidate

        lines.append(f"  publish  version {pub['version']} serves "
                     f"{Candidate(gate.get('publishes') or 'model', None).label} "
                     f"({pub['publish_seconds']:.2f} s)")
    if "seconds" in s:
        lines.append(f"  total    {s['seconds']:.1f} s wall time")
    return "\n".join(lines)


TRAINED = ("published", "rejected", "trained", "fenced")


def _head(s: dict) -> list[str]:
    """``model NAME (ALGORITHM): what users get now``, then ``why``, wrapped; a run that
    trained nothing says its decision and reason."""
    import textwrap

    from pipeline.training.report_wording import served_sentences

    first = f"model {s['model']} ({s['algorithm']}): "
    if not s.get("train") or str(s.get("decision")) not in TRAINED:
        return [first + str(s.get("decision", ""))
                + (f" - {s['reason']}" if s.get("reason") else "")]
    what, why = served_sentences(s["train"], s.get("gate"), s.get("publish"),
                                 algorithm=s.get("algorithm"))
    return [first + what, textwrap.fill(why, width=100, initial_indent="  why      ",
                                        subsequent_indent=" " * 11)]


def _fit_lines(tr: dict) -> list[str]:
    """The model's fit: warm or cold, its λ, its tuning, its refit, its metrics."""
    start = "warm start" if tr["warm_start"] else "cold start"
    lines = [f"  fit      {start}, {tr['n_iter']} iterations, {tr['fit_seconds']:.2f} s"]
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
        tried = tuning["tried"]
        sample = f" (fits on a sample of {tuning['users']:,} users)" if "users" in tuning else ""
        how = {"tuned": f"{len(tried)} settings scored on validation in "
                        f"{tuning['seconds']:.1f} s{sample}",
               "config": f"the config's settings ({tried[0].get('skipped') if tried else ''})"
               }.get(tuning["source"], "the last run's choice (the data grew less than 25%)")
        ratio = f", reg_ratio {tuning['reg_ratio']:.3g}" if "reg_ratio" in tuning else ""
        lines.append(f"  tuned    {chosen}{ratio}: {how}")
    if "refit_seconds" in tr:
        lines.append(f"  refit    on every event, the holdout too: {tr['refit_iterations']} "
                     f"iterations, {tr['refit_seconds']:.2f} s")
    for said in tr.get("warnings", []):
        lines.append(f"  WARNING  {said}")
    metrics = ", ".join(f"{k} {v:.4f}" for k, v in tr["metrics"].items())
    lines.append(f"  metrics  the model: {metrics}")
    return lines


def _candidate_lines(s: dict) -> list[str]:
    """One line per challenger (all of them) and one for the blend: the gate's metric on the
    holdout, with its interval when the run has one, and what their search cost."""
    from pipeline.training.report_wording import candidates, number, run_metric

    tr = s["train"]
    ch = tr.get("challenger")
    metric = run_metric(tr, s.get("gate"), s.get("algorithm"))
    if not ch or metric is None:
        return []
    found = {c.choice: c for c in candidates(tr, metric)}
    lines, fitted = [], [ch, *ch.get("others", [])]
    width = max(len(str(c["name"])) for c in fitted)
    for c in fitted:
        mine = found[f"challenger-{c['name']}"]
        settings = sum(1 for t in c.get("tried", [])
                       if "params" in t and "blend_weight" not in t["params"])
        cost = (f"not fitted: {c['skipped']}" if c.get("skipped") else
                f"tuned: {settings} settings, {c['fit_seconds']:.2f} s")
        lines.append(f"  challenger {c['name']:<{width}}  {metric} "
                     f"{number(mine.value, mine.interval)} "
                     f"({cost})")
        if c.get("warning"):
            lines.append(f"  WARNING  {c['warning']}")
    blend = ch.get("blend")
    if blend:
        mine = found[f"blend-{blend.get('name', ch['name'])}"]
        lines.append(f"  blend    {mine.short.removeprefix('blend ')} (weight "
                     f"{blend.get('weight')}): {metric} {number(mine.value, mine.interval)}")
    return lines


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


def run(args) -> int:
    import warnings

    from solvers import CollapseWarning, ConvergenceWarning, DegenerateFitWarning

    # the solver's warnings are in the summary's WARNING lines (and the report): not raw on
    # stderr too (a degenerate TopPush fit printed its reason twice)
    with warnings.catch_warnings():
        for category in (CollapseWarning, ConvergenceWarning, DegenerateFitWarning):
            warnings.filterwarnings("ignore", category=category)
        return _run(args)


def _run(args) -> int:
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
                                  ingest=args.ingest,
                                  progress=sys.stderr.isatty() and not args.no_progress,
                                  wait=args.wait)
    except (ValueError, KeyError, OSError, ModelBusyError) as err:
        return fail("train", err)
    print(json.dumps(summary, indent=2, default=str) if args.json else format_summary(summary))
    return {retrain.Decision.REJECTED: 3, retrain.Decision.FENCED: 4}.get(
        summary.get("decision"), 0)       # see cli/__init__.py
