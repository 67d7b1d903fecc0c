"""Ranking metrics against straightforward per-user reference implementations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from solvers._ranking_metrics import ndcg_at_k, pairwise_accuracy, precision_at_k


def ref_ndcg(users, ratings, scores, k):
    """NDCG@k of Park et al. §5.2 written out per user, ties broken by input position."""
    values = []
    for u in sorted(set(users.tolist())):
        idx = [t for t in range(len(users)) if users[t] == u]
        by_score = sorted(idx, key=lambda t: (-scores[t], t))
        by_rating = sorted(idx, key=lambda t: (-ratings[t], t))
        dcg = sum((2 ** ratings[t] - 1) / math.log2(p + 2) for p, t in enumerate(by_score[:k]))
        idcg = sum((2 ** ratings[t] - 1) / math.log2(p + 2) for p, t in enumerate(by_rating[:k]))
        if idcg > 0:
            values.append(dcg / idcg)
    return float(np.mean(values))


def ref_precision(users, relevant, scores, k):
    values = []
    for u in sorted(set(users.tolist())):
        idx = [t for t in range(len(users)) if users[t] == u]
        top = sorted(idx, key=lambda t: (-scores[t], t))[:k]
        values.append(sum(relevant[t] > 0 for t in top) / k)
    return float(np.mean(values))


def random_case(seed, n=300, n_users=25, tie_scores=False):
    rng = np.random.default_rng(seed)
    users = rng.integers(0, n_users, n)
    ratings = rng.integers(0, 6, n).astype(float)
    scores = rng.integers(0, 5, n).astype(float) if tie_scores else rng.normal(size=n)
    return users, ratings, scores


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("k", [1, 3, 10])
@pytest.mark.parametrize("ties", [False, True])
def test_ndcg_matches_reference(seed, k, ties):
    users, ratings, scores = random_case(seed, tie_scores=ties)
    assert ndcg_at_k(users, ratings, scores, k=k) == pytest.approx(
        ref_ndcg(users, ratings, scores, k), rel=1e-12)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("k", [1, 5, 20])
def test_precision_matches_reference(seed, k):
    users, ratings, scores = random_case(seed, tie_scores=seed % 2 == 0)
    relevant = (ratings >= 4).astype(float)
    assert precision_at_k(users, relevant, scores, k=k) == pytest.approx(
        ref_precision(users, relevant, scores, k), rel=1e-12)


def test_ndcg_extremes_and_per_user():
    users = np.array([0, 0, 0, 1, 1])
    ratings = np.array([5.0, 3.0, 1.0, 2.0, 4.0])
    perfect = ratings.copy()
    assert ndcg_at_k(users, ratings, perfect, k=10) == 1.0
    mean, ids, vals = ndcg_at_k(users, ratings, -perfect, k=10, per_user=True)
    assert list(ids) == [0, 1] and mean == pytest.approx(vals.mean()) and (vals < 1).all()
    # a user whose test ratings all have gain 0 is left out of the mean
    assert ndcg_at_k([0, 0, 1], [0.0, 0.0, 3.0], [1.0, 2.0, 0.0], k=2) == 1.0


def test_pairwise_accuracy_counts_ties_half():
    w = np.array([3.0, 1.0, 2.0, 0.0])
    lo = np.array([1.0, 2.0, 2.0, -1.0])
    assert pairwise_accuracy(w, lo) == pytest.approx((1 + 0 + 0.5 + 1) / 4)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=100), rng.normal(size=100)
    assert pairwise_accuracy(a, b) == pytest.approx(np.mean(a > b))


@pytest.mark.parametrize("call, match", [
    (lambda: ndcg_at_k([0, 1], [1.0], [0.1, 0.2]), "lengths 2, 1 and 2"),
    (lambda: ndcg_at_k([0], [np.nan], [0.1]), "ratings contains .*nan.* at position 0"),
    (lambda: ndcg_at_k([0, 0], [1.0, 2.0], [0.1, np.nan]), "scores contains nan at position 1"),
    (lambda: ndcg_at_k([], [], []), "no .* rows"),
    (lambda: ndcg_at_k([0], [1.0], [0.5], k=0), "k is 0"),
    (lambda: precision_at_k([0], [1.0], [0.5], k=2.5), "k is 2.5"),
    (lambda: pairwise_accuracy([1.0, np.nan], [0.0, 0.0]), "winner_scores .*nan at position 1"),
    (lambda: pairwise_accuracy([1.0], [0.0, 0.0]), "shapes"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_topk_hit_metrics_against_a_brute_force_loop():
    from solvers._ranking_metrics import topk_hit_metrics

    rng = np.random.default_rng(8)
    n_users, n_items, k = 30, 25, 5
    recommended = np.array([rng.permutation(n_items)[:7] for _ in range(n_users)])
    recommended[3, 4:] = -1                                   # a short list
    positives = [rng.choice(n_items, rng.integers(0, 6), replace=False) for _ in range(n_users)]
    indptr = np.r_[0, np.cumsum([len(p) for p in positives])]
    got = topk_hit_metrics(recommended, indptr, np.concatenate(positives), k=k)
    precision, recall, ndcg = [], [], []
    for u in range(n_users):
        pos = set(positives[u].tolist())
        if not pos:
            continue
        hits = [1.0 if i in pos else 0.0 for i in recommended[u, :k]]
        precision.append(sum(hits) / k)
        recall.append(sum(hits) / min(k, len(pos)))
        dcg = sum(h / np.log2(r + 2) for r, h in enumerate(hits))
        ideal = sum(1 / np.log2(r + 2) for r in range(min(k, len(pos))))
        ndcg.append(dcg / ideal)
    assert got["users"] == len(precision)
    assert got["precision"] == pytest.approx(np.mean(precision))
    assert got["recall"] == pytest.approx(np.mean(recall))
    assert got["ndcg"] == pytest.approx(np.mean(ndcg))
