"""How sure a run's holdout metrics are: each candidate's metric with a bootstrap interval over
users, and each candidate's lift over the best trivial model with its (paired) interval.

The train step computes them where it computes the holdout metrics, from the same fits (the
evaluated model, each challenger's and the blend's evaluated factors, the trivial models'
item scores), and keeps them in ``train.json`` as ``holdout_intervals``::

    {"metric": "topk_ndcg@10", "unit": "users", "units": 943, "resamples": 1000,
     "level": LEVEL, "seed": 0, "method": "percentile bootstrap over users", "seconds": 0.41,
     "candidates": {"model": {"value": 0.1856, "interval": [0.171, 0.2]}, "challenger-als":
                    ..., "blend-als+ease": ..., "trivial-popularity": ...},
     "lift_over": "popularity",
     "lift": {"model": {"value": -0.0241, "interval": [-0.035, -0.013]}, ...}}

Candidates are named as the gate's choices are (``str`` of a
:class:`~pipeline.training.run_types.Choice`), so the summary and the report look the served
one up by what the gate ``publishes``; a lift is in the metric's direction (positive: better
than the trivial model). The units are what the family's gate metric averages over
(:meth:`~pipeline.training.trainers.Trainer.holdout_unit`): users for the per-user top-K
metrics, queries for a search model's per-query NDCG@k, held-out positives for average
precision (the mean of the precision at each positive's rank), held-out events for MAE;
another metric gets no interval (``None``), and a candidate whose per-unit mean does not
reproduce its recorded metric is left out rather than shown with an interval around another
number. The resampling is :mod:`pipeline.training.bootstrap`.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from pipeline.training.bootstrap import (
    LEVEL,
    N_RESAMPLES,
    percentile_interval,
    resampled_means,
)
from pipeline.training.per_user_metrics import per_user_topk  # noqa: F401 - re-exported

log = logging.getLogger(__name__)


def candidate_scorers(model, metrics: dict, baselines: dict, challenger, seed: int) -> dict:
    """``{choice: (scorer, recorded metrics)}`` of a run's candidates: the evaluated model,
    each fitted challenger and the blend (their evaluated factors: TRAIN + VALIDATION, what
    the holdout scored), and each trivial model (``baselines``: the trainer's ``{name:
    (metrics, item scores)}``)."""
    from pipeline.training.trainers.factors import factors_of

    out = {"model": (model, metrics)}
    fitted = {"model": model}
    if challenger is not None:
        for c in [challenger, *challenger.others]:
            if c.skipped is None and c.evaluated is not None:
                out[f"challenger-{c.name}"] = (c.evaluated, c.metrics)
                fitted[c.name] = c.evaluated
        if challenger.blend is not None:
            from pipeline.training.trainers.blends import blend

            blend_metrics, _, info = challenger.blend
            a, b = (fitted.get(n) for n in info.get("pair") or ())
            if a is not None and b is not None:
                out[f"blend-{info['name']}"] = (
                    blend(factors_of(a), factors_of(b), float(info["weight"]), seed),
                    blend_metrics)
    for name, (trivial_metrics, scores) in baselines.items():
        out[f"trivial-{name}"] = (np.asarray(scores, np.float32), trivial_metrics)
    return out


def intervals(columns: dict, metric: str, higher_is_better: bool, *, unit: str = "users",
              n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """The ``holdout_intervals`` entry (see the module) of per-unit ``columns`` (``{choice:
    values}``, the same units, ``unit`` naming them, in the same order in each)."""
    names = list(columns)
    table = np.column_stack([columns[n] for n in names])
    means = resampled_means(table, n_resamples=n_resamples, seed=seed)
    values = table.mean(axis=0)
    sign = 1.0 if higher_is_better else -1.0
    out = {"metric": metric, "unit": unit, "units": int(table.shape[0]),
           "resamples": int(n_resamples), "level": LEVEL, "seed": int(seed),
           "method": f"percentile bootstrap over {unit}",
           "candidates": {n: {"value": round(float(values[j]), 5),
                              "interval": [round(x, 5) for x in percentile_interval(means[:, j])]}
                          for j, n in enumerate(names)}}
    trivial = [j for j, n in enumerate(names) if n.startswith("trivial-")]
    if trivial:
        t = max(trivial, key=lambda j: sign * values[j])
        out["lift_over"] = names[t].removeprefix("trivial-")
        out["lift"] = {n: {"value": round(float(sign * (values[j] - values[t])), 5),
                           "interval": [round(x, 5) for x in percentile_interval(
                               sign * (means[:, j] - means[:, t]))]}
                       for j, n in enumerate(names) if j not in trivial}
    return out


def holdout_intervals(trainer, arrays: dict, cfg, *, model, metrics: dict, baselines: dict,
                      challenger=None, n_resamples: int = N_RESAMPLES) -> dict | None:
    """The run's ``holdout_intervals`` (see the module), or None when its gate metric is not
    a mean over units (:meth:`~pipeline.training.trainers.Trainer.holdout_unit`). Never
    fails a run: an error is logged and gives None."""
    unit = trainer.holdout_unit(arrays, cfg)
    if unit is None:
        return None
    started = time.perf_counter()
    seed = int(cfg.evaluation.get("seed", 0))
    try:
        columns = {}
        for choice, (scorer, recorded) in candidate_scorers(
                model, metrics, baselines, challenger, seed).items():
            values = trainer.per_unit_holdout(scorer, arrays, cfg)
            want = recorded.get(cfg.metric)
            if values.size and want is not None and abs(values.mean() - want) <= 1e-6:
                columns[choice] = values
            else:
                log.warning("%s: no interval (per-unit mean %s, recorded %s %s)", choice,
                            values.mean() if values.size else None, cfg.metric, want)
        if not columns:
            return None
        out = intervals(columns, cfg.metric, cfg.family.higher_is_better(cfg.metric),
                        unit=unit, n_resamples=n_resamples, seed=seed)
    except Exception as err:    # noqa: BLE001 - an interval is for people: never fail a run
        log.warning("no holdout intervals (%s: %s); the run goes on", type(err).__name__, err)
        return None
    return {**out, "seconds": round(time.perf_counter() - started, 3)}


def gate_lifts(found: dict, metric: str) -> dict:
    """The gate's lift intervals (:class:`~pipeline.training.gate.Scores`' ``trivial_lifts``,
    ``lift_over``, ``units``) from a run's ``holdout_intervals`` of the gate ``metric`` ({}
    without them)."""
    if found.get("metric") != metric or not found.get("lift"):
        return {}
    return {"trivial_lifts": {n: v["interval"] for n, v in found["lift"].items()},
            "lift_over": found["lift_over"], "units": f"{found['units']:,} {found['unit']}"}
