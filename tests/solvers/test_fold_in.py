"""Fold-in against slow references: Newton on the squared hinge against AltSVM's own dual
coordinate descent run to a tiny duality gap, with a zero gradient at its answer; the many-user
dual kernel against that descent user by user; the least-squares fold-in against implicit's
own recalculate_user; the pair sampler's support."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from solvers._altsvm_solver import solve_users
from solvers.fold_in import (
    implicit_pairs,
    least_squares_fold_in,
    pairwise_duals,
    pairwise_fold_in,
    pairwise_fold_in_many,
)
from solvers.pairs import implicit_comparisons, popularity_cum


@pytest.mark.parametrize("seed", range(6))
def test_newton_matches_the_dual_and_zeroes_the_gradient(seed):
    rng = np.random.default_rng(seed)
    n_items, rank = int(rng.integers(20, 300)), int(rng.integers(2, 40))
    V, b = rng.normal(size=(n_items, rank)), rng.normal(size=n_items) * (seed % 2)
    pairs = implicit_pairs(rng.choice(n_items, 12, replace=False), n_items, 6)
    reg = float(10.0 ** rng.uniform(-1, 2))
    u = pairwise_fold_in(V, b, pairs, reg=reg, loss="squared_hinge")
    rows = np.column_stack([np.zeros(len(pairs), np.int64), pairs])
    dual, _, gap = solve_users(rows, 1, V, b, reg, "squared_hinge", 20_000, 1e-13)
    np.testing.assert_allclose(u, dual[0], rtol=1e-5, atol=1e-6 * np.abs(u).max())
    D, o = V[pairs[:, 0]] - V[pairs[:, 1]], b[pairs[:, 0]] - b[pairs[:, 1]]
    r = np.maximum(1.0 - D @ u - o, 0.0)
    assert np.linalg.norm(reg * u - 2.0 * D.T @ r) <= 1e-5 * max(1.0, reg)


def test_hinge_takes_the_dual_and_no_pairs_is_zero():
    rng = np.random.default_rng(9)
    V = rng.normal(size=(30, 4))
    pairs = implicit_pairs([1, 2, 3], 30, 5)
    u = pairwise_fold_in(V, None, pairs, reg=1.0, loss="hinge", max_epochs=5000, gap_tol=1e-10)
    D = V[pairs[:, 0]] - V[pairs[:, 1]]
    assert (D @ u).mean() > 0       # the met items now score above the sampled ones
    assert not pairwise_fold_in(V, None, np.zeros((0, 2)), reg=1.0, loss="hinge").any()
    with pytest.raises(ValueError, match="the factors have 30 items"):
        pairwise_fold_in(V, None, [[0, 30]], reg=1.0, loss="hinge")


@pytest.mark.parametrize("loss", ["hinge", "logistic", "squared_hinge"])
def test_the_many_user_dual_kernel_is_the_descent_user_by_user(loss):
    """dual_cd_many runs solve_users' passes on each user (the same orders, the same stop), on
    gathered rows: the same factors and duals to round-off, u = (1/λ) Σ α_c d_c; for the losses
    without a Newton path, the many-user fold-in is it, the same on any number of threads."""
    import numba

    rng = np.random.default_rng(len(loss))
    n_items, rank, reg = 400, 12, 3.0
    V, b = rng.normal(size=(n_items, rank)), rng.normal(size=n_items)
    users = [implicit_pairs(rng.choice(n_items, int(k), replace=False), n_items, 7)
             for k in rng.integers(1, 40, size=9)] + [np.zeros((0, 2), np.int64)]
    duals = [pairwise_duals(V, b, pairs, reg=reg, loss=loss) for pairs in users]
    for (u, alpha), pairs in zip(duals, users):
        rows = np.column_stack([np.zeros(len(pairs), np.int64), pairs])
        ref, ref_alpha, _ = solve_users(rows, 1, V, b, reg, loss, 200, 1e-6)
        np.testing.assert_allclose(u, ref[0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(alpha, ref_alpha, rtol=1e-9, atol=1e-12)
        D = V[pairs[:, 0]] - V[pairs[:, 1]]
        np.testing.assert_allclose(u, D.T @ alpha / reg, rtol=1e-9, atol=1e-12)
    if loss == "squared_hinge":
        return
    many = pairwise_fold_in_many(V, b, users, reg=reg, loss=loss)
    np.testing.assert_array_equal(many, np.stack([u for u, _ in duals]))
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        one_thread = pairwise_fold_in_many(V, b, users, reg=reg, loss=loss)
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(many, one_thread)


def test_least_squares_is_implicits_recalculate_user():
    from implicit.cpu.als import AlternatingLeastSquares
    from threadpoolctl import threadpool_limits

    X = sp.random(60, 45, density=0.1, random_state=0, format="csr", dtype=np.float32)
    X.data[:] = 1.0
    model = AlternatingLeastSquares(factors=8, regularization=3.0, alpha=7.0, iterations=5,
                                    random_state=0)
    with threadpool_limits(1, "blas"):
        model.fit(X, show_progress=False)
    for row in (0, 3, 17):
        ours = least_squares_fold_in(model.item_factors, X[row].indices, reg=3.0, alpha=7.0)
        theirs = np.asarray(model.recalculate_user(row, X[row])).ravel()
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_sampled_losers_are_uniform_over_the_items_not_met():
    for seed in range(100):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(2, 80))
        met = rng.choice(n, int(rng.integers(1, n)), replace=False)
        pairs = implicit_pairs(met, n, 5)
        assert not np.isin(pairs[:, 1], met).any() and pairs[:, 1].max() < n
        assert (implicit_pairs(met, n, 5) == pairs).all()       # same items, same pairs
    counts = np.bincount(implicit_pairs([0, 1, 5], 8, 40_000)[:, 1], minlength=8)
    assert counts[[0, 1, 5]].sum() == 0
    assert counts[[2, 3, 4, 6, 7]].min() > 0.95 * counts.max()
    assert implicit_pairs([0, 1], 2, 5).shape == (0, 2)


def test_popularity_sampled_losers_follow_the_weights_training_draws_by():
    """A fold-in's losers by :func:`solvers.pairs.popularity_cum`, as training's are: each item
    not met in proportion to its weight, never a met one, the same pairs for the same items."""
    counts = np.array([0, 900, 0, 40, 7, 0, 300, 2])
    cum = popularity_cum(counts, 8)
    weights = np.diff(np.r_[0, cum])
    met = [0, 1, 5]
    pairs = implicit_pairs(met, 8, 40_000, cum=cum)
    drawn = np.bincount(pairs[:, 1], minlength=8)
    assert drawn[met].sum() == 0 and (implicit_pairs(met, 8, 40_000, cum=cum) == pairs).all()
    others = np.setdiff1d(np.arange(8), met)
    expected = weights[others] / weights[others].sum() * len(pairs)
    np.testing.assert_allclose(drawn[others], expected, rtol=0.05)
    # training's draws by the same counts land on the same distribution
    users, items = np.zeros(3, np.int64), np.array(met)
    theirs = implicit_comparisons(users, items, 8, per_interaction=40_000,
                                  sampling="popularity", popularity=counts, random_state=0)
    np.testing.assert_allclose(np.bincount(theirs[:, 2], minlength=8)[others], expected,
                               rtol=0.05)
