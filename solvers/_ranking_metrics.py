"""Ranking metrics for per-user recommendation: NDCG@k, Precision@k, pairwise accuracy.

Definitions follow Park et al. (2015, §5): NDCG@k with gains 2^rating − 1 over each user's
test items, Precision@k as (1/k) · (relevant items among the top k), and the fraction of
held-out comparisons ordered correctly. Inputs are flat per-(user, item) arrays, so no dense
score matrix is needed; everything is vectorized (one sort, no loop over users).

Ties in predicted scores are broken by input position (a stable sort), so results are
deterministic; the reference implementations in the tests do the same.
"""

from __future__ import annotations

import numpy as np

from solvers._base import check_aligned, check_finite

__all__ = ["ndcg_at_k", "precision_at_k", "pairwise_accuracy", "topk_hit_metrics"]


def _check(users, values, scores, k, values_name):
    users = np.asarray(users)
    values = np.asarray(values, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    check_aligned(users=users, **{values_name: values}, scores=scores)
    if users.shape[0] == 0:
        raise ValueError("no (user, item) rows given; expected at least one")
    if int(k) != k or k < 1:
        raise ValueError(f"k is {k!r}, expected an integer >= 1")
    check_finite(values_name, values)
    nan = np.isnan(scores)
    if nan.any():
        p = int(np.flatnonzero(nan)[0])
        raise ValueError(f"scores contains nan at position {p}; expected numbers (±inf is "
                         "allowed)")
    return users, values, scores, int(k)


def _rank_within_user(users, keys):
    """Sort rows by user, then by ``keys`` descending (stable).

    Returns the order, each sorted row's 0-based rank within its user and its user group
    number, and the users of the groups (ascending).
    """
    order = np.lexsort((-keys, users))
    u = users[order]
    new = np.ones(u.shape[0], dtype=bool)
    new[1:] = u[1:] != u[:-1]
    group = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    rank = np.arange(u.shape[0]) - starts[group]
    return order, rank, group, u[starts]


def ndcg_at_k(users, ratings, scores, k=10, *, per_user=False):
    """Mean NDCG@k over users, gains 2^rating − 1, ranking each user's given items by score.

    NDCG@k(i) = DCG@k(predicted order) / DCG@k(ideal order), DCG@k = Σ_{p=1..k}
    (2^{M_iπ(p)} − 1) / log2(p + 1), over the items given for user i (Park et al. 2015, §5.2).
    Users whose ideal DCG is 0 (all gains 0) are left out of the mean.

    Parameters
    ----------
    users : array-like of int, shape (n,)
        User of each (user, item) row.
    ratings : array-like of float, shape (n,)
        True rating of the row (the relevance M_ij).
    scores : array-like of float, shape (n,)
        Predicted score of the row.
    k : int
        Cut-off.
    per_user : bool
        Also return the users and their NDCG values.

    Returns
    -------
    float, or (float, users, values) with ``per_user=True``

    Examples
    --------
    >>> from solvers._ranking_metrics import ndcg_at_k
    >>> ndcg_at_k([0, 0, 0], [5, 3, 1], [0.9, 0.5, 0.1], k=2)
    1.0
    >>> round(ndcg_at_k([0, 0], [1, 3], [0.9, 0.1], k=1), 4)
    0.1429
    """
    users, ratings, scores, k = _check(users, ratings, scores, k, "ratings")
    gains = np.exp2(ratings) - 1.0
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    order, rank, group, user_ids = _rank_within_user(users, scores)
    top = rank < k
    dcg = np.bincount(group[top], weights=gains[order][top] * discount[rank[top]],
                      minlength=user_ids.size)
    iorder, irank, igroup, _ = _rank_within_user(users, ratings)
    itop = irank < k
    idcg = np.bincount(igroup[itop], weights=gains[iorder][itop] * discount[irank[itop]],
                       minlength=user_ids.size)
    ok = idcg > 0
    values = dcg[ok] / idcg[ok]
    mean = float(values.mean()) if values.size else float("nan")
    if per_user:
        return mean, user_ids[ok], values
    return mean


def precision_at_k(users, relevant, scores, k=10, *, per_user=False):
    """Mean Precision@k: (1/k) · number of relevant items among each user's top k by score.

    The candidates of a user are the rows given for them (e.g. every item they have not
    trained on, or their test items). The denominator is k even when a user has fewer than k
    candidates, as in Park et al. (2015, §5.2).

    Parameters
    ----------
    users : array-like of int, shape (n,)
    relevant : array-like, shape (n,)
        1 (or True) when the row's item is relevant to the user, else 0.
    scores : array-like of float, shape (n,)
    k : int
    per_user : bool
        Also return the users and their precision values.

    Examples
    --------
    >>> from solvers._ranking_metrics import precision_at_k
    >>> precision_at_k([0, 0, 0, 1, 1], [1, 0, 1, 0, 1], [3, 2, 1, 5, 4], k=2)
    0.5
    """
    users, relevant, scores, k = _check(users, relevant, scores, k, "relevant")
    order, rank, group, user_ids = _rank_within_user(users, scores)
    top = rank < k
    hits = np.bincount(group[top], weights=(relevant[order][top] > 0).astype(np.float64),
                       minlength=user_ids.size)
    values = hits / k
    if per_user:
        return float(values.mean()), user_ids, values
    return float(values.mean())


def pairwise_accuracy(winner_scores, loser_scores):
    """Fraction of held-out comparisons ordered correctly: score(winner) > score(loser).

    Ties count one half (so a constant model scores 0.5). This is the accuracy of Park et al.
    (2015, §5.1), micro-averaged over comparisons.

    Parameters
    ----------
    winner_scores, loser_scores : array-like of float, shape (n,)
        Predicted scores X[user, winner] and X[user, loser] of each comparison.

    Examples
    --------
    >>> from solvers._ranking_metrics import pairwise_accuracy
    >>> pairwise_accuracy([2.0, 1.0, 0.5], [1.0, 3.0, 0.5])
    0.5
    """
    w = np.asarray(winner_scores, dtype=np.float64)
    lo = np.asarray(loser_scores, dtype=np.float64)
    if w.ndim != 1 or w.shape != lo.shape:
        raise ValueError(f"winner_scores and loser_scores have shapes {w.shape} and {lo.shape}; "
                         "expected equal 1-D shapes")
    if w.shape[0] == 0:
        raise ValueError("no comparisons given; expected at least one")
    for name, a in (("winner_scores", w), ("loser_scores", lo)):
        nan = np.isnan(a)
        if nan.any():
            raise ValueError(f"{name} contains nan at position {int(np.flatnonzero(nan)[0])}")
    return float(np.mean((w > lo) + 0.5 * (w == lo)))


def topk_hit_metrics(recommended, indptr, indices, k=10) -> dict:
    """Precision, recall and NDCG at k of ranked lists against each user's held-out positives:
    what the published top-K is worth to users.

    Parameters
    ----------
    recommended : array of int, shape (n_users, >= k)
        Each user's ranked items (−1 pads short lists); row u is user u.
    indptr, indices : CSR of the held-out positives: user u's are
        ``indices[indptr[u]:indptr[u + 1]]``.
    k : int

    Returns
    -------
    dict with ``precision`` (hits / k), ``recall`` (hits / min(k, positives)), ``ndcg``
    (binary gains, DCG / the DCG of min(k, positives) hits at the top), each the mean over the
    users with at least one held-out positive (the others are skipped), and ``users``, their
    number.

    Examples
    --------
    >>> import numpy as np
    >>> m = topk_hit_metrics(np.array([[3, 1, 2]]), np.array([0, 2]), np.array([1, 7]), k=3)
    >>> [round(m[x], 4) for x in ("precision", "recall", "ndcg")]
    [0.3333, 0.5, 0.3869]
    """
    recommended = np.asarray(recommended)[:, :k]
    indptr = np.asarray(indptr)
    counts = np.diff(indptr)
    users = np.flatnonzero(counts > 0)
    if users.size == 0:
        return {"precision": float("nan"), "recall": float("nan"), "ndcg": float("nan"),
                "users": 0}
    width = int(max(np.max(indices, initial=0), np.max(recommended, initial=0))) + 1
    owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    positive = owner * width + np.asarray(indices, dtype=np.int64)
    rows = recommended[users].astype(np.int64)
    keys = users[:, None].astype(np.int64) * width + rows
    hit = (np.isin(keys, positive) & (rows >= 0)).astype(np.float64)
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    ideal = np.cumsum(discount)[np.minimum(counts[users], k) - 1]
    return {"precision": float(hit.sum(1).mean() / k),
            "recall": float((hit.sum(1) / np.minimum(counts[users], k)).mean()),
            "ndcg": float(((hit * discount[:hit.shape[1]]).sum(1) / ideal).mean()),
            "users": int(users.size)}
