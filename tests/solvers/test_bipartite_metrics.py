"""Bipartite ranking metrics against direct references: brute force over all pairs and over all
orderings of ties, and scikit-learn's implementations."""

from __future__ import annotations

import doctest
import itertools

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, ndcg_score, roc_auc_score

import solvers._bipartite_metrics as metrics_module
from solvers._bipartite_metrics import auc, average_precision, ndcg, pos_at_top


def random_lists(seed, count=400):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(2, 60))
        y = rng.integers(0, 2, n)
        y[0], y[1] = 1, 0  # both classes
        rng.shuffle(y)
        # integer scores: many ties; continuous: none
        s = rng.integers(0, 4, n).astype(float) if rng.random() < 0.5 else rng.normal(size=n)
        yield y, s


def pos_at_top_brute(y, s):
    top_neg = max(si for yi, si in zip(y, s) if yi != 1)
    positives = [si for yi, si in zip(y, s) if yi == 1]
    return sum(si > top_neg for si in positives) / len(positives)


def auc_brute(y, s):
    pos = [si for yi, si in zip(y, s) if yi == 1]
    neg = [si for yi, si in zip(y, s) if yi != 1]
    total = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return total / (len(pos) * len(neg))


def ndcg_brute_over_tie_orders(y, s):
    """Mean NDCG over every ordering of the tied items (small lists only)."""
    y, s = np.asarray(y), np.asarray(s)
    rel = (y == 1).astype(float)
    disc = 1.0 / np.log2(np.arange(2, y.size + 2))
    ideal = disc[: int(rel.sum())].sum()
    groups = [np.flatnonzero(s == v) for v in sorted(set(s), reverse=True)]
    values = []
    for perms in itertools.product(*[itertools.permutations(g) for g in groups]):
        order = np.concatenate([np.array(p) for p in perms])
        values.append((rel[order] * disc).sum() / ideal)
    return float(np.mean(values))


def test_against_sklearn_and_brute_force():
    for y, s in random_lists(0):
        assert pos_at_top(y, s) == pytest.approx(pos_at_top_brute(y, s), abs=1e-12)
        assert auc(y, s) == pytest.approx(auc_brute(y, s), abs=1e-12)
        assert auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
        assert average_precision(y, s) == pytest.approx(average_precision_score(y, s), abs=1e-12)
        assert ndcg(y, s) == pytest.approx(ndcg_score(y[None], s[None]), abs=1e-12)


def test_ndcg_ties_are_the_mean_over_tie_orders():
    rng = np.random.default_rng(1)
    for _ in range(60):
        n = int(rng.integers(2, 8))
        y = rng.integers(0, 2, n)
        y[0], y[1] = 1, 0
        s = rng.integers(0, 3, n).astype(float)
        assert ndcg(y, s) == pytest.approx(ndcg_brute_over_tie_orders(y, s), abs=1e-12)


def test_labels_pm1_equal_01():
    for y, s in random_lists(2, count=50):
        ypm = np.where(y == 1, 1, -1)
        for f in (pos_at_top, auc, average_precision, ndcg):
            assert f(ypm, s) == f(y, s)


def test_known_values_and_tie_conventions():
    # a positive tied with the top negative is not above it
    assert pos_at_top([1, 1, 0, 1], [3.0, 2.0, 2.0, 1.0]) == pytest.approx(1 / 3)
    assert pos_at_top([1, 0], [1.0, 0.0]) == 1.0
    assert pos_at_top([0, 1], [1.0, 0.0]) == 0.0
    assert auc([1, 0], [1.0, 1.0]) == 0.5
    assert average_precision([1, 0, 1], [3.0, 2.0, 1.0]) == pytest.approx((1 + 2 / 3) / 2)
    assert ndcg([1, 0, 0], [3.0, 2.0, 1.0]) == 1.0
    # perfect ranking: every metric is 1
    y, s = np.r_[np.ones(5), np.zeros(7)], np.arange(12, 0, -1.0)
    assert pos_at_top(y, s) == auc(y, s) == average_precision(y, s) == ndcg(y, s) == 1.0


@pytest.mark.parametrize("y, s, match", [
    ([1, 1, 1], [0.1, 0.2, 0.3], r"only one class \(3 labels, 3 positive\)"),
    ([0, 0], [0.1, 0.2], r"only one class \(2 labels, 0 positive\)"),
    ([1, 0, 2], [0.1, 0.2, 0.3], r"labels \[0, 1, 2\]"),
    ([1, 0, 1], [0.1, 0.2], r"y_true and y_score have lengths 3 and 2"),
    ([1, 0], [0.1, np.nan], r"y_score contains .*nan.* at position 1"),
    ([[1, 0]], [[0.1, 0.2]], r"must be 1-D"),
])
def test_bad_input_names_the_problem(y, s, match):
    for f in (pos_at_top, auc, average_precision, ndcg):
        with pytest.raises(ValueError, match=match):
            f(y, s)


def test_docstring_examples_run():
    result = doctest.testmod(metrics_module, verbose=False)
    assert result.attempted >= 4 and result.failed == 0
