"""AltSVM's evaluation beside the published top-K lists: the relevance threshold a dataset
resolved, and the paper's protocol over the rated held-out items (Park et al., ICML 2015,
§5: NDCG@k and precision@k of each user's rated held-out items, pairwise accuracy)."""

from __future__ import annotations

import numpy as np

from pipeline.training.datasets import TEST


def relevance_of(arrays: dict, cfg) -> float:
    """The relevance threshold the dataset resolved ("auto" follows the rating scale)."""
    if "relevance" in arrays:
        return float(arrays["relevance"])
    return float(cfg.evaluation["relevance"])


def rated_metrics(predict, arrays: dict, cfg) -> dict:
    """The paper's protocol: NDCG@k and precision@k of each user's rated held-out items
    ranked by ``predict(users, items)``, and the pairwise accuracy of their pairs."""
    from solvers import metrics, pairs_from_ratings

    rated = (arrays["met_part"] == TEST) & np.isfinite(arrays["met_rating"])
    u, i, r = (arrays[f"met_{c}"][rated] for c in ("user", "item", "rating"))
    if len(u) == 0:
        return {}
    k, relevance = int(cfg.evaluation["k"]), relevance_of(arrays, cfg)
    scores = predict(u, i)
    out = {f"ndcg@{k}": float(metrics.ndcg_at_k(u, r, scores, k=k)),
           f"precision@{k}": float(metrics.precision_at_k(u, r >= relevance, scores, k=k))}
    pairs = pairs_from_ratings(u, i, r)
    if len(pairs):
        out["pairwise_accuracy"] = float(metrics.pairwise_accuracy(
            predict(pairs[:, 0], pairs[:, 1]), predict(pairs[:, 0], pairs[:, 2])))
    return out
