"""TopPush: bipartite ranking that pushes positives above the highest-scored negative.

Li, Jin, Zhou, "Top Rank Optimization in Linear Time" (NIPS 2014). The linear scorer
f(x) = wᵀx minimizes (paper eq. 6, λ = ``reg``)

    λ/2 ‖w‖² + 1/m Σ_i ℓ(max_j wᵀx⁻_j − wᵀx⁺_i)

through its dual (eqs. 7-9) over (α, β) ∈ {α ≥ 0, β ≥ 0, 1ᵀα = 1ᵀβ}, with Nesterov's
accelerated projected gradient and a line search (Algorithm 1) and the exact expected-linear-time
projection of Algorithm 2. The numerics live in :mod:`solvers._toppush_kernels`; this module
validates, dispatches on dtype and storage, warm-starts and persists.
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np
import scipy.sparse as sp

from solvers import _toppush_kernels as _k
from solvers._base import (
    ConvergenceWarning,
    ParamsMixin,
    check_choice,
    check_finite,
    check_positive,
    load_npz,
    save_npz,
)

_LOSSES = {
    "truncated_quadratic": _k.TRUNCATED_QUADRATIC,
    "logistic": _k.LOGISTIC,
    "exponential": _k.EXPONENTIAL,
}

# L is multiplied by this before each iteration's line search (1.0 is the paper's rule: L never
# decreases). 0.9 lets the step grow back where the curvature is lower; on w8a it needs about
# 40 % fewer iterations to meet the same tol, and stops closer to the optimum.
_L_SHRINK = 0.9
# momentum restart when the dual objective goes up (see _solve)
_RESTART = True
# shrinking of low-scored negatives (see _solve): every _SHRINK_EVERY iterations, with a score
# margin of _SHRINK_MARGIN times the score's change since the previous check
_SHRINK = True
_SHRINK_EVERY = 5
_SHRINK_MARGIN = 2.0


class TopPush(ParamsMixin):
    """Linear bipartite ranker that maximizes the positives ranked above the top negative.

    Minimizes ``reg/2 ‖w‖² + 1/m Σ_i ℓ(max_j wᵀx⁻_j − wᵀx⁺_i)`` (paper eq. 6 with λ = ``reg``;
    m positives x⁺, n negatives x⁻) through the dual (eq. 7) over the m + n dual variables
    (α, β): accelerated projected gradient with line search (Algorithm 1) and the exact,
    expected O(m + n) projection onto {α ≥ 0, β ≥ 0, 1ᵀα = 1ᵀβ} (Algorithm 2). One iteration
    costs one pass over the non-zeros of the working rows plus, per line-search trial, a pass
    over the rows whose dual variable is non-zero; the working rows are all positives and the
    negatives that may still reach the top (low-scored negatives are shrunk away and checked
    again at the end). Besides the paper's rules, the solver restarts the momentum when the
    objective goes up and lets the step size grow back (details in ``_solve``).

    Parameters
    ----------
    reg : float, default=1.0
        λ of eq. 6 (the authors' code and experiments use λ = 1 by default). Larger is
        smoother; w = (αᵀX⁺ − βᵀX⁻)/(λm) (eq. 9).
    loss : {"truncated_quadratic", "logistic", "exponential"}, default="truncated_quadratic"
        ℓ(z) = [1 + z]₊² (the paper's), log(1 + eᶻ) or eᶻ, each used through its conjugate.
    tol : float, default=5e-2
        Relative duality gap at which to stop: the first iterate (α, β) whose w (eq. 9)
        satisfies P(w) − D(α, β) ≤ ``tol``·P(w), with P the primal objective (eq. 6) and
        D = −g(α, β)/m the dual value, a lower bound on min P. So on return
        P(coef_) − min P ≤ ``tol``·P(coef_), whether the fit started cold or warm. (Before this
        rule, ``tol`` bounded the relative change of g per iteration, |Δg| ≤ tol·|g|,
        with default 1e-4; that rule let a warm start stop far from the optimum.) The gap
        closes like the square root of the dual's distance to its optimum, so tolerances below
        about 1e-10 cost many iterations; on w8a (λ = 1) 5e-2 takes about 75 iterations, 1e-2
        about 190 and 1e-4 about 1,300. The default 5e-2 is about the precision the authors'
        own solver reaches with its rule (on w8a it stops 4-8% above the optimum of eq. 6);
        ranking metrics such as Pos@Top do not improve past it (the exact optimum scores lower
        on w8a's test splits, see bench/toppush_binary.py), so tighter is slower, not better.
    max_iter : int, default=10000
        Iteration cap; reaching it raises a :class:`~solvers.ConvergenceWarning`.
    fit_intercept : bool, default=False
        The loss only sees score differences, so an intercept cannot be learned from it and the
        ranking never depends on it. With ``True``, ``intercept_`` is set to minus the highest
        training score of a negative, so ``decision_function(x) > 0`` means "x is ranked above
        every training negative". With ``False`` it is 0.
    random_state : int, numpy.random.Generator or None, default=None
        Seeds the random pivots of the projection. The solution does not depend on it (the
        projection is exact); only the running time does.
    verbose : bool, default=False
        Print the dual objective and the relative duality gap during the iterations and a
        summary at the end.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
        w of eq. 9, in the dtype of the training X (float32 or float64).
    intercept_ : float
        See ``fit_intercept``.
    dual_alpha_ : ndarray of shape (m,)
        α, one per positive, in the order the positives appear in X.
    dual_beta_ : ndarray of shape (n,)
        β, one per negative, in the order the negatives appear in X. Only the highest-scored
        negatives have β > 0.
    n_iter_ : int
        Iterations of Algorithm 1 run by the last ``fit``.
    converged_ : bool
        Whether the stopping rule held before ``max_iter``.
    dual_objective_ : float
        g(α, β) of eq. 7 at the solution; the primal optimum (eq. 6) is −g/m.
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> from solvers import TopPush
    >>> from solvers.metrics import pos_at_top
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 5))
    >>> y = (X[:, 0] + 0.5 * rng.normal(size=300) > 1.0).astype(int)
    >>> model = TopPush(reg=0.1).fit(X, y)
    >>> scores = model.decision_function(X)
    >>> bool(pos_at_top(y, scores) > 0.1)
    True
    """

    def __init__(self, *, reg=1.0, loss="truncated_quadratic", tol=5e-2, max_iter=10000,
                 fit_intercept=False, random_state=None, verbose=False):
        self.reg = reg
        self.loss = loss
        self.tol = tol
        self.max_iter = max_iter
        self.fit_intercept = fit_intercept
        self.random_state = random_state
        self.verbose = verbose

    # ----------------------------------------------------------------------------------------
    # parameters
    # ----------------------------------------------------------------------------------------

    def _check_params(self):
        check_positive("reg", self.reg)
        check_choice("loss", self.loss, _LOSSES)
        check_positive("tol", self.tol, allow_zero=True)
        if (not isinstance(self.max_iter, numbers.Integral) or isinstance(self.max_iter, bool)
                or self.max_iter < 1):
            raise ValueError(f"max_iter is {self.max_iter!r}, expected an integer >= 1")

    # ----------------------------------------------------------------------------------------
    # fit
    # ----------------------------------------------------------------------------------------

    def fit(self, X, y, ids=None, warm_start=None):
        """Learn w from labelled instances.

        Parameters
        ----------
        X : ndarray or scipy.sparse matrix of shape (n_samples, n_features)
            Dense arrays and CSR matrices are used as they are in float32 or float64 (other
            sparse formats are converted to CSR, other dtypes to float64).
        y : array-like of shape (n_samples,)
            Labels in {0, 1} or {−1, +1}; 1 / +1 is the positive class. Both must be present.
        ids : array-like of shape (n_samples,), optional
            Unique instance ids (integers or strings) that key the dual variables for a later
            warm start. Default: the row positions 0..n_samples−1.
        warm_start : dict, optional
            A previous :meth:`warm_state`. Duals are carried over by id (positives to
            positives, negatives to negatives); new instances start at 0, vanished ones are
            dropped, and the pair is projected back onto the feasible set. The optimum is the
            same as from a cold start (the problem is convex); it is reached in fewer
            iterations when the data changed little.

        Returns
        -------
        self : TopPush
        """
        self._check_params()
        X, y_pos = self._check_X_y(X, y)
        n_samples, n_features = X.shape
        ids = self._check_ids(ids, n_samples)

        pos_rows = np.flatnonzero(y_pos)
        neg_rows = np.flatnonzero(~y_pos)
        m, n = pos_rows.size, neg_rows.size
        order = np.concatenate([pos_rows, neg_rows])
        Xs = X[order]  # one copy, positives first; nothing is copied inside the iterations
        dtype = Xs.dtype
        if not sp.issparse(Xs):
            Xs = np.ascontiguousarray(Xs)

        loss = _LOSSES[self.loss]
        gam = np.zeros(m + n)
        l_init = 1.0 / (m + n)  # Algorithm 1, step 1
        pos_ids, neg_ids = ids[pos_rows], ids[neg_rows]
        rng_state = np.array([self._seed()], dtype=np.uint64)
        if warm_start is not None:
            gam[:m], gam[m:], l_prev = self._map_warm_start(warm_start, pos_ids, neg_ids)
            if l_prev is not None:
                l_init = l_prev
            self._make_feasible(gam, m, loss, rng_state)

        gam, nu, n_iter, converged, gap, big_l, objective = _solve(
            Xs, m, gam, float(self.reg), loss, float(self.tol), int(self.max_iter),
            float(l_init), rng_state, bool(self.verbose))

        self.coef_ = (nu / (self.reg * m)).astype(dtype)
        self.dual_alpha_ = gam[:m].copy()
        self.dual_beta_ = gam[m:].copy()
        self.n_iter_ = int(n_iter)
        self.converged_ = bool(converged)
        self.dual_objective_ = float(objective)
        self.n_features_in_ = int(n_features)
        self._pos_ids, self._neg_ids = pos_ids, neg_ids
        self._lipschitz = float(big_l)
        if self.fit_intercept:
            neg_scores = Xs[m:] @ self.coef_
            self.intercept_ = -float(np.max(neg_scores))
        else:
            self.intercept_ = 0.0
        if self.verbose:
            print(f"TopPush: {self.n_iter_} iterations, dual objective {self.dual_objective_:.6g}"
                  f", relative duality gap {gap:.2e}, L {big_l:.3g}, m={m}, n={n}")
        if not converged:
            warnings.warn(
                f"TopPush stopped at max_iter={self.max_iter} before the duality gap closed "
                f"(relative gap {gap:.2e} > tol={self.tol:g}); increase max_iter or "
                f"loosen tol (or warm-start from this fit).",
                ConvergenceWarning, stacklevel=2)
        return self

    # ----------------------------------------------------------------------------------------
    # prediction, warm start, persistence
    # ----------------------------------------------------------------------------------------

    def decision_function(self, X):
        """Ranking scores wᵀx + intercept_ (higher is ranked first).

        Parameters
        ----------
        X : ndarray or scipy.sparse matrix of shape (n_samples, n_features)

        Returns
        -------
        scores : ndarray of shape (n_samples,)
        """
        self._check_fitted()
        X = self._check_X(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, the model was trained with "
                             f"{self.n_features_in_}")
        return np.asarray(X @ self.coef_).ravel() + self.intercept_

    def warm_state(self):
        """The state a later ``fit(..., warm_start=state)`` starts from: a dict of arrays.

        Keys: ``pos_ids``/``alpha`` (the positives' ids and α), ``neg_ids``/``beta`` (the
        negatives' ids and β), ``coef`` (w), ``lipschitz`` (the line search's last L, reused as
        the first step size) and ``reg`` (0-d arrays for the two scalars). Nothing in it
        needs pickle, so it can be stored with ``np.savez``.
        """
        self._check_fitted()
        return {"pos_ids": self._pos_ids.copy(), "alpha": self.dual_alpha_.copy(),
                "neg_ids": self._neg_ids.copy(), "beta": self.dual_beta_.copy(),
                "coef": self.coef_.copy(), "lipschitz": np.array(self._lipschitz),
                "reg": np.array(float(self.reg))}

    def save(self, path):
        """Write the fitted model to the directory ``path`` (npz + JSON manifest, no pickle)."""
        self._check_fitted()
        state = self.warm_state()
        arrays = {k: state[k] for k in ("pos_ids", "alpha", "neg_ids", "beta", "coef")}
        params = self.get_params()
        if not (params["random_state"] is None
                or isinstance(params["random_state"], numbers.Integral)):
            params["random_state"] = None
        elif params["random_state"] is not None:
            params["random_state"] = int(params["random_state"])
        extra = {"intercept": self.intercept_, "n_iter": self.n_iter_,
                 "converged": self.converged_, "dual_objective": self.dual_objective_,
                 "n_features_in": self.n_features_in_, "lipschitz": self._lipschitz}
        save_npz(path, algorithm="TopPush", params=params, arrays=arrays, extra=extra)

    @classmethod
    def load(cls, path):
        """Read a model written by :meth:`save`."""
        params, arrays, extra = load_npz(path, algorithm="TopPush")
        model = cls(**params)
        model.coef_ = arrays["coef"]
        model.dual_alpha_ = arrays["alpha"]
        model.dual_beta_ = arrays["beta"]
        model._pos_ids = arrays["pos_ids"]
        model._neg_ids = arrays["neg_ids"]
        model.intercept_ = float(extra["intercept"])
        model.n_iter_ = int(extra["n_iter"])
        model.converged_ = bool(extra["converged"])
        model.dual_objective_ = float(extra["dual_objective"])
        model.n_features_in_ = int(extra["n_features_in"])
        model._lipschitz = float(extra["lipschitz"])
        return model

    # ----------------------------------------------------------------------------------------
    # helpers
    # ----------------------------------------------------------------------------------------

    def _check_fitted(self):
        if not hasattr(self, "coef_"):
            raise RuntimeError("this TopPush instance is not fitted yet; call fit(X, y) first")

    def _seed(self):
        rs = self.random_state
        if isinstance(rs, np.random.Generator):
            return int(rs.integers(0, 2**63))
        return int(np.random.default_rng(rs).integers(0, 2**63))

    @staticmethod
    def _check_X(X):
        if sp.issparse(X):
            if X.ndim != 2:
                raise ValueError(f"X has {X.ndim} dimensions, expected 2")
            X = X.tocsr() if X.format != "csr" else X
            if X.dtype not in (np.float32, np.float64):
                X = X.astype(np.float64)
            bad = ~np.isfinite(X.data)
            if bad.any():
                p = int(np.flatnonzero(bad)[0])
                row = int(np.searchsorted(X.indptr, p, side="right") - 1)
                raise ValueError(f"X contains {X.data[p]!r} at position ({row}, "
                                 f"{int(X.indices[p])}); expected finite values")
            if not X.has_sorted_indices:
                X = X.sorted_indices()
            return X
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(f"X has {X.ndim} dimensions (shape {X.shape}), expected 2")
        if X.dtype not in (np.float32, np.float64):
            try:
                X = X.astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"X has dtype {X.dtype}, expected numbers") from exc
        check_finite("X", X)
        return X

    def _check_X_y(self, X, y):
        X = self._check_X(X)
        y = np.asarray(y)
        if y.ndim != 1:
            y = y.reshape(-1) if (y.ndim == 2 and 1 in y.shape) else y
            if y.ndim != 1:
                raise ValueError(f"y has shape {y.shape}, expected a 1-D array of labels")
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} labels")
        if X.shape[1] == 0:
            raise ValueError("X has 0 features, expected at least 1")
        try:
            labels = np.unique(y)
        except TypeError as exc:
            raise ValueError(f"y has dtype {y.dtype}; expected labels in {{0, 1}} or "
                             f"{{-1, +1}}") from exc
        if y.dtype.kind not in "biuf":
            raise ValueError(f"y has dtype {y.dtype} with labels {labels[:5].tolist()}; "
                             f"expected labels in {{0, 1}} or {{-1, +1}}")
        ok01 = np.isin(labels, [0, 1]).all()
        ok11 = np.isin(labels, [-1, 1]).all()
        if not (ok01 or ok11):
            bad = labels[~np.isin(labels, [-1, 0, 1])]
            shown = (bad if bad.size else labels)[:5].tolist()
            raise ValueError(f"y contains the labels {shown}; expected labels in {{0, 1}} or "
                             f"{{-1, +1}}")
        y_pos = y == 1
        n_pos = int(y_pos.sum())
        if n_pos == 0 or n_pos == y.shape[0]:
            only = "positive (1)" if n_pos else f"negative ({labels[0]:g})"
            raise ValueError(f"y has only one class: all {y.shape[0]} labels are {only}; "
                             f"TopPush needs at least one positive and one negative")
        return X, y_pos

    @staticmethod
    def _check_ids(ids, n_samples):
        if ids is None:
            return np.arange(n_samples)
        ids = np.asarray(ids)
        if ids.ndim != 1 or ids.shape[0] != n_samples:
            raise ValueError(f"ids has shape {ids.shape}, expected ({n_samples},) to match the "
                             f"{n_samples} rows of X")
        if ids.dtype.kind not in "iuUS":
            raise ValueError(f"ids has dtype {ids.dtype}; expected integers or strings")
        uniq, counts = np.unique(ids, return_counts=True)
        if uniq.size != n_samples:
            dup = uniq[counts > 1][:5].tolist()
            raise ValueError(f"ids are not unique: {dup} appear more than once")
        return ids

    def _map_warm_start(self, state, pos_ids, neg_ids):
        if not isinstance(state, dict):
            raise ValueError(f"warm_start is a {type(state).__name__}, expected the dict "
                             f"returned by TopPush.warm_state()")
        missing = {"pos_ids", "alpha", "neg_ids", "beta"} - set(state)
        if missing:
            raise ValueError(f"warm_start lacks {sorted(missing)}; expected the dict returned "
                             f"by TopPush.warm_state()")
        alpha = _map_by_id(np.asarray(state["pos_ids"]), np.asarray(state["alpha"], float),
                           pos_ids, "alpha")
        beta = _map_by_id(np.asarray(state["neg_ids"]), np.asarray(state["beta"], float),
                          neg_ids, "beta")
        l_prev = None
        if "lipschitz" in state:
            lp = float(np.asarray(state["lipschitz"]))
            same_reg = float(np.asarray(state.get("reg", self.reg))) == float(self.reg)
            if np.isfinite(lp) and lp > 0 and same_reg:
                l_prev = lp
        return alpha, beta, l_prev

    @staticmethod
    def _make_feasible(gam, m, loss, rng_state):
        """Project the mapped duals onto Ξ (and α ≤ 1 for the logistic loss)."""
        np.nan_to_num(gam, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
        a0, b0 = gam[:m].copy(), gam[m:].copy()
        _k.project_equal_sums(a0, b0, gam[:m], gam[m:], np.empty(m), np.empty(gam.size - m),
                              rng_state, np.nan)
        if loss == _k.LOGISTIC:
            top = gam[:m].max()
            if top > 1.0:
                gam /= top


def _map_by_id(old_ids, old_vals, new_ids, name):
    """Values of ``old_vals`` (keyed by ``old_ids``) at ``new_ids``; 0 where an id is new."""
    if old_ids.shape != old_vals.shape:
        raise ValueError(f"warm_start has {old_ids.size} ids but {old_vals.size} {name} values")
    out = np.zeros(new_ids.shape[0])
    if old_ids.size == 0 or new_ids.size == 0:
        return out
    if (old_ids.dtype.kind in "US") != (new_ids.dtype.kind in "US"):
        raise ValueError(f"ids have dtype {new_ids.dtype} but the warm start's ids have dtype "
                         f"{old_ids.dtype}")
    srt = np.argsort(old_ids, kind="stable")
    old_sorted = old_ids[srt]
    pos = np.searchsorted(old_sorted, new_ids)
    pos_c = np.minimum(pos, old_sorted.size - 1)
    found = old_sorted[pos_c] == new_ids
    out[found] = old_vals[srt[pos_c[found]]]
    return out


def _kernel_arrays(matrix):
    """(is_sparse, indptr, indices, data, dense) views of a CSR matrix or a dense array."""
    if sp.issparse(matrix):
        # unsigned view of the column indices (no copy): numba then skips its wraparound test
        indices = matrix.indices.view(np.uint32 if matrix.indices.itemsize == 4 else np.uint64)
        return (True, matrix.indptr, indices, matrix.data,
                np.empty((0, 0), dtype=matrix.dtype))
    return (False, np.zeros(1, dtype=np.int32), np.zeros(0, dtype=np.uint32),
            np.zeros(0, dtype=matrix.dtype), matrix)


def _primal_objective(z, nu, m, reg, loss):
    """P(w) of eq. 6 at w = ν/(λm) (eq. 9), from the scores z = X ν of rows 0..m−1 (positives)
    and of the negatives whose maximum is wanted (rows m.. of ``z``)."""
    lm = reg * m
    t = (z[m:].max() - z[:m]) / lm  # max_j wᵀx⁻_j − wᵀx⁺_i
    with np.errstate(over="ignore"):
        if loss == _k.TRUNCATED_QUADRATIC:
            ell = np.square(np.maximum(1.0 + t, 0.0))
        elif loss == _k.LOGISTIC:
            ell = np.logaddexp(0.0, t)
        else:
            ell = np.exp(t)
    return float(nu @ nu) / (2.0 * lm * m) + float(ell.mean())


def _scores(X, vec, vec_dtype):
    """X · vec in float64 (the product itself in the dtype of X)."""
    v = vec if vec_dtype is np.float64 else vec.astype(vec_dtype)
    return np.asarray(X @ v, dtype=np.float64)


def _solve(X, m, gam, reg, loss, tol, max_iter, l_init, rng_state, verbose):
    """Algorithm 1: minimize the dual (7) over Ξ (8) from the feasible start ``gam``.

    Problem (rows 0..m−1 of ``X`` positive, m..N−1 negative, γ = [α; β], ν = αᵀX⁺ − βᵀX⁻)::

        min_{α ≥ 0, β ≥ 0, 1ᵀα = 1ᵀβ}  g = 1/(2λm) ‖ν‖² + Σ_i ℓ*(α_i)                  (7)

    whose optimum is −m times that of the primal (6), P(w) = λ/2‖w‖² + 1/m Σ_i ℓ(max_j
    wᵀx⁻_j − wᵀx⁺_i), at w = ν/(λm) (9).

    Nesterov's method with t_{k+1} = (1 + sqrt(1 + 4 t_k²))/2 and ω_k = (t_{k−1} − 1)/t_k;
    per iteration one product z = X ν(x_{k+1}) at the new iterate (scipy's CSR kernel or BLAS,
    in the dtype of X: each score is a short row sum, so float32 accumulation is harmless
    there). The scores at the search point s_{k+1} = x_{k+1} + ω(x_{k+1} − x_k), which the
    gradient (10) needs, follow by linearity, X ν(s) = (1 + ω) X ν(x_{k+1}) − ω X ν(x_k), so the
    same product serves the gradient and the stopping rule. The line search is
    :func:`solvers._toppush_kernels.line_search` (projections, and products over the rows with
    a non-zero dual only, in float64). Two additions to the paper's algorithm, neither of which
    changes the problem or the stopping rule:

    * momentum restart (O'Donoghue & Candès 2015): when g goes up, t is reset to 1. On w8a it
      hardly fires; on problems with a flat optimum it cuts the iterations to a given accuracy
      several-fold;
    * shrinking (as LIBLINEAR's dual solvers do): only the highest-scored negatives ever carry
      β > 0. Every ``_SHRINK_EVERY`` (5) iterations, negatives with β = 0 in the last two
      iterates whose score lies below the activation threshold τ = −γλmL by more than
      ``_SHRINK_MARGIN`` (2) times its change since the last check are removed from the
      working problem, so iterations cost O(nnz of the positives and the remaining negatives);
      on w8a about 400 of 32,000 negatives remain after 90 iterations. Removed coordinates
      are 0 in every iterate, so while none of them would have become active the iterates are
      those of the full problem. When the stopping rule holds, the removed negatives are
      scored once; if one would become active (score > τ) or would be the top-scored negative
      (the primal needs the maximum over all negatives), every removed negative is put back
      (with zero duals, so the Nesterov sequence simply continues on the full problem),
      shrinking is switched off, and the iterations go on until the rule holds again.

    Stopping rule: the relative duality gap at the iterate x_{k+1}. Every feasible (α, β)
    gives a lower bound D = −g(α, β)/m on min P and every w an upper bound P(w); with w from
    (9) of the same iterate, stop after the first iteration with

        P(w) − D(α, β) ≤ tol · P(w)          (P > 0 for all three losses)

    (or when the accepted step is exactly zero: s is then a fixed point of the projected
    gradient map, hence optimal). Both sides depend only on the iterate, not on where the
    iterations started, so a warm start near the optimum stops at once and a warm start far
    from it does not stop early; on return P(coef_) − min P ≤ tol · P(coef_). P needs the
    maximum score over all negatives; the working rows' scores give it while nothing is
    shrunk, and the removed negatives are scored when the rule is about to fire. The gap
    closes more slowly than the dual objective (P is not smooth in w at the top negative, so
    P(w) − min P shrinks like the square root of g − min g): on w8a at λ = 1, g is within
    0.4 % of its optimum after about 100 iterations while the gap is still about 4 %.

    Returns (γ over all N rows, ν, n_iter, converged, last relative gap, final L, g).
    """
    n_total = gam.shape[0]
    vec_dtype = np.float32 if X.dtype == np.float32 else np.float64
    lm = reg * m
    z_check = np.zeros(n_total - m)  # each negative's score at the last shrinking check
    rows = np.arange(n_total)  # working rows: all positives, the unshrunk negatives
    shrinking = _SHRINK and n_total - m > 1

    Xa = X
    arrays = _kernel_arrays(Xa)
    gam = gam.copy()
    gam_prev = gam.copy()
    buf_new, buf_s, buf_x0, buf_grad = (np.empty(n_total) for _ in range(4))
    work_a, work_c = np.empty(m), np.empty(n_total - m)
    nu = np.zeros(X.shape[1])
    _k.signed_combination(*arrays, m, gam, nu)
    nu_prev = nu.copy()
    nu_new = np.empty_like(nu)
    nu_s = np.empty_like(nu)
    z_x = _scores(Xa, nu, vec_dtype) if gam.any() else np.zeros(n_total)  # X ν(x_k)
    z_prev = z_x.copy()  # X ν(x_{k−1})

    f_old = _k.dual_objective(nu, gam, m, reg, loss)
    big_l = l_init
    t_prev, t_cur = 0.0, 1.0
    gamma = np.nan
    gap = np.inf
    converged = False
    n_iter = 0
    while n_iter < max_iter:
        n_iter += 1
        n_act = rows.shape[0]
        gam_new, s, x0, grad = (b[:n_act] for b in (buf_new, buf_s, buf_x0, buf_grad))
        omega = max((t_prev - 1.0) / t_cur, 0.0)
        _k.search_point(gam, gam_prev, nu, nu_prev, omega, s, nu_s)
        z = z_x if omega == 0.0 else (1.0 + omega) * z_x - omega * z_prev  # X ν(s)
        big_l, gamma, dd, trials = _k.line_search(
            *arrays, m, reg, loss, s, z, nu_s, big_l * _L_SHRINK, gamma, gam_new, nu_new,
            grad, x0, work_a, work_c[: n_act - m], rng_state)
        gam_prev, gam = gam, gam_new.copy()
        nu_prev, nu, nu_new = nu, nu_new, nu_prev
        z_prev, z_x = z_x, _scores(Xa, nu, vec_dtype)
        t_prev, t_cur = t_cur, 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t_cur * t_cur))
        f_new = _k.dual_objective(nu, gam, m, reg, loss)
        if _RESTART and f_new > f_old:
            t_prev, t_cur = 0.0, 1.0  # momentum reset (the objective went up)
        f_old = f_new
        primal = _primal_objective(z_x, nu, m, reg, loss)  # exact unless negatives are shrunk
        gap = (primal + f_new / m) / primal
        if verbose and (n_iter <= 5 or n_iter % 25 == 0):
            print(f"TopPush iter {n_iter:5d}  dual objective {f_new: .8e}  "
                  f"relative gap {gap:.2e}  L {big_l:.3e}  line-search trials {trials}  "
                  f"working negatives {n_act - m}")
        tau = -gamma * lm * big_l  # a negative with s_j = 0 gets β > 0 iff its score > τ

        if dd == 0.0 or gap <= tol:
            if n_act == n_total:
                converged = True
                break
            # score the removed negatives once: does any of them want β > 0 or hold the top?
            removed = np.setdiff1d(np.arange(m, n_total), rows, assume_unique=True)
            z_removed = _scores(X[removed], nu, vec_dtype)
            top_removed = z_removed.max()
            if not np.any(z_removed > tau) and top_removed <= z_x[m:].max():
                converged = True
                break
            if verbose:
                print(f"TopPush iter {n_iter:5d}  a removed negative became active or top: "
                      f"back to all {n_total - m} negatives, shrinking off")
            # removed coordinates are 0 in x_k and x_{k-1}: the momentum carries over as is
            gam, gam_prev = _expand(gam, rows, n_total), _expand(gam_prev, rows, n_total)
            z_full, z_prev_full = np.empty(n_total), np.empty(n_total)
            z_full[rows], z_full[removed] = z_x, z_removed
            z_prev_full[rows] = z_prev
            z_prev_full[removed] = _scores(X[removed], nu_prev, vec_dtype)
            z_x, z_prev = z_full, z_prev_full
            rows = np.arange(n_total)
            Xa = X
            arrays = _kernel_arrays(Xa)
            shrinking = False
            continue

        if shrinking and n_iter % _SHRINK_EVERY == 0:
            neg = slice(m, n_act)
            z_neg = z_x[neg]
            idx = rows[neg] - m
            if n_iter >= 2 * _SHRINK_EVERY:
                # remove if the score stays below τ even after twice its last change again
                moved = _SHRINK_MARGIN * np.abs(z_neg - z_check[idx])
                drop = ((gam[neg] == 0.0) & (gam_prev[neg] == 0.0) & (z_neg + moved < tau))
                n_drop = int(drop.sum())
                if n_drop >= 0.1 * (n_act - m) and n_drop < n_act - m:
                    keep = np.r_[np.ones(m, bool), ~drop]
                    rows = rows[keep]
                    gam, gam_prev = gam[keep], gam_prev[keep]
                    z_x, z_prev = z_x[keep], z_prev[keep]
                    Xa = X[rows]
                    arrays = _kernel_arrays(Xa)
                    if verbose:
                        print(f"TopPush iter {n_iter:5d}  shrinking: {rows.shape[0] - m} of "
                              f"{n_total - m} negatives left")
            z_check[idx] = z_neg
    return (_expand(gam, rows, n_total), nu, n_iter, converged, gap, big_l, f_old)


def _expand(gam, rows, n_total):
    """Working-problem duals back to all N rows (removed rows are 0)."""
    if rows.shape[0] == n_total:
        return gam
    full = np.zeros(n_total)
    full[rows] = gam
    return full
