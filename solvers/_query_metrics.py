"""Per-query ranking metrics for learning to rank (LETOR): NDCG@k, MAP, pairwise accuracy.

Inputs are flat arrays with one row per (query, document): the query, the judged relevance
label and the predicted score. Documents are ranked within their query by decreasing score;
ties keep the input order (a stable sort), as LETOR 4.0's ``Eval-Score-4.0.pl`` does (it sorts
by the line number first). Everything is vectorized: a few sorts, no loop over queries.

Definitions (LETOR 4.0's evaluation script, and Kuo, Lee, Lin 2014, section 4.2):

    NDCG@k(q) = DCG@k(predicted order) / DCG@k(ideal order),
    DCG@k     = Σ_{r=1..min(k, n_q)} (2^{label at r} − 1) · d(r)
    d(r)      = 1 / log2(max(2, r))     discount="letor"  (positions 1 and 2 undiscounted)
              = 1 / log2(r + 1)         discount="log2"   (Järvelin-Kekäläinen / Burges)

    AP(q)     = (1 / #relevant) Σ_{relevant at rank r} (#relevant in the top r) / r,
                relevant meaning label > 0; MAP is the mean over queries.

A query shorter than k is scored over all its documents (the missing positions are
irrelevant for both the prediction and the ideal). LETOR's script instead leaves NDCG@k at 0
for such queries, a quirk that lowers its published MQ2008 NDCG@10; it is not copied here.

Queries without a relevant document (ideal DCG 0; 220 of MQ2008's 784) have no defined
NDCG or AP. ``no_relevant="zero"`` counts them as 0, as LETOR's script does (so the numbers
compare with LETOR's tables); ``no_relevant="skip"`` leaves them out of the mean, which measures
only the queries a ranker can get right or wrong.

Pairwise accuracy is the fraction of within-query pairs (i, j) with label_i > label_j that the
scores order correctly, score_i > score_j (the paper's definition: ties count as errors;
``ties=0.5`` counts them half).
"""

from __future__ import annotations

import numpy as np

from solvers._base import check_aligned, check_choice

__all__ = ["query_ndcg", "query_average_precision", "query_pairwise_accuracy"]

_NO_RELEVANT = ("zero", "skip")
_DISCOUNTS = ("letor", "log2")


