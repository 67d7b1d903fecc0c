"""Grid search on a validation split: how every family's challenger is tuned.

A challenger (:class:`pipeline.training.trainers.Challenger`) is tuned on a validation part
carved out of the training rows by a stable hash (:func:`validation_mask`: a row, or a query,
stays on its side across runs, whatever else arrives), each setting of a small grid fitted on
the rest and scored there by the gate metric (:func:`grid_search`), then refitted on all
training rows at the best setting. A warm run (the last run's choice known) tries only that
value and its neighbours in the grid (:func:`neighbours`).

Examples
--------
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
import warnings

import numpy as np

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
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fitted = fit(params)
    said = []
    for w in caught:
        line = f"{w.category.__name__}: {w.message}"
        if line not in said:
            said.append(line)
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
