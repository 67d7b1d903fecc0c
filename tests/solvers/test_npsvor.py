"""NPSVOR (linear nonparallel SVOR, DCD-2): every kernel against a slow reference.

The coordinate step against a numerical 1-D minimum of the dual, optimality by the duality gap
and the KKT conditions of an independent numpy primal, the predictors r_new and r_old against
their definitions (paper eqs. 3 and 36), sparse against dense, warm starts on grown data,
bit-for-bit reproducibility, the error messages, and the MAE on the authors' Treebank split.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import minimize_scalar

from solvers import _npsvor_kernels as K
from solvers._base import ConvergenceWarning, NotFittedError
from solvers._ordinal_metrics import accuracy, mae, mse, rating_ndcg
from solvers.npsvor import NPSVOR


def ordinal_data(n=300, m=12, p=4, seed=0, density=1.0, noise=0.3):
    """Rows of a planted linear score cut into p consecutive ranks 1..p."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, m))
    if density < 1.0:
        X[rng.random(X.shape) >= density] = 0.0
    score = X @ rng.normal(size=m) + noise * rng.normal(size=n)
    cuts = np.quantile(score, np.linspace(0, 1, p + 1)[1:-1])
    return X, np.digitize(score, cuts) + 1


def primal_dual(model, X, y):
    """Independent numpy versions of the primal (4) and dual (20) of every rank, with the
    intercept as the weight of an appended constant feature 1. With
    ``loss="squared_hinge"`` the losses are squared and the dual gains Σ α²/(4C)."""
    Xb = np.hstack([np.asarray(X.todense() if sp.issparse(X) else X, dtype=np.float64),
                    np.ones((X.shape[0], 1))])
    C1, eps = model.C1, model.epsilon
    C2 = C1 if model.C2 is None else model.C2
    power = 2 if model.loss == "squared_hinge" else 1
    out = []
    for k, label in enumerate(model.classes_):
        wb = np.r_[model.coef_[k], model.intercept_[k]]
        f = Xb @ wb
        own = y == label
        ytil = np.where(y > label, 1.0, -1.0)
        P = (0.5 * wb @ wb + C1 * (np.maximum(np.abs(f[own]) - eps, 0) ** power).sum()
             + C2 * (np.maximum(1 - ytil[~own] * f[~own], 0) ** power).sum())
        a = model.dual_coef_[k]
        w_of_a = Xb.T @ (ytil * a)
        D = 0.5 * w_of_a @ w_of_a + eps * np.abs(a[own]).sum() - a[~own].sum()
        if power == 2:
            D += (a[own] ** 2).sum() / (4 * C1) + (a[~own] ** 2).sum() / (4 * C2)
        out.append((P, D, wb, w_of_a, f, own, ytil, a))
    return out


# ------------------------------------------------------------------------------ one coordinate


