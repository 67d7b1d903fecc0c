"""Settings chosen on a validation split within a budget: a coordinate search over small grids.

Each axis is an ordered grid of values (ranks, comparisons per user, losses, ...); the search
starts at a given point and, axis by axis, scores the neighbouring grid values of the current
best setting, moving whenever one scores higher, until a whole sweep brings no improvement, the
``max_settings``-th setting has been scored or ``budget_seconds`` have passed. Every scored
setting is recorded with its validation score and time, for the run report.

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
"""

from __future__ import annotations

import time


def coordinate_search(axes: dict, start: dict, score, *, max_settings: int,
                      budget_seconds: float, higher_is_better: bool = True) -> tuple[dict, list]:
    """Best setting and every tried one (``{"params", "validation", "seconds"}``).

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
    """
    for name, value in start.items():
        if value not in axes[name]:
            raise ValueError(f"start {name}={value!r} is not in its grid {axes[name]}")
    sign = 1.0 if higher_is_better else -1.0
    began = time.perf_counter()
    tried: list = []
    seen: dict = {}

    def run(params: dict):
        key = tuple(sorted(params.items(), key=lambda kv: kv[0]))
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
    return best, tried
