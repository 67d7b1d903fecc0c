"""Settings chosen on a validation split: a coordinate search over small grids within a budget
(AltSVM, and its ALS challenger), and a plain grid search (the other families' challengers).

Each axis is an ordered grid of values (ranks, comparisons per user, losses, ...); the search
starts at a given point and, axis by axis, scores the neighbouring grid values of the current
best setting, moving whenever one scores higher, until a whole sweep brings no improvement, the
``max_settings``-th setting has been scored or ``budget_seconds`` have passed. Every scored
setting is recorded with its validation score and time, for the run report.

Reproducibility: every fit is seeded, so the search is the same from run to run as long as
``max_settings`` ends it; ``budget_seconds`` is a cap on wall time, and a search it cuts short
depends on the machine's speed and load (the report's list of tried settings shows where it
stopped). Where runs must repeat exactly, give a budget with room to spare, so that
``max_settings`` (or a sweep without improvement) ends the search.

Why a coordinate search: the quality surfaces of factor models over rank, sample size and
regularization are smooth and nearly separable (a better λ at one rank is a good λ at the
next), so moving one axis at a time finds a near-best point with a handful of fits, where a
full grid costs their product; and it spends the same number of fits on any model given the
same caps, which is how two models get "the same tuning effort".

>>> axes = {"a": [1, 2, 3, 4], "b": ["x", "y"]}
>>> best, tried = coordinate_search(axes, {"a": 1, "b": "x"},
...                                 lambda p: -abs(p["a"] - 3) + (p["b"] == "y"),
...                                 max_settings=20, budget_seconds=10)
>>> best["params"], best["validation"], len(tried)
({'a': 3, 'b': 'y'}, 1, 6)

A challenger of the other families is tuned on a validation part carved out of the training
rows by a stable hash (:func:`validation_mask`: a row, or a query, stays on its side across
runs), each setting of a small grid fitted on the rest and scored there (:func:`grid_search`),
then refitted on all training rows at the best setting; a warm run tries the last choice and
its neighbours in the grid (:func:`neighbours`).

>>> best, tried = grid_search([{"C": 0.1}, {"C": 1.0}, {"C": 10.0}],
...                           fit=lambda p: p["C"], score=lambda c: -abs(c - 1.2),
...                           higher_is_better=True)
>>> best, [t["params"]["C"] for t in tried]
({'C': 1.0}, [0.1, 1.0, 10.0])
>>> neighbours((0.1, 1.0, 10.0, 100.0), 9.0)
(1.0, 10.0, 100.0)
"""

from __future__ import annotations

import time

import numpy as np

from pipeline.training.selection import cheapest_near_best, collected_warnings, setting_key


def coordinate_search(axes: dict, start: dict, score, *, max_settings: int,
                      budget_seconds: float, higher_is_better: bool = True, cost=None,
                      tolerance: float = 0.0) -> tuple[dict, list]:
    """Chosen setting and every tried one (``{"params", "validation", "seconds"}``).

    Parameters
    ----------
    axes : dict
        Axis name -> ordered list of values.
    start : dict
        The first setting (one value per axis, each in its grid).
    score : callable
        ``score(params) -> float or None`` on the validation split (None: not scorable, never
        chosen).
    max_settings, budget_seconds
        Caps on the settings scored and on the time spent; the first setting is always scored.
    cost, tolerance
        ``cost(params) -> float``: the chosen setting is the cheapest of those that score
        within ``tolerance`` (relative) of the best, since a difference that small is within
        the validation split's noise and the cheaper model retrains faster every run.
    """
    for name, value in start.items():
        if value not in axes[name]:
            raise ValueError(f"start {name}={value!r} is not in its grid {axes[name]}")
    sign = 1.0 if higher_is_better else -1.0
    began = time.perf_counter()
    tried: list = []
    seen: dict = {}

    def run(params: dict):
        key = setting_key(params)
        if key in seen:
            return seen[key]
        t = time.perf_counter()
        value = score(dict(params))
        seen[key] = value
        tried.append({"params": dict(params), "validation": value,
                      "seconds": round(time.perf_counter() - t, 3)})
        return value

    def better(a, b) -> bool:
        return a is not None and (b is None or sign * a > sign * b)

    def out_of_budget() -> bool:
        return (len(tried) >= max_settings
                or time.perf_counter() - began >= budget_seconds)

    best_params, best_value = dict(start), run(start)
    improved = True
    while improved and not out_of_budget():
        improved = False
        for name, grid in axes.items():
            at = grid.index(best_params[name])
            for j in (at + 1, at - 1):
                if not 0 <= j < len(grid) or out_of_budget():
                    continue
                params = {**best_params, name: grid[j]}
                value = run(params)
                if better(value, best_value):
                    best_params, best_value, improved = params, value, True
                    break   # continue this axis from the new point on the next sweep
    best = next(t for t in tried if t["params"] == best_params)
    if cost is not None:
        best = cheapest_near_best(tried, tolerance, cost, higher_is_better) or best
    return best, tried