@pytest.mark.parametrize("seed", range(40))
def test_coordinate_step_is_the_1d_minimum_of_the_dual(seed):
    rng = np.random.default_rng(seed)
    m = 6
    w = rng.normal(size=m)
    x = rng.normal(size=m) * (rng.random(m) < 0.7)
    in_rank = bool(seed % 2)
    ytil = -1.0 if in_rank else float(rng.choice([-1.0, 1.0]))
    C1, C2, eps = rng.uniform(0.1, 2), rng.uniform(0.1, 2), rng.uniform(0, 0.5)
    lo, hi = (-C1, C1) if in_rank else (0.0, C2)
    alpha = float(rng.choice([lo, hi, 0.0, rng.uniform(lo, hi)]))

    def restricted(s):  # D(α + (s − α_i) e_i) up to a constant, from its definition (20)
        wv = w + (s - alpha) * ytil * x
        return 0.5 * wv @ wv + (eps * abs(s) if in_rank else -s)

    step = K.coordinate_step(alpha, ytil * (w @ x), x @ x, in_rank, C1, C2, eps)
    assert lo <= step <= hi
    ref = minimize_scalar(restricted, bounds=(lo, hi), method="bounded",
                          options={"xatol": 1e-12})
    grid = np.linspace(lo, hi, 2001)
    best = min(ref.fun, min(restricted(s) for s in grid), restricted(0.0))
    assert restricted(step) <= best + 1e-9
    # α_i is optimal along its coordinate iff its violation (24)/(30) is zero
    v = K.violation(alpha, ytil * (w @ x), in_rank, C1, C2, eps)
    assert (v <= 1e-12) == (restricted(alpha) <= restricted(step) + 1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_squared_loss_coordinate_is_the_hinge_step_on_a_shifted_problem(seed):
    """The squared-loss dual restricted to α_i = s adds s²/(4C) and drops the bounds; the
    solver's reduction (A_i + D_i, B_i + D_i α_i, infinite bounds, D_i = 1/(2C)) must give its
    exact minimiser through the hinge's step, and a zero violation exactly at it."""
    rng = np.random.default_rng(100 + seed)
    m = 6
    w = rng.normal(size=m)
    x = rng.normal(size=m) * (rng.random(m) < 0.7)
    in_rank = bool(seed % 2)
    ytil = -1.0 if in_rank else float(rng.choice([-1.0, 1.0]))
    C, eps = rng.uniform(0.1, 2), rng.uniform(0, 0.5)
    alpha = float(rng.uniform(-3, 3) if in_rank else rng.choice([0.0, rng.uniform(0, 3)]))

    def restricted(s):
        wv = w + (s - alpha) * ytil * x
        return 0.5 * wv @ wv + s * s / (4 * C) + (eps * abs(s) if in_rank else -s)

    D = 0.5 / C
    B = ytil * (w @ x) + D * alpha
    step = K.coordinate_step(alpha, B, x @ x + D, in_rank, np.inf, np.inf, eps)
    ref = minimize_scalar(restricted, bounds=(-20.0 if in_rank else 0.0, 20.0),
                          method="bounded", options={"xatol": 1e-12})
    assert restricted(step) <= min(ref.fun, restricted(0.0)) + 1e-9
    assert in_rank or step >= 0.0
    v = K.violation(alpha, B, in_rank, np.inf, np.inf, eps)
    assert (v <= 1e-12) == (restricted(alpha) <= restricted(step) + 1e-12)


def test_coordinate_step_of_an_empty_row_without_bias():
    assert K.coordinate_step(0.3, 0.0, 0.0, False, 1.0, 2.0, 0.1) == 2.0
    assert K.coordinate_step(0.3, 0.0, 0.0, True, 1.0, 2.0, 0.1) == 0.0


# ------------------------------------------------------------------------------ optimality


@pytest.mark.parametrize("sparse", [False, True])
def test_duality_gap_and_kkt_at_convergence(sparse):
    X, y = ordinal_data(n=160, m=8, p=4, seed=3, density=0.6)
    Xf = sp.csr_matrix(X) if sparse else X
    model = NPSVOR(C1=0.7, C2=1.3, epsilon=0.2, tol=1e-9, max_iter=100000,
                   random_state=0).fit(Xf, y)
    assert model.converged_
    for P, D, wb, w_of_a, f, own, ytil, a in primal_dual(model, X, y):
        # w = Σ ỹ α x (eq. 19), strong duality min P = −min D
        np.testing.assert_allclose(wb, w_of_a, atol=1e-10)
        assert P + D >= -1e-9 * abs(P)
        assert P + D <= 1e-7 * abs(P)
        # box constraints
        assert (np.abs(a[own]) <= 0.7 + 1e-15).all()
        assert (a[~own] >= 0).all() and (a[~own] <= 1.3 + 1e-15).all()
        # complementary slackness: other ranks
        margin = ytil[~own] * f[~own]
        ao = a[~own]
        tol = 1e-6
        assert (margin[ao == 0] >= 1 - tol).all()
        assert (margin[ao == 1.3] <= 1 + tol).all()
        inside = (ao > 0) & (ao < 1.3)
        np.testing.assert_allclose(margin[inside], 1.0, atol=tol)
        # own rank: α = α⁺ − α⁻ (sign convention of eq. 7: w gets −α x)
        fo, ai = f[own], a[own]
        assert (np.abs(fo[ai == 0]) <= 0.2 + tol).all()
        np.testing.assert_allclose(fo[(ai > 0) & (ai < 0.7)], 0.2, atol=tol)
        np.testing.assert_allclose(fo[(ai < 0) & (ai > -0.7)], -0.2, atol=tol)
        assert (fo[ai == 0.7] >= 0.2 - tol).all()
        assert (fo[ai == -0.7] <= -0.2 + tol).all()


@pytest.mark.parametrize("sparse", [False, True])
def test_squared_loss_duality_gap_and_kkt_at_convergence(sparse):
    X, y = ordinal_data(n=160, m=8, p=4, seed=4, density=0.6)
    Xf = sp.csr_matrix(X) if sparse else X
    C1, C2, eps = 0.7, 1.3, 0.2
    model = NPSVOR(C1=C1, C2=C2, epsilon=eps, loss="squared_hinge", tol=1e-10,
                   max_iter=100000, random_state=0).fit(Xf, y)
    assert model.converged_
    for P, D, wb, w_of_a, f, own, ytil, a in primal_dual(model, X, y):
        np.testing.assert_allclose(wb, w_of_a, atol=1e-10)
        assert abs(P + D) <= 1e-8 * abs(P)
        # KKT of the squared losses: each dual is 2C times its row's loss residual (signed for
        # the rank's own rows: α > 0 above the band, α < 0 below), so no box binds
        fo = f[own]
        np.testing.assert_allclose(
            a[own], 2 * C1 * np.sign(fo) * np.maximum(np.abs(fo) - eps, 0), atol=1e-6)
        np.testing.assert_allclose(
            a[~own], 2 * C2 * np.maximum(1 - ytil[~own] * f[~own], 0), atol=1e-6)
    # the squared losses give a different optimum from the hinge's on the same data
    hinge = NPSVOR(C1=C1, C2=C2, epsilon=eps, tol=1e-10, max_iter=100000,
                   random_state=0).fit(Xf, y)
    assert np.abs(hinge.coef_ - model.coef_).max() > 1e-3


def test_tolerance_trades_passes_for_duality_gap():
    X, y = ordinal_data(n=400, m=300, p=5, seed=1, density=0.05)
    fits = [NPSVOR(tol=tol, random_state=0).fit(sp.csr_matrix(X), y)
            for tol in (0.1, 1e-2, 1e-4)]
    gaps = [max((P + D) / P for P, D, *_ in primal_dual(f, X, y)) for f in fits]
    iters = [f.n_iter_ for f in fits]
    assert all(f.converged_ for f in fits)
    assert iters[0] < iters[1] < iters[2]
    # the paper's tol = 0.1 (mean violation 0.1 per instance) stops well short of the optimum
    assert gaps[0] > gaps[1] > gaps[2] and 0 <= gaps[2] < 1e-2


def test_without_intercept_the_bias_is_zero():
    X, y = ordinal_data(n=120, m=6, p=3, seed=2)
    model = NPSVOR(fit_intercept=False, tol=1e-8, max_iter=100000, random_state=0).fit(X, y)
    assert (model.intercept_ == 0).all()
    ytil = np.where(y[None, :] > model.classes_[:, None], 1.0, -1.0)
    np.testing.assert_allclose(model.coef_, (ytil * model.dual_coef_) @ X, atol=1e-10)


# ------------------------------------------------------------------------------ predictors


def brute_r_new(F):
    p = F.shape[1]
    return np.array([1 + sum(F[i, k] + F[i, k + 1] > 0 for k in range(p - 1))
                     for i in range(F.shape[0])])


def brute_r_old(F):
    out = []
    for row in F:
        best = 0
        for k in range(len(row)):
            if abs(row[k]) < abs(row[best]):
                best = k
        out.append(best + 1)
    return np.array(out)


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_rank_kernels_match_the_paper_definitions(p):
    rng = np.random.default_rng(p)
    F = np.round(rng.normal(size=(500, p)), 1)  # rounding makes ties and zero sums
    out = np.empty(500, dtype=np.int64)
    K.rank_new(F, out)
    np.testing.assert_array_equal(out + 1, brute_r_new(F))
    K.rank_old(F, out)
    np.testing.assert_array_equal(out + 1, brute_r_old(F))


def test_predict_uses_the_chosen_predictor_on_the_hyperplanes():
    X, y = ordinal_data(n=300, m=10, p=5, seed=4)
    model = NPSVOR(C1=2.0, random_state=0).fit(X, y + 10)  # ranks 11..15
    F = model.decision_function(X)
    np.testing.assert_allclose(F, X @ model.coef_.T + model.intercept_)
    np.testing.assert_array_equal(model.predict(X), brute_r_new(F) + 10)
    model.set_params(predictor="old")
    np.testing.assert_array_equal(model.predict(X), brute_r_old(F) + 10)


@pytest.mark.parametrize("predictor", ["new", "old"])
def test_predict_score_orders_items_as_predict(predictor):
    X, y = ordinal_data(n=400, m=10, p=5, seed=5)
    model = NPSVOR(predictor=predictor, random_state=0).fit(X, y)
    Xt, _ = ordinal_data(n=2000, m=10, p=5, seed=6)
    r, s = model.predict(Xt), model.predict_score(Xt)
    assert (np.abs(s - r) <= 0.5 + 1e-12).all()
    order = np.argsort(s, kind="stable")
    assert (np.diff(r[order]) >= 0).all()  # a higher predicted rank never scores lower


def brute_score_new(row):
    g = sorted((row[k] + row[k + 1] for k in range(len(row) - 1)), reverse=True)
    c = sum(v > 0 for v in g)
    if c == 0:
        u = 2 / (1 + np.exp(-g[0]))
    elif c == len(g):
        u = np.tanh(g[-1] / 2)
    else:
        u = g[c - 1] / (g[c - 1] - g[c])
    return c - 0.5 + u


def brute_score_old(row):
    d = np.abs(row)
    r = int(np.argmin(d))
    a = d[r - 1] - d[r] if r > 0 else 1.0
    b = d[r + 1] - d[r] if r < len(row) - 1 else 1.0
    return r + 0.5 * (a - b) / (a + b)


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_score_kernels_match_their_definitions(p):
    F = np.random.default_rng(p).normal(size=(300, p))
    out = np.empty(300)
    K.score_new(F, out)
    np.testing.assert_allclose(out, [brute_score_new(row) for row in F], rtol=1e-12)
    K.score_old(F, out)
    np.testing.assert_allclose(out, [brute_score_old(row) for row in F], rtol=1e-12)


@pytest.mark.parametrize("p", [2, 3, 5])
def test_score_new_is_continuous(p):
    rng = np.random.default_rng(p)
    for _ in range(20):
        a, b = rng.normal(scale=2, size=p), rng.normal(scale=2, size=p)
        t = np.linspace(0, 1, 20001)[:, None]
        F = a + t * (b - a)
        s = np.empty(len(F))
        K.score_new(F, s)
        step = np.abs(b - a).max() / 20000
        assert np.abs(np.diff(s)).max() < 50 * step + 1e-9


def test_score_old_joins_adjacent_ranks():
    # rank 2 ↔ 3 boundary of r_old: |f_2| = |f_3| is the smallest
    for d in (1e-9, -1e-9):
        F = np.array([[2.0, 0.5 + d, 0.5, 3.0]])
        s = np.empty(1)
        K.score_old(F, s)
        assert abs(s[0] - 1.5) < 1e-6


# ------------------------------------------------------------------------------ storage, dtypes


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sparse_equals_dense(dtype):
    X, y = ordinal_data(n=250, m=15, p=4, seed=7, density=0.3)
    X = X.astype(dtype)
    dense = NPSVOR(random_state=3, tol=1e-3).fit(X, y)
    csr = NPSVOR(random_state=3, tol=1e-3).fit(sp.csr_matrix(X), y)
    wide = sp.csr_matrix(X)
    wide.indices, wide.indptr = wide.indices.astype(np.int64), wide.indptr.astype(np.int64)
    csr64 = NPSVOR(random_state=3, tol=1e-3).fit(wide, y)
    for other in (csr, csr64):
        np.testing.assert_array_equal(other.n_iter_per_rank_, dense.n_iter_per_rank_)
        np.testing.assert_allclose(other.coef_, dense.coef_, rtol=0, atol=1e-12)
        np.testing.assert_allclose(other.dual_coef_, dense.dual_coef_, rtol=0, atol=1e-12)
        np.testing.assert_allclose(other.predict_score(sp.csr_matrix(X)),
                                   dense.predict_score(X), atol=1e-12)


def test_float32_close_to_float64_and_other_sparse_formats():
    X, y = ordinal_data(n=250, m=15, p=4, seed=8, density=0.3)
    a = NPSVOR(random_state=0, tol=1e-6, max_iter=10**5).fit(sp.csr_matrix(X), y)
    b = NPSVOR(random_state=0, tol=1e-6, max_iter=10**5).fit(
        sp.csc_matrix(X.astype(np.float32)), y)
    np.testing.assert_allclose(a.coef_, b.coef_, atol=1e-4)
    # a CSR with a duplicate entry in row 0 means the sum of the two
    c = sp.csr_matrix(X)
    col, cut = int(c.indices[0]), int(c.indptr[1])
    indptr = c.indptr.copy()
    indptr[1:] += 1
    Xd = sp.csr_matrix((np.insert(c.data, cut, 1.0), np.insert(c.indices, cut, col), indptr),
                       shape=X.shape)
    summed = X.copy()
    summed[0, col] += 1.0
    Xs = sp.csr_matrix(summed)
    c = NPSVOR(random_state=0, tol=1e-3).fit(Xd, y)
    d = NPSVOR(random_state=0, tol=1e-3).fit(Xs, y)
    np.testing.assert_allclose(c.coef_, d.coef_, atol=1e-12)


# ------------------------------------------------------------------------------ warm start


def test_warm_start_on_grown_data_is_cheaper_and_lands_on_the_same_solution():
    X, y = ordinal_data(n=1000, m=400, p=5, seed=9, density=0.05)
    ids = np.arange(1000) * 7 + 3
    old = np.random.default_rng(0).permutation(1000)[:980]  # 2% of the rows are new
    params = {"C1": 1.0, "tol": 1e-2, "random_state": 0}
    first = NPSVOR(**params).fit(X[old], y[old], ids=ids[old])
    cold = NPSVOR(**params).fit(X, y, ids=ids)
    warm = NPSVOR(**params).fit(X, y, ids=ids, warm_start=first.warm_state())
    assert cold.converged_ and warm.converged_
    assert warm.n_iter_per_rank_.sum() < 0.7 * cold.n_iter_per_rank_.sum()
    gaps_c = [(P + D) / P for P, D, *_ in primal_dual(cold, X, y)]
    gaps_w = [(P + D) / P for P, D, *_ in primal_dual(warm, X, y)]
    assert max(gaps_w) <= 1.5 * max(gaps_c)  # as close to the optimum as a cold fit
    np.testing.assert_allclose(warm.coef_, cold.coef_, atol=0.1 * np.abs(cold.coef_).max())
    assert np.mean(warm.predict(X) == cold.predict(X)) > 0.97


def test_warm_start_maps_by_id_drops_vanished_rows_and_clips_into_the_box():
    X, y = ordinal_data(n=200, m=8, p=4, seed=10)
    ids = np.array([f"doc{i}" for i in range(200)])
    first = NPSVOR(C1=2.0, random_state=0).fit(X, y, ids=ids)
    state = first.warm_state()
    assert set(state) == {"ids", "duals", "classes", "algorithm"}
    assert state["duals"].shape == (200, 4)
    keep = np.r_[10:200]
    new = np.vstack([X[keep], X[:5]])
    new_ids = np.r_[ids[keep], [f"new{i}" for i in range(5)]]
    new_y = np.r_[y[keep], y[:5]]
    # max_iter=1: the duals after one pass start from the mapped, clipped warm start
    mapped = NPSVOR(C1=0.25, max_iter=1, shrinking=False, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mapped.fit(new, new_y, ids=new_ids, warm_start=state)
    duals = mapped._warm_duals(state, new_ids, mapped.classes_, new_y - 1, 0.25, 0.25)
    np.testing.assert_array_equal(duals[:, -5:], 0.0)
    expected = state["duals"][keep].T
    own = (new_y[None, :-5] - 1) == np.arange(4)[:, None]
    np.testing.assert_array_equal(
        duals[:, :-5], np.where(own, np.clip(expected, -0.25, 0.25), np.clip(expected, 0, 0.25)))
    assert (np.abs(mapped.dual_coef_) <= 0.25).all()
    # the squared losses have no upper bound: only the others' duals are held at ≥ 0
    loose = mapped._warm_duals(state, new_ids, mapped.classes_, new_y - 1, np.inf, np.inf)
    np.testing.assert_array_equal(loose[:, :-5], np.where(own, expected, np.maximum(expected, 0)))
    squared = NPSVOR(C1=0.25, loss="squared_hinge", random_state=0)
    squared.fit(new, new_y, ids=new_ids, warm_start=state)
    assert squared.converged_


def test_warm_start_from_its_own_solution_takes_one_pass():
    X, y = ordinal_data(n=500, m=10, p=5, seed=11, density=0.5)
    model = NPSVOR(random_state=0).fit(sp.csr_matrix(X), y)
    again = NPSVOR(random_state=1).fit(sp.csr_matrix(X), y, warm_start=model.warm_state())
    assert again.n_iter_ == 1 and again.converged_


def test_warm_start_with_new_and_missing_ranks():
    X, y = ordinal_data(n=300, m=8, p=4, seed=12)
    low = y <= 3
    first = NPSVOR(random_state=0).fit(X[low], y[low], ids=np.flatnonzero(low))
    model = NPSVOR(random_state=0).fit(X, y, ids=np.arange(300), warm_start=first.warm_state())
    assert model.classes_.tolist() == [1, 2, 3, 4] and model.converged_


# ------------------------------------------------------------------------------ reproducibility


def test_bit_for_bit_reproducible_and_independent_of_threads():
    X, y = ordinal_data(n=400, m=12, p=5, seed=13, density=0.4)
    Xs = sp.csr_matrix(X.astype(np.float32))
    a = NPSVOR(random_state=42, n_threads=1).fit(Xs, y)
    b = NPSVOR(random_state=42, n_threads=1).fit(Xs, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    np.testing.assert_array_equal(a.intercept_, b.intercept_)
    np.testing.assert_array_equal(a.dual_coef_, b.dual_coef_)
    from solvers._base import available_threads
    if available_threads() >= 2:
        c = NPSVOR(random_state=42, n_threads=2).fit(Xs, y)
        np.testing.assert_array_equal(a.coef_, c.coef_)
    d = NPSVOR(random_state=43, n_threads=1).fit(Xs, y)
    assert not np.array_equal(a.dual_coef_, d.dual_coef_)


# ------------------------------------------------------------------------------ errors, contract


def test_errors_name_both_values():
    X, y = ordinal_data(n=60, m=5, p=4, seed=14)
    with pytest.raises(ValueError, match=r"y has labels \[1, 2, 4\]; expected consecutive "
                                         r"integers \(3 is missing: rank 3 has no instance\)"):
        NPSVOR().fit(X, np.where(y == 3, 4, y))
    with pytest.raises(ValueError, match="single label"):
        NPSVOR().fit(X, np.full(60, 2))
    with pytest.raises(ValueError, match=r"y contains 1.5 at position 0; expected integer ranks"):
        NPSVOR().fit(X, np.r_[1.5, y[1:]].astype(float))
    with pytest.raises(ValueError, match=r"y has shape \(59,\), expected \(60,\)"):
        NPSVOR().fit(X, y[1:])
    bad = X.copy()
    bad[7, 3] = np.nan
    with pytest.raises(ValueError, match=r"X contains nan at position \(7, 3\)"):
        NPSVOR().fit(bad, y)
    with pytest.raises(ValueError, match=r"X contains nan at position \(7, 3\)"):
        NPSVOR().fit(sp.csr_matrix(bad), y)
    model = NPSVOR(random_state=0).fit(X, y)
    with pytest.raises(ValueError, match="X has 4 features, the model was trained with 5"):
        model.predict(X[:, :4])
    with pytest.raises(ValueError, match=r"ids are not unique: \[3\]"):
        NPSVOR().fit(X, y, ids=np.r_[3, 3, np.arange(4, 62)])
    with pytest.raises(ValueError, match="predictor is 'mid'"):
        NPSVOR(predictor="mid").fit(X, y)
    with pytest.raises(ValueError, match="loss is 'l2'"):
        NPSVOR(loss="l2").fit(X, y)
    with pytest.raises(ValueError, match="C1 is -1"):
        NPSVOR(C1=-1).fit(X, y)
    state = model.warm_state()
    state["algorithm"] = np.array("TopPush")
    with pytest.raises(ValueError, match="comes from a 'TopPush' model"):
        NPSVOR().fit(X, y, warm_start=state)
    with pytest.raises(NotFittedError):
        NPSVOR().predict(X)


def test_convergence_warning_says_what_to_change():
    X, y = ordinal_data(n=100, m=5, p=3, seed=15)
    with pytest.warns(ConvergenceWarning, match="max_iter=1") as record:
        NPSVOR(max_iter=1, tol=1e-15).fit(X, y)
    assert "increase max_iter" in str(record[0].message)


def test_save_load_reproduces_scores_and_warm_state(tmp_path):
    X, y = ordinal_data(n=150, m=6, p=3, seed=16)
    model = NPSVOR(C1=0.5, predictor="old", random_state=0).fit(sp.csr_matrix(X), y,
                                                                 ids=np.arange(150) + 100)
    model.save(tmp_path / "m")
    loaded = NPSVOR.load(tmp_path / "m")
    assert loaded.get_params() == model.get_params()
    np.testing.assert_array_equal(loaded.predict_score(X), model.predict_score(X))
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    for key, value in model.warm_state().items():
        np.testing.assert_array_equal(loaded.warm_state()[key], value)
    assert loaded.n_iter_ == model.n_iter_ and loaded.n_features_in_ == 6


def test_constructor_only_stores_and_warm_up_compiles():
    model = NPSVOR(C1=2.0, n_threads=1)
    assert model.C1 == 2.0 and model.C2 is None
    assert not [a for a in vars(model) if a.endswith("_")]
    with pytest.raises(TypeError):
        NPSVOR(1.0)
    seconds = NPSVOR.warm_up(n_threads=1)
    assert isinstance(seconds, float)
    # every layout the docstring promises has its compiled solver: (data, indices, indptr)
    compiled = {tuple(str(t) for t in sig[:3]) for sig in K.solve_rank.signatures}
    csr32, csr64 = "array(int32, 1d, C)", "array(int64, 1d, C)"
    for data, index in [("array(float32, 1d, C)", csr32), ("array(float64, 1d, C)", csr32),
                        ("array(float64, 1d, C)", csr64), ("array(float32, 2d, C)", csr64),
                        ("array(float64, 2d, C)", csr64)]:
        assert (data, index, index) in compiled, (data, index, sorted(compiled))
    for predictor in (K.rank_new, K.rank_old, K.score_new, K.score_old):
        assert predictor.signatures, predictor
    # and a fit right after it, on CSR with int64 indices, is the dense fit and ranks well
    X, y = ordinal_data(n=400, seed=3)
    wide = sp.csr_matrix(X[:300])
    wide.indices, wide.indptr = wide.indices.astype(np.int64), wide.indptr.astype(np.int64)
    dense = NPSVOR(n_threads=1, random_state=0).fit(X[:300], y[:300])
    sparse = NPSVOR(n_threads=1, random_state=0).fit(wide, y[:300])
    np.testing.assert_allclose(sparse.coef_, dense.coef_, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(sparse.predict(X[300:]), dense.predict(X[300:]))
    assert mae(y[300:], dense.predict(X[300:])) < 0.3


# ------------------------------------------------------------------------------ metrics, text


def test_ordinal_metrics_against_direct_definitions():
    from sklearn.metrics import ndcg_score

    rng = np.random.default_rng(0)
    y = rng.integers(1, 6, 300)
    pred = np.clip(y + rng.integers(-2, 3, 300), 1, 5)
    assert mae(y, pred) == np.mean(np.abs(y - pred))
    assert mse(y, pred) == np.mean((y - pred) ** 2)
    assert accuracy(y, pred) == np.mean(y == pred)
    score = np.round(y + rng.normal(size=300), 1)  # with ties
    for k in (None, 10, 50):
        assert rating_ndcg(y, score, k=k) == pytest.approx(ndcg_score([y], [score], k=k))
    assert rating_ndcg(y, y) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="y_true and y_pred have lengths 300 and 299"):
        mae(y, pred[1:])


def test_featurize_text_is_stateless_sublinear_and_normalised():
    from pipeline.features import featurize_text

    texts = ["great great great film", "dull film", ""]
    X = featurize_text(texts, n_features=2**16)
    assert sp.isspmatrix_csr(X) or sp.issparse(X)
    assert X.dtype == np.float32 and X.shape == (3, 2**16)
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1))).ravel()
    np.testing.assert_allclose(norms, [1, 1, 0], atol=1e-6)
    row = X[0].toarray().ravel()
    values = np.sort(row[row > 0])  # unigrams great (tf 3), film; bigrams great great (2), ...
    raw = np.sort(np.array([1 + np.log(3), 1.0, 1 + np.log(2), 1.0]))
    np.testing.assert_allclose(values, raw / np.linalg.norm(raw), rtol=1e-6)
    np.testing.assert_array_equal(featurize_text(texts, n_features=2**16).toarray(), X.toarray())