def _check(query, labels, scores):
    query = np.asarray(query)
    labels = np.asarray(labels, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    check_aligned(query=query, labels=labels, scores=scores)
    if query.shape[0] == 0:
        raise ValueError("no rows given; expected at least one (query, document) row")
    for name, a in (("labels", labels), ("scores", scores)):
        bad = np.isnan(a)
        if bad.any():
            raise ValueError(f"{name} contains nan at position {int(np.flatnonzero(bad)[0])}")
    _, qinv = np.unique(query, return_inverse=True)
    return qinv.ravel(), labels, scores


def _ranked(qinv, keys):
    """Rows sorted by query, then by ``keys`` decreasing (ties: input order). Returns the
    order, each sorted row's 0-based rank in its query and its query group number."""
    order = np.lexsort((np.arange(keys.size), -keys, qinv))
    qs = qinv[order]
    new = np.ones(order.size, dtype=bool)
    new[1:] = qs[1:] != qs[:-1]
    group = np.cumsum(new) - 1
    rank = np.arange(order.size) - np.flatnonzero(new)[group]
    return order, rank, group


def _finish(values, defined, query_ids, no_relevant, per_query):
    check_choice("no_relevant", no_relevant, _NO_RELEVANT)
    if no_relevant == "zero":
        values = np.where(defined, values, 0.0)
        ids = query_ids
    else:
        values = values[defined]
        ids = query_ids[defined]
    mean = float(values.mean()) if values.size else float("nan")
    if per_query:
        return mean, ids, values
    return mean


def query_ndcg(query, labels, scores, k=10, *, no_relevant="zero", discount="letor",
               per_query=False):
    """Mean NDCG@k over queries, gain 2^label − 1 (see the module docstring).

    Parameters
    ----------
    query, labels, scores : array-like of shape (n,)
    k : int
        Cut-off.
    no_relevant : {"zero", "skip"}
        How queries without a relevant document count: as 0 (LETOR) or not at all.
    discount : {"letor", "log2"}
        1/log2(max(2, r)) (LETOR 4.0) or 1/log2(r + 1).
    per_query : bool
        Also return the queries (sorted) and their values.

    Examples
    --------
    >>> round(query_ndcg([1, 1, 1], [2, 0, 1], [0.9, 0.8, 0.1], k=3), 4)  # (3 + 1/log2 3)/4
    0.9077
    >>> query_ndcg([1, 1, 2, 2], [1, 0, 0, 0], [1.0, 0.0, 1.0, 0.0], no_relevant="skip")
    1.0
    """
    qinv, labels, scores = _check(query, labels, scores)
    if int(k) != k or k < 1:
        raise ValueError(f"k is {k!r}, expected an integer >= 1")
    check_choice("discount", discount, _DISCOUNTS)
    k = int(k)
    pos = np.arange(1, k + 1, dtype=np.float64)
    disc = 1.0 / np.log2(np.maximum(2.0, pos) if discount == "letor" else pos + 1.0)
    gains = np.exp2(labels) - 1.0
    n_q = int(qinv.max()) + 1
    order, rank, group = _ranked(qinv, scores)
    top = rank < k
    dcg = np.bincount(group[top], weights=gains[order][top] * disc[rank[top]], minlength=n_q)
    iorder, irank, igroup = _ranked(qinv, labels)
    itop = irank < k
    idcg = np.bincount(igroup[itop], weights=gains[iorder][itop] * disc[irank[itop]],
                       minlength=n_q)
    defined = idcg > 0
    values = np.divide(dcg, idcg, out=np.zeros(n_q), where=defined)
    return _finish(values, defined, np.unique(np.asarray(query)), no_relevant, per_query)


def query_average_precision(query, labels, scores, *, no_relevant="zero", per_query=False):
    """MAP: mean over queries of the average precision, relevant meaning label > 0.

    Examples
    --------
    >>> query_average_precision([0, 0, 0], [1, 0, 1], [3.0, 2.0, 1.0])  # (1/1 + 2/3) / 2
    0.8333333333333333
    """
    qinv, labels, scores = _check(query, labels, scores)
    n_q = int(qinv.max()) + 1
    order, rank, group = _ranked(qinv, scores)
    rel = (labels[order] > 0).astype(np.float64)
    csum = np.cumsum(rel)
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    before = np.r_[0.0, csum][starts][group]
    hits = csum - before                      # relevant in the top (rank + 1) of the query
    prec = np.where(rel > 0, hits / (rank + 1.0), 0.0)
    n_rel = np.bincount(group, weights=rel, minlength=n_q)
    total = np.bincount(group, weights=prec, minlength=n_q)
    defined = n_rel > 0
    values = np.divide(total, n_rel, out=np.zeros(n_q), where=defined)
    return _finish(values, defined, np.unique(np.asarray(query)), no_relevant, per_query)


def query_pairwise_accuracy(query, labels, scores, *, ties=0.0):
    """Fraction of within-query pairs (label_i > label_j) with score_i > score_j, micro-
    averaged over all pairs; a tie in score counts ``ties`` (0: the paper's definition).

    O(k · n log n) for k distinct labels, without visiting the pairs. Raises ``ValueError``
    when no query has two different labels (there is no pair to score).

    Examples
    --------
    >>> query_pairwise_accuracy([0, 0, 0, 1, 1], [2, 1, 0, 1, 0], [3, 1, 2, 0, 1])
    0.5
    """
    qinv, labels, scores = _check(query, labels, scores)
    n = qinv.size
    _, srank = np.unique(scores, return_inverse=True)   # equal scores, equal rank
    key = qinv.astype(np.int64) * (n + 1) + srank.ravel()
    lvl_values, lvl = np.unique(labels, return_inverse=True)
    lvl = lvl.ravel()
    below = np.zeros(n)       # partners of lower label with a lower score
    tied = np.zeros(n)        # partners of lower label with an equal score
    total = np.zeros(n)       # partners of lower label
    q_lo = qinv.astype(np.int64) * (n + 1)
    q_hi = q_lo + n
    for v in range(lvl_values.size - 1):
        keys_v = np.sort(key[lvl == v])
        upper = lvl > v
        left = np.searchsorted(keys_v, key[upper], side="left")
        right = np.searchsorted(keys_v, key[upper], side="right")
        first = np.searchsorted(keys_v, q_lo[upper], side="left")
        last = np.searchsorted(keys_v, q_hi[upper], side="right")
        below[upper] += left - first
        tied[upper] += right - left
        total[upper] += last - first
    n_pairs = total.sum()
    if n_pairs == 0:
        raise ValueError(f"no pairs: none of the {int(qinv.max()) + 1} queries has two "
                         "documents with different labels")
    return float((below.sum() + ties * tied.sum()) / n_pairs)
