"""Scores of (user, item) pairs for the rated metrics, by either path, against the direct
per-pair dot product."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.training.trainers.factors import pair_scores


@pytest.mark.parametrize("n_users, n_items, rank, block", [
    (40, 300, 2, 1 << 22), (40, 300, 400, 1 << 22), (40, 300, 400, 700),
    (3000, 2000, 400, 1 << 22), (3000, 2000, 400, 5000)])
def test_pair_scores_are_the_pairs_dot_products(n_users, n_items, rank, block):
    # 40 x 300: whole score rows cost less than gathering 5,000 pairs' factors (in one block or
    # in blocks of a few users); 3,000 x 2,000: gathering does (in one block, or 12 pairs at a
    # time)
    rng = np.random.default_rng(rank + block)
    U = rng.standard_normal((n_users, rank))
    V = rng.standard_normal((n_items, rank))
    users = rng.integers(0, n_users, 5000)
    items = rng.integers(0, n_items, 5000)
    want = np.array([U[u] @ V[i] for u, i in zip(users, items)])
    np.testing.assert_allclose(pair_scores(U, V, None, users, items, block=block), want,
                               rtol=1e-10, atol=1e-10)
    b = rng.standard_normal(n_items)
    np.testing.assert_allclose(pair_scores(U, V, b, users, items, block=block), want + b[items],
                               rtol=1e-10, atol=1e-10)
    assert pair_scores(U, V, b, users[:0], items[:0]).shape == (0,)
