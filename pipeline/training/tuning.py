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

from pipeline.training import progress
from pipeline.training.config import TUNE_KEYS
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
        progress.step(len(tried), max_settings)
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


def pattern_search(axes: dict, start: dict, score, *, max_settings: int,
                   budget_seconds: float, higher_is_better: bool = True, cost=None,
                   tolerance: float = 0.0, ridges: tuple = (), first_step: int = 2,
                   design: tuple = ()) -> tuple[dict, list, str | None]:
    """A compass search over grids, coarse steps then fine, with joint moves along ``ridges``:
    the chosen setting, every tried one, and a warning when the wall-clock cap ended it.

    ``design``: settings scored after ``start``, before any move (they count against
    ``max_settings``); the search moves from the best of them, so one start's basin does not
    decide the answer.

    Every ordered axis moves by ``step`` grid positions (``first_step``, halved after a pass
    without improvement, down to 1), each pair in ``ridges`` moves together (two settings
    that trade off, ALS's regularization and alpha, make a diagonal ridge on whose flank a
    one-axis-at-a-time search stops), and a two-value axis flips every pass. The count
    (``max_settings``, or a pass at step 1 without improvement) ends it, so runs repeat
    exactly; ``budget_seconds`` only caps a machine far slower than that, and then says so.

    >>> axes = {"a": [1, 2, 3, 4, 5, 6, 7], "b": [1, 2, 3, 4, 5, 6, 7]}
    >>> ridge = lambda p: -abs(p["a"] - p["b"]) * 10 - abs(p["a"] - 6)   # best at (6, 6)
    >>> best, tried, warning = pattern_search(axes, {"a": 2, "b": 2}, ridge, max_settings=30,
    ...                                       budget_seconds=60, ridges=(("a", "b"),))
    >>> best["params"], warning
    ({'a': 6, 'b': 6}, None)
    """
    for name, value in start.items():
        if value not in axes[name]:
            raise ValueError(f"start {name}={value!r} is not in its grid {axes[name]}")
    sign = 1.0 if higher_is_better else -1.0
    began = time.perf_counter()
    tried: list = []
    seen: dict = {}
    stopped = {"clock": False}

    def run(params: dict):
        key = setting_key(params)
        if key in seen:
            return seen[key]
        t = time.perf_counter()
        value = score(dict(params))
        seen[key] = value = None if value is None or not np.isfinite(value) else float(value)
        tried.append({"params": dict(params), "validation": value,
                      "seconds": round(time.perf_counter() - t, 3)})
        progress.step(len(tried), max_settings)
        return value

    def out_of_budget() -> bool:
        if len(tried) >= max_settings:
            return True
        if time.perf_counter() - began >= budget_seconds:
            stopped["clock"] = True
            return True
        return False

    best_params, best_value = dict(start), run(start)
    for params in design:
        value = None if out_of_budget() else run(params)
        if value is not None and (best_value is None or sign * value > sign * best_value):
            best_params, best_value = dict(params), value
    step = max(int(first_step), 1)
    while not out_of_budget():
        improved = False
        for deltas in _moves(axes, best_params, step, ridges):
            if out_of_budget():
                break
            params = _moved(axes, best_params, deltas)
            if params is None or setting_key(params) in seen:
                continue
            value = run(params)
            if value is not None and (best_value is None or sign * value > sign * best_value):
                best_params, best_value, improved = params, value, True
        if not improved:
            if step == 1:
                break
            step //= 2
    best = next(t for t in tried if t["params"] == best_params)
    if cost is not None:
        best = cheapest_near_best(tried, tolerance, cost, higher_is_better) or best
    return best, tried, (_clock_warning(budget_seconds, len(tried), max_settings)
                         if stopped["clock"] else None)


def _clock_warning(budget_seconds: float, n_tried: int, max_settings: int) -> str:
    return (f"tuning stopped by the wall-clock cap (budget_seconds {budget_seconds:g}) after "
            f"{n_tried} of {max_settings} settings: the machine was slower than the count "
            "assumes, so this choice depends on its load")


def _moved(axes: dict, params: dict, deltas: dict) -> dict | None:
    """``params`` moved by ``deltas`` grid positions per axis; None off a grid's end."""
    out = dict(params)
    for name, d in deltas.items():
        j = axes[name].index(params[name]) + d
        if not 0 <= j < len(axes[name]):
            return None
        out[name] = axes[name][j]
    return out


def _moves(axes: dict, at: dict, step: int, ridges) -> list:
    """One pass of :func:`pattern_search`'s moves from ``at``: each axis ± ``step`` (a choice
    of two: the other value), then each ridge's axes together."""
    out = []
    for name, grid in axes.items():
        if len(grid) == 2:
            out.append({name: 1 - 2 * grid.index(at[name])})
            continue
        s = min(step, len(grid) - 1)
        out += [{name: +s}, {name: -s}]
    for a, b in ridges:
        out += [{a: +step, b: +step}, {a: -step, b: -step}]
    return out


REUSE_GROWTH = 1.25  # a warm run keeps the last tuning's choice until its rows (or comparisons)
                     # outgrow the count it was chosen on by this factor
REFERENCE_ROWS = 100_000   # tune.max_settings is the count at this many training rows


def settings_for_size(max_settings: int, n_rows: int, least: int = 3) -> int:
    """The settings a search may score on ``n_rows`` training rows: ``max_settings`` up to
    :data:`REFERENCE_ROWS`, then fewer as the square root of the growth (each fit costs
    about its rows, so the search's work grows as the square root of the data), never below
    ``least``. It depends on the data only, so a loaded machine cannot shrink it.

    >>> settings_for_size(24, 80_000), settings_for_size(24, 400_000), settings_for_size(6, 10**8)
    (24, 12, 3)
    """
    scale = min(1.0, (REFERENCE_ROWS / max(int(n_rows), 1)) ** 0.5)
    return max(min(int(least), int(max_settings)), int(round(int(max_settings) * scale)))


def caps(cfg, n_rows: int, key: str = "challenger_settings") -> dict:
    """A search's budget from a config's ``tune`` table (its defaults where it has none):
    ``max_settings`` counted per data size from ``tune[key]``, ``budget_seconds`` a cap."""
    tune = {k: cfg.tune.get(k, default) for k, default in TUNE_KEYS.items()}
    return {"max_settings": settings_for_size(int(tune[key]), n_rows),
            "budget_seconds": float(tune["budget_seconds"])}


VALIDATION_FRACTION = 0.2   # of the hash range; held out of the training rows for tuning


def validation_mask(index: np.ndarray, seed: int) -> np.ndarray:
    """Validation rows among the training rows (a fifth of them), by a stable hash of
    ``index`` (row or query ids) with ``seed + 1`` (``seed`` makes the holdout, so the two
    splits are independent)."""
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