# ------------------------------------------------------------------------------ real data


def _treebank(shared_data):
    """The authors' Treebank split (train X, y, test X, y); skips, saying so, without it."""
    from sklearn.datasets import load_svmlight_file

    root = shared_data / "npsvor-treebank-tfidf"
    if not (root / "Treebank.train.gz").exists():
        pytest.skip(f"Treebank TF-IDF data absent: {root}/Treebank.train.gz not found")
    X, y = load_svmlight_file(str(root / "Treebank.train.gz"), n_features=8569)
    Xt, yt = load_svmlight_file(str(root / "Treebank.test.gz"), n_features=8569)
    return X, y.astype(int), Xt, yt.astype(int)


def test_treebank_mae_in_the_expected_range(shared_data):
    X, y, Xt, yt = _treebank(shared_data)
    # C = 2^-1: what 5-fold CV on the training set picks from 2^-5..2^5 (bench/npsvor_text.py)
    model = NPSVOR(C1=0.5, random_state=0).fit(X, y)
    new = mae(yt, model.predict(Xt))
    model.set_params(predictor="old")
    old = mae(yt, model.predict(Xt))
    # the exact optimum scores 0.788; the paper reports 0.827 (r_new) / 0.830 (r_old)
    assert 0.76 <= new <= 0.81, new
    assert 0.76 <= old <= 0.82, old


