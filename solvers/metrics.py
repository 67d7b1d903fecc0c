"""Ranking metrics, each checked against a direct reference implementation in the tests.

Per-user (collaborative ranking, the AltSVM paper's protocol): :func:`ndcg_at_k`,
:func:`precision_at_k`, :func:`pairwise_accuracy`. Bipartite (one scored list with binary
labels, the TopPush paper's): :func:`pos_at_top`, :func:`average_precision`, :func:`ndcg`,
:func:`auc`.
"""

from solvers._bipartite_metrics import auc, average_precision, ndcg, pos_at_top
from solvers._ordinal_metrics import accuracy, mae, mse, rating_ndcg
from solvers._query_metrics import query_average_precision, query_ndcg, query_pairwise_accuracy
from solvers._ranking_metrics import ndcg_at_k, pairwise_accuracy, precision_at_k, topk_hit_metrics

__all__ = ["accuracy", "auc", "average_precision", "mae", "mse", "ndcg", "ndcg_at_k",
           "pairwise_accuracy", "pos_at_top", "precision_at_k", "query_average_precision",
           "query_ndcg", "query_pairwise_accuracy", "rating_ndcg", "topk_hit_metrics"]