VALIDATION_FRACTION = 0.2   # of the hash range; held out of the training rows for tuning


def validation_mask(index: np.ndarray, seed: int) -> np.ndarray:
    """Validation rows among the training rows, by a stable hash of ``index`` (row or query
    ids) with ``seed + 1`` (``seed`` makes the holdout). The hash is multiplicative, so this
    band of the hash range is disjoint from a 0.2 holdout's: a quarter of the training rows
    then, none of the held-out ones."""
    from pipeline.training.datasets import stable_split

    return stable_split(np.asarray(index), VALIDATION_FRACTION, int(seed) + 1)


def timed_fit(fit, params: dict):
    """``(fitted, seconds, warnings)``: ``fit(params)``, its warnings caught and returned as
    ``"Category: message"`` lines (a tuning fit that does not converge is noted, not shouted)."""
    started = time.perf_counter()
    with collected_warnings() as said:
        fitted = fit(params)
    return fitted, time.perf_counter() - started, said


def grid_search(settings, fit, score, higher_is_better: bool):
    """Fit every setting on the tuning part and score it on the validation part.

    Parameters
    ----------
    settings : iterable of dict
        The parameters of each fit, in order of preference on a tie (list the cheaper or more
        regularised first).
    fit : callable
        ``fit(params)`` -> a fitted model (on the tuning rows).
    score : callable
        ``score(model)`` -> the validation value of the gate metric, or None when it cannot
        be computed (the setting then cannot be chosen).
    higher_is_better : bool
        The metric's direction.

    Returns
    -------
    best : dict or None
        The parameters of the best validation value (the first of equal ones); None when no
        setting could be scored.
    tried : list of dict
        Per setting: ``params``, ``validation`` (float or None), ``seconds`` (fit and score),
        and ``warnings`` when the fit raised some.
    """
    sign = 1.0 if higher_is_better else -1.0
    best, best_value, tried = None, -np.inf, []
    for params in settings:
        params = dict(params)
        model, seconds, said = timed_fit(fit, params)
        started = time.perf_counter()
        value = score(model)
        value = None if value is None or not np.isfinite(value) else float(value)
        entry = {"params": params, "validation": value,
                 "seconds": round(seconds + time.perf_counter() - started, 4)}
        if said:
            entry["warnings"] = said
        tried.append(entry)
        if value is not None and sign * value > best_value:
            best, best_value = params, sign * value
    return best, tried


def skipped(params: dict, reason: str) -> dict:
    """A ``tried`` entry for a setting that was not fitted, and why."""
    return {"params": dict(params), "validation": None, "seconds": 0.0, "skipped": reason}


def neighbours(grid, last) -> tuple:
    """The grid value nearest ``last`` (on a log scale) and the values beside it."""
    grid = tuple(grid)
    i = int(np.argmin(np.abs(np.log(np.asarray(grid, float)) - np.log(float(last)))))
    return grid[max(0, i - 1):i + 2]
