"""Metrics for bipartite ranking (one list, binary relevance): Pos@Top, AP, NDCG, AUC.

Every function takes ``y_true`` in {0, 1} or {−1, +1} (1 / +1 is relevant) and real
``y_score`` (higher is ranked first), needs both classes present and costs O(N log N).
Ties between scores are handled as follows, and each function says so:

* ``pos_at_top``: a positive tied with the highest-scored negative is *not* above it
  (the indicator I(f(x⁺) ≤ max f(x⁻)) of the paper's eq. 2 counts it as a loss).
* ``average_precision``: tied scores form one threshold (the step-wise precision-recall curve of
  ``sklearn.metrics.average_precision_score``).
* ``ndcg``: the gain of a group of tied scores is spread evenly over the positions the group
  occupies, i.e. the expected DCG over random orderings of the ties (as
  ``sklearn.metrics.ndcg_score`` with ``ignore_ties=False``); gain = relevance (0/1), discount
  1/log2(1 + rank), over the whole list.
* ``auc``: a tied positive-negative pair counts ½ (Mann-Whitney U; equal to
  ``sklearn.metrics.roc_auc_score``).
"""

from __future__ import annotations

import numpy as np

from solvers._base import check_aligned

__all__ = ["pos_at_top", "average_precision", "ndcg", "auc"]


def _check(y_true, y_score):
    y_true = np.asarray(y_true)
    y_score = np.asarray(y_score, dtype=np.float64)
    check_aligned(y_true=y_true, y_score=y_score)
    labels = np.unique(y_true)
    if not (np.isin(labels, [0, 1]).all() or np.isin(labels, [-1, 1]).all()):
        raise ValueError(f"y_true contains the labels {labels[:5].tolist()}; expected labels in "
                         f"{{0, 1}} or {{-1, +1}}")
    pos = y_true == 1
    n_pos = int(pos.sum())
    if n_pos == 0 or n_pos == pos.size:
        raise ValueError(f"y_true has only one class ({pos.size} labels, {n_pos} positive); "
                         f"a bipartite ranking metric needs positives and negatives")
    bad = ~np.isfinite(y_score)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"y_score contains {y_score[i]!r} at position {i}; expected finite "
                         f"values")
    return pos, y_score


def pos_at_top(y_true, y_score):
    """Fraction of positives scored strictly above the highest-scored negative.

    Parameters
    ----------
    y_true : array-like of shape (n,)
        Labels in {0, 1} or {−1, +1}.
    y_score : array-like of shape (n,)
        Scores, higher first.

    Returns
    -------
    float
        In [0, 1]. A positive tied with the top negative does not count.

    Examples
    --------
    >>> pos_at_top([1, 0, 1, 1], [0.9, 0.5, 0.5, 0.1])
    0.3333333333333333
    """
    pos, s = _check(y_true, y_score)
    return float(np.mean(s[pos] > s[~pos].max()))


def average_precision(y_true, y_score, *, per_positive=False):
    """Average precision: Σ_k (R_k − R_{k−1}) P_k over the distinct score thresholds.

    Tied scores are one threshold (same value as ``sklearn.metrics.average_precision_score``).
    Each positive adds 1/#positives of the precision at its threshold, so AP is the mean over
    the positives of that precision; ``per_positive=True`` returns those values (in the
    positives' input order), for bootstrap intervals over the positives.

    Examples
    --------
    >>> round(average_precision([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1]), 4)
    0.8333
    >>> average_precision([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1], per_positive=True).tolist()
    [1.0, 0.6666666666666666]
    """
    pos, s = _check(y_true, y_score)
    order = np.argsort(-s, kind="stable")
    s_sorted = s[order]
    rel = pos[order].astype(np.float64)
    last_of_group = np.r_[np.flatnonzero(np.diff(s_sorted) != 0.0), s.size - 1]
    tp = np.cumsum(rel)[last_of_group]
    precision = tp / (last_of_group + 1.0)
    if per_positive:
        group = np.empty(s.size, dtype=np.int64)      # each row's threshold, in input order
        group[order] = np.searchsorted(last_of_group, np.arange(s.size))
        return precision[group[pos]]
    recall_step = np.diff(np.r_[0.0, tp]) / tp[-1]
    return float(np.sum(recall_step * precision))


def ndcg(y_true, y_score):
    """NDCG over the whole list with binary gains and discount 1/log2(1 + rank).

    A group of tied scores shares its gains evenly over its positions (the expected DCG over
    random orderings of the ties; ``sklearn.metrics.ndcg_score`` with ``ignore_ties=False``).

    Examples
    --------
    >>> round(ndcg([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1]), 4)
    0.9197
    """
    pos, s = _check(y_true, y_score)
    n = s.size
    discount = 1.0 / np.log2(np.arange(2, n + 2))
    order = np.argsort(-s, kind="stable")
    s_sorted = s[order]
    rel = pos[order].astype(np.float64)
    starts = np.r_[0, np.flatnonzero(np.diff(s_sorted) != 0.0) + 1]
    group_gain = np.add.reduceat(rel, starts)
    group_disc = np.add.reduceat(discount, starts)
    group_size = np.diff(np.r_[starts, n])
    dcg = float(np.sum(group_gain / group_size * group_disc))
    ideal = float(discount[: int(pos.sum())].sum())
    return dcg / ideal


def auc(y_true, y_score):
    """Area under the ROC curve = P(score of a positive > score of a negative).

    A tied positive-negative pair counts ½ (Mann-Whitney U with average ranks; equal to
    ``sklearn.metrics.roc_auc_score``).

    Examples
    --------
    >>> auc([1, 0, 1, 0], [0.9, 0.8, 0.8, 0.1])
    0.875
    """
    pos, s = _check(y_true, y_score)
    order = np.argsort(s, kind="stable")
    s_sorted = s[order]
    starts = np.r_[0, np.flatnonzero(np.diff(s_sorted) != 0.0) + 1]
    ends = np.r_[starts[1:], s.size]
    avg_rank = (starts + ends + 1) / 2.0  # 1-based average rank of each tie group
    ranks = np.empty(s.size)
    ranks[order] = np.repeat(avg_rank, ends - starts)
    m = int(pos.sum())
    n = s.size - m
    return float((ranks[pos].sum() - m * (m + 1) / 2.0) / (m * n))
