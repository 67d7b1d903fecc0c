"""Metrics for ordinal regression (integer ratings): errors of predicted ranks and the ranking
quality of a continuous score.

* :func:`mae`, :func:`mse`, :func:`accuracy`: of predicted against true ratings (the NPSVOR
  paper's eqs. 37-38 and the fraction exactly right).
* :func:`rating_ndcg`: NDCG of the list ordered by a score (e.g. ``NPSVOR.predict_score``),
  with gain = the true rating itself (linear gain; shift the ratings first if the lowest one
  should count as irrelevant) and discount 1/log2(1 + position). Tied scores share their
  positions: a group of ties gets the average discount of the positions it occupies (the
  expected DCG over random orderings of the ties, as ``sklearn.metrics.ndcg_score`` with
  ``ignore_ties=False``).
"""

from __future__ import annotations

import numpy as np

from solvers._base import check_aligned

__all__ = ["mae", "mse", "accuracy", "rating_ndcg"]


def _pair(y_true, y_pred, what="y_pred"):
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    check_aligned(y_true=y_true, **{what: y_pred})
    if y_true.shape[0] == 0:
        raise ValueError("y_true is empty")
    for name, a in (("y_true", y_true), (what, y_pred)):
        bad = ~np.isfinite(a)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name} contains {a[i]!r} at position {i}; expected finite values")
    return y_true, y_pred


def mae(y_true, y_pred) -> float:
    """Mean absolute error (1/n) Σ |ŷ_i − y_i| (paper eq. 37).

    Examples
    --------
    >>> mae([1, 2, 3], [1, 3, 5])
    1.0
    """
    y_true, y_pred = _pair(y_true, y_pred)
    return float(np.mean(np.abs(y_pred - y_true)))


def mse(y_true, y_pred) -> float:
    """Mean squared error (1/n) Σ (ŷ_i − y_i)² (paper eq. 38).

    Examples
    --------
    >>> mse([1, 2, 3], [1, 3, 5])
    1.6666666666666667
    """
    y_true, y_pred = _pair(y_true, y_pred)
    return float(np.mean((y_pred - y_true) ** 2))


def accuracy(y_true, y_pred) -> float:
    """Fraction of exactly right ratings.

    Examples
    --------
    >>> accuracy([1, 2, 3, 4], [1, 2, 4, 4])
    0.75
    """
    y_true, y_pred = _pair(y_true, y_pred)
    return float(np.mean(y_true == y_pred))


def rating_ndcg(y_true, y_score, k=None) -> float:
    """NDCG@k of the items ordered by ``y_score`` (highest first), gain = true rating.

    DCG = Σ_{positions j < k} gain_(j) / log2(j + 2) with 0-based positions, tied scores
    averaged over their positions; divided by the DCG of the ratings sorted decreasingly.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        True ratings, ≥ 0 (they are the gains).
    y_score : array-like of shape (n,)
        Scores, higher first.
    k : int or None
        Cut-off (None: the whole list).

    Returns
    -------
    float
        In [0, 1]; 1 when the order by score sorts the ratings decreasingly.

    Examples
    --------
    >>> rating_ndcg([3, 1, 2], [0.9, 0.1, 0.5])
    1.0
    """
    gains, score = _pair(y_true, y_score, "y_score")
    if (gains < 0).any():
        i = int(np.flatnonzero(gains < 0)[0])
        raise ValueError(f"y_true contains {gains[i]!r} at position {i}; the ratings are the "
                         "gains and must be >= 0")
    n = gains.size
    k = n if k is None else int(k)
    if k < 1:
        raise ValueError(f"k is {k}, expected an integer >= 1 or None")
    discount = np.zeros(n)
    top = min(k, n)
    discount[:top] = 1.0 / np.log2(np.arange(top) + 2.0)
    ideal = float(np.sort(gains)[::-1] @ discount)
    if ideal == 0.0:
        raise ValueError("every rating is 0, so the ideal DCG is 0 and NDCG is undefined")
    order = np.argsort(-score, kind="stable")
    sorted_score = score[order]
    sorted_gain = gains[order]
    starts = np.flatnonzero(np.r_[True, sorted_score[1:] != sorted_score[:-1]])
    ends = np.r_[starts[1:], n]
    cum = np.r_[0.0, np.cumsum(discount)]
    group_gain = np.add.reduceat(sorted_gain, starts)
    dcg = float(np.sum(group_gain * (cum[ends] - cum[starts]) / (ends - starts)))
    return dcg / ideal
