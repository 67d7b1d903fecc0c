"""Choosing among the settings a search tried, and the warnings of a fit: the rules the tuners
(:mod:`pipeline.training.tuning`, AltSVM's and ALS's) and the trainers share.

Examples
--------
>>> tried = [{"params": {"rank": 64}, "validation": 0.301},
...          {"params": {"rank": 8}, "validation": 0.300},
...          {"params": {"rank": 2}, "validation": 0.250}]
>>> cheapest_near_best(tried, 0.01, cost=lambda p: p["rank"])["params"]
{'rank': 8}
>>> setting_key({"rank": 8, "alpha": 1.0}) == setting_key({"alpha": 1.0, "rank": 8})
True
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import contextmanager


def setting_key(params: dict) -> tuple:
    """A hashable key of a setting, the same whatever the order of its parameters."""
    return tuple(sorted(params.items()))


def cheapest_near_best(tried: list, tolerance: float, cost: Callable[[dict], float],
                       higher_is_better: bool = True) -> dict | None:
    """The cheapest entry of ``tried`` (``{"params", "validation", ...}``; by ``cost`` of its
    params) among those that score within ``tolerance`` (relative) of the best validation
    score, the better score on equal cost; None when none was scored. A difference that small
    is the validation split's noise, and the cheaper model retrains faster at every run."""
    sign = 1.0 if higher_is_better else -1.0
    scored = [t for t in tried if t["validation"] is not None]
    if not scored:
        return None
    top = max(sign * t["validation"] for t in scored)
    near = [t for t in scored if sign * t["validation"] >= top - tolerance * abs(top)]
    return min(near, key=lambda t: (cost(t["params"]), -sign * t["validation"]))


class NearBest(dict):
    """A search's fits by setting key, keeping only those :func:`cheapest_near_best` may still
    choose: scored within ``tolerance`` (relative) of the best so far (a later best only
    narrows the set). A search's every fit kept to the end was most of a run's memory growth
    (ALS: 12 fits of 40k users x up to 128 factors; item-kNN: 62 MB of neighbours each).

    >>> kept = NearBest(0.0)
    >>> kept.offer("a", 0.2, "fit a"); kept.offer("b", 0.3, "fit b"); kept.offer("c", None, "c")
    >>> sorted(kept)
    ['b']
    """

    def __init__(self, tolerance: float = 0.0, higher_is_better: bool = True):
        super().__init__()
        self.tolerance, self.sign, self.scores = float(tolerance), 1.0 if higher_is_better \
            else -1.0, {}

    def offer(self, key, value: float | None, fit) -> None:
        """Keep ``fit`` under ``key`` if its score ``value`` is near the best (None: never)."""
        if value is None:
            return
        self[key], self.scores[key] = fit, self.sign * float(value)
        top = max(self.scores.values())
        for k in [k for k, v in self.scores.items() if v < top - self.tolerance * abs(top)]:
            del self[k], self.scores[k]


@contextmanager
def collected_warnings(reemit: bool = False):
    """Catch every warning of the block; yields a list that, after the block, holds each
    distinct one once as ``"Category: message"``. With ``reemit``, each distinct warning is
    warned again after the block (once, where it was first raised), for the caller's filters.

    >>> with collected_warnings() as said:
    ...     warnings.warn("no convergence", RuntimeWarning)
    ...     warnings.warn("no convergence", RuntimeWarning)
    >>> said
    ['RuntimeWarning: no convergence']
    """
    said: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield said
    for w in caught:
        line = f"{w.category.__name__}: {w.message}"
        if line not in said:
            said.append(line)
            if reemit:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
