"""Per-user values of the top-K holdout metrics (``topk_precision@k``, ``topk_recall@k``,
``topk_ndcg@k``): what :func:`solvers.metrics.topk_hit_metrics` averages, one value per user,
for bootstrap intervals (:mod:`pipeline.training.report_intervals`) and for the gate's margin
between a blend and the best single candidate (:mod:`pipeline.training.trainers.als`)."""

from __future__ import annotations

import numpy as np

TOPK_METRICS = ("precision", "recall", "ndcg")


def per_user_topk(ranked: np.ndarray, indptr, indices, k: int) -> dict:
    """Per-user precision, recall and NDCG at ``k`` of ranked lists against held-out
    positives, for the users with at least one positive: the values whose means
    :func:`solvers.metrics.topk_hit_metrics` reports (same definitions, same users, in
    user order).

    >>> out = per_user_topk(np.array([[3, 1, 2], [0, 4, 5]]), np.array([0, 2, 2]),
    ...                     np.array([1, 7]), k=3)
    >>> [np.round(out[m], 4).tolist() for m in ("precision", "recall", "ndcg")]
    [[0.3333], [0.5], [0.3869]]
    """
    ranked = np.asarray(ranked)[:, :k]
    indptr = np.asarray(indptr)
    counts = np.diff(indptr)
    users = np.flatnonzero(counts > 0)
    width = int(max(np.max(indices, initial=0), np.max(ranked, initial=0))) + 1
    owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    positive = owner * width + np.asarray(indices, dtype=np.int64)
    rows = ranked[users].astype(np.int64)
    hit = (np.isin(users[:, None].astype(np.int64) * width + rows, positive)
           & (rows >= 0)).astype(np.float64)
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    best = np.minimum(counts[users], k)
    ideal = np.cumsum(discount)[best - 1] if users.size else np.zeros(0)
    return {"users": users, "precision": hit.sum(1) / k, "recall": hit.sum(1) / best,
            "ndcg": (hit * discount[:hit.shape[1]]).sum(1) / ideal}


def topk_kind(metric: str, k) -> str | None:
    """``"ndcg"`` of ``"topk_ndcg@10"`` when k is the run's; None for any other metric."""
    name, _, at = metric.partition("@")
    kind = name.removeprefix("topk_")
    return kind if name.startswith("topk_") and kind in TOPK_METRICS and at == str(k) else None


def per_user_holdout(trainer, scorer, arrays: dict, cfg, kind: str) -> np.ndarray:
    """The per-user ``kind`` values of ``scorer`` on the holdout (TEST), ranked over the items
    each user did not meet outside it: how the trainer's ``topk_metrics`` scores the holdout
    (the same lists, from the same top-K), one value per user instead of their mean."""
    from pipeline.training.datasets import TEST

    make = getattr(trainer, "topk_lists", None)     # a family whose trainer ranks top-K
    lists = None if make is None else make(scorer, arrays, cfg, TEST)
    if lists is None:
        return np.zeros(0)
    ranked, positives, k = lists
    return per_user_topk(ranked, positives.indptr, positives.indices, k)[kind]