def _converged_labels_for_every_seed(X, y, Xt, loss, tol):
    """Test labels of fits at C = 2^-1 for seeds 0..4, asserting each seed predicts the same."""
    labels = []
    for seed in range(5):
        model = NPSVOR(C1=0.5, loss=loss, tol=tol, random_state=seed, max_iter=10_000).fit(X, y)
        assert model.converged_, seed
        labels.append(model.predict(Xt))
    for seed, other in enumerate(labels[1:], start=1):
        assert np.array_equal(other, labels[0]), (loss, seed, int((other != labels[0]).sum()))
    return labels[0]


def test_treebank_optimum_is_the_authors_for_every_seed(shared_data):
    """Issue 36 item 5: solved to tol 1e-6, problem (4) (the paper's hinge, the authors'
    ``-m 1 -B 1``) at C = 2^-1 predicts the same 2,371 test labels for every order of
    coordinates, with 1,868 rank errors: MAE 0.787853, which the authors' own LinearNPSVOR
    prints converged (``train -s 9 -m 1 -c 0.5 -B 1 -e 1e-6``; ``bench/npsvor_treebank.py
    --authors`` compares the labels row by row: none differs). The seed spread at the default
    tol = 0.1 (0.779-0.792 for seeds 0..4, 0.776-0.807 over 30 seeds) is early stopping. A
    changed count means the problem, the bias or the predictor changed. About 1 s."""
    X, y, Xt, yt = _treebank(shared_data)
    labels = _converged_labels_for_every_seed(X, y, Xt, "hinge", 1e-6)
    assert np.abs(labels - yt).sum() == 1868
    for seed in range(5):
        early = NPSVOR(C1=0.5, random_state=seed).fit(X, y)  # the default tol = 0.1
        assert 0.77 <= mae(yt, early.predict(Xt)) <= 0.81, seed


def test_treebank_squared_loss_optimum_is_the_authors_for_every_seed(shared_data):
    """The issue's 0.774 is the authors' LinearNPSVOR with ``-m 2 -B 1`` at C = 2^-1: the
    squared losses (dual diagonal 0.5/C, no upper bound), stopped at their default tol 0.1,
    where their program prints mae = 0.774357 (1,836 rank errors; at ``-e 0.01`` 0.773513).
    Solved to tol 1e-5, every seed here predicts the same test labels as their converged run
    (``-e 1e-4`` or tighter) row for row: 1,837 rank errors, MAE 0.774779. Early stops at the
    default tol = 0.1 scatter 0.7748-0.7794 (seeds 0..4)."""
    X, y, Xt, yt = _treebank(shared_data)
    labels = _converged_labels_for_every_seed(X, y, Xt, "squared_hinge", 1e-5)
    assert np.abs(labels - yt).sum() == 1837
    for seed in range(5):
        early = NPSVOR(C1=0.5, loss="squared_hinge", random_state=seed).fit(X, y)
        assert 0.765 <= mae(yt, early.predict(Xt)) <= 0.785, seed
