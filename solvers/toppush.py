"""TopPush: bipartite ranking that pushes positives above the highest-scored negative.

Li, Jin, Zhou, "Top Rank Optimization in Linear Time" (NIPS 2014). The linear scorer
f(x) = wᵀx minimizes (paper eq. 6, λ = ``reg``)

    λ/2 ‖w‖² + 1/m Σ_i ℓ(max_j wᵀx⁻_j − wᵀx⁺_i)

through its dual (eqs. 7-9) over (α, β) ∈ {α ≥ 0, β ≥ 0, 1ᵀα = 1ᵀβ}, with Nesterov's
accelerated projected gradient and a line search (Algorithm 1) and the exact expected-linear-time
projection of Algorithm 2. The driver is :mod:`solvers._toppush_solver`, the kernels
:mod:`solvers._toppush_kernels`; this module validates, dispatches on dtype and storage,
warm-starts and persists.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp

from solvers import _toppush_solver as S
from solvers._base import (
    DegenerateFitWarning,
    Estimator,
    check_bool,
    check_choice,
    check_ids,
    check_int,
    check_positive,
    check_X,
    map_by_id,
    rng_of,
)

__all__ = ["TopPush"]



class TopPush(Estimator):
    """Linear bipartite ranker that maximizes the positives ranked above the top negative.

    Minimizes ``reg/2 ‖w‖² + 1/m Σ_i ℓ(max_j wᵀx⁻_j − wᵀx⁺_i)`` (paper eq. 6 with λ = ``reg``;
    m positives x⁺, n negatives x⁻) through the dual (eq. 7) over the m + n dual variables
    (α, β): accelerated projected gradient with line search (Algorithm 1) and the exact,
    expected O(m + n) projection onto {α ≥ 0, β ≥ 0, 1ᵀα = 1ᵀβ} (Algorithm 2). One iteration
    costs one pass over the non-zeros of the working rows plus, per line-search trial, a pass
    over the rows whose dual variable is non-zero; the working rows are all positives and the
    negatives that may still reach the top (low-scored negatives are shrunk away and checked
    again at the end; of equal negative rows in a CSR X only one is kept). Besides the
    paper's rules, the solver restarts the momentum when the objective goes up and lets the
    step size grow back (:mod:`solvers._toppush_solver`).

    When the mean of the positives lies in the convex hull of the negatives, w = 0 minimizes
    eq. 6 at every ``reg`` (every w scores some negative at least as high as that mean, and ℓ
    is non-decreasing); more generally eq. 6 may prefer the best w only slightly to w = 0. Such
    a fit warns (:class:`DegenerateFitWarning`): its ranking is set by where the iterations
    stopped, not by the objective.

    Parameters
    ----------
    reg : float, default=1.0
        λ of eq. 6 (the authors' code and experiments use λ = 1 by default). Larger is
        smoother; w = (αᵀX⁺ − βᵀX⁻)/(λm) (eq. 9).
    loss : {"truncated_quadratic", "logistic", "exponential"}, default="truncated_quadratic"
        ℓ(z) = [1 + z]₊² (the paper's), log(1 + eᶻ) or eᶻ, each used through its conjugate.
    tol : float, default=2e-2
        Relative duality gap at which to stop: the first iterate (α, β) whose w (eq. 9)
        satisfies P(w) − D(α, β) ≤ ``tol``·D(α, β), with P the primal objective (eq. 6) and
        D = −g(α, β)/m the dual value, a lower bound on min P. So on return
        P(coef_) ≤ (1 + ``tol``)·min P, whether the fit started cold or warm. The default, 2%,
        costs about LogisticRegression's fit time on w8a (docs/solver-notes.md). If w = 0 itself
        meets the same rule (P(0) = ℓ(0) ≤ (1 + ``tol``)·D), the objective hardly prefers the
        fit to a constant score, and the fit warns (:class:`DegenerateFitWarning`).
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
        negatives have β > 0; of several equal negative rows of a CSR X only the first does
        (eq. 6 sees them only through their maximum, so the solver keeps one of each).
    n_iter_ : int
        Iterations of Algorithm 1 run by the last ``fit``.
    converged_ : bool
        Whether the stopping rule held before ``max_iter``.
    dual_objective_ : float
        g(α, β) of eq. 7 at the solution; −g/m is a lower bound on the optimum of eq. 6
        (equal to it at the exact solution).
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> from solvers import TopPush
    >>> from solvers.metrics import pos_at_top
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 5))
    >>> y = (X[:, 0] + 0.2 * rng.normal(size=300) > 1.0).astype(int)
    >>> model = TopPush(reg=0.1).fit(X, y)
    >>> bool(model.converged_)
    True
    >>> scores = model.decision_function(X)
    >>> bool(pos_at_top(y, scores) > 0.5)
    True

    With more label noise (``0.5 * rng.normal``) the positives' mean falls inside the convex
    hull of the negatives; then w = 0 is the optimum of eq. 6 at every ``reg`` and the fit
    says so with a :class:`DegenerateFitWarning`.
    """

    algorithm = "TopPush"
    format_version = 2
    fitted_attribute = "coef_"
    warm_keys = ("pos_ids", "alpha", "neg_ids", "beta")

    def __init__(self, *, reg=1.0, loss="truncated_quadratic", tol=2e-2, max_iter=10000,
                 fit_intercept=False, random_state=None, verbose=False):
        self.reg = reg
        self.loss = loss
        self.tol = tol
        self.max_iter = max_iter
        self.fit_intercept = fit_intercept
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(self):
        check_positive("reg", self.reg)
        check_choice("loss", self.loss, S.LOSSES)
        check_positive("tol", self.tol, allow_zero=True)
        check_int("max_iter", self.max_iter, minimum=1)
        check_bool("fit_intercept", self.fit_intercept)

    # ----------------------------------------------------------------------------------------
    # fit
    # ----------------------------------------------------------------------------------------

    def fit(self, X, y, ids=None, warm_start=None):
        """Learn w from labelled instances.

        Parameters
        ----------
        X : ndarray or scipy.sparse matrix of shape (n_samples, n_features)
            Dense arrays and CSR matrices are used as they are in float32 or float64 (other
            sparse formats are converted to CSR, other dtypes to float64). At least one row
            and one feature. Columns that are zero in every row are accepted silently: w is a
            combination of the rows (eq. 9), so their coefficient is exactly 0 and nothing
            else changes (sparse data often has such columns). If X is all zeros, or the
            scores come out constant for another reason, the fit warns
            (:class:`DegenerateFitWarning`).
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
        ids = check_ids(ids, n_samples)

        pos_rows = np.flatnonzero(y_pos)
        neg_rows = np.flatnonzero(~y_pos)
        m, n = pos_rows.size, neg_rows.size
        order = np.concatenate([pos_rows, neg_rows])
        Xs = X[order]  # one copy, positives first; nothing is copied inside the iterations
        dtype = Xs.dtype
        # one row per group of equal negatives (eq. 6 sees them only through their maximum);
        # the others keep β = 0, and a warm start's β of a group goes to its first row
        if S.DISTINCT_NEGATIVES and sp.issparse(Xs):
            neg_first, neg_rep = S.distinct_rows(Xs[m:])
        else:
            neg_first = neg_rep = np.arange(n)
        n_distinct = neg_first.size
        if n_distinct < n:
            Xs = Xs[np.concatenate([np.arange(m), m + neg_first])]
        if not sp.issparse(Xs):
            Xs = np.ascontiguousarray(Xs)

        loss = S.LOSSES[self.loss]
        gam = np.zeros(m + n_distinct)
        l_init = 1.0 / (m + n_distinct)  # Algorithm 1, step 1
        pos_ids, neg_ids = ids[pos_rows], ids[neg_rows]
        rng_state = np.array([rng_of(self.random_state).integers(0, 2**63)], dtype=np.uint64)
        if warm_start is not None:
            gam[:m], beta, l_prev = self._map_warm_start(warm_start, pos_ids, neg_ids)
            gam[m:] = np.bincount(neg_rep, weights=beta, minlength=n)[neg_first]
            if l_prev is not None:
                l_init = l_prev
            S.make_feasible(gam, m, loss, rng_state)

        gam, nu, n_iter, converged, gap, big_l, objective, primal = S.solve(
            Xs, m, gam, float(self.reg), loss, float(self.tol), int(self.max_iter),
            float(l_init), rng_state, bool(self.verbose))
        train_scores = np.asarray(Xs @ (nu / (self.reg * m)).astype(dtype)).ravel()

        self.coef_ = (nu / (self.reg * m)).astype(dtype)
        self.dual_alpha_ = gam[:m].copy()
        self.dual_beta_ = np.zeros(n)
        self.dual_beta_[neg_first] = gam[m:]
        self.n_iter_ = int(n_iter)
        self.converged_ = bool(converged)
        self.dual_objective_ = float(objective)
        self.n_features_in_ = int(n_features)
        self._pos_ids, self._neg_ids = pos_ids, neg_ids
        self._lipschitz = float(big_l)
        self.intercept_ = -float(np.max(train_scores[m:])) if self.fit_intercept else 0.0
        if self.verbose:
            print(f"TopPush: {self.n_iter_} iterations, dual objective {self.dual_objective_:.6g}"
                  f", relative duality gap {gap:.2e}, L {big_l:.3g}, m={m}, n={n}"
                  + (f" ({n_distinct} distinct)" if n_distinct < n else ""))
        if not converged:
            self._warn_not_converged(f"relative duality gap {gap:.2e} > tol={self.tol:g}")
        self._warn_if_degenerate(X, y_pos, train_scores, primal, -self.dual_objective_ / m)
        return self

    def _warn_if_degenerate(self, X, y_pos, scores, primal, lower_bound):
        """:class:`DegenerateFitWarning` when the training scores are constant, or when w = 0
        would have met the stopping rule: P(0) − D ≤ tol·D, with P(0) = ℓ(0) and D the dual
        lower bound on min P (then P(0) ≤ (1 + tol)·min P: eq. 6 hardly prefers any ranking
        to a constant score at this reg)."""
        p_zero = S.LOSS_AT_ZERO[self.loss]
        constant = not np.ptp(scores) > 0.0
        near_zero = p_zero - lower_bound <= self.tol * lower_bound
        if not (constant or near_zero):
            return
        row_norm, mean_gap = _data_scale(X, y_pos)
        scale = f"max row norm {row_norm:.3g}, ‖mean x⁺ − mean x⁻‖ = {mean_gap:.3g}"
        hull = ("if that does not help, the positives' mean lies in the convex hull of the "
                "negatives, where w = 0 is the optimum at every reg, and the features must "
                "change")
        if constant:
            what = "coef_ is all zero" if not np.any(self.coef_) else \
                "the training scores are all equal"
            if row_norm == 0.0:
                advice = "X is all zeros: there is nothing to rank by; give X varying features"
            elif mean_gap == 0.0:
                advice = ("the positives' and negatives' means coincide, so w = 0 is the "
                          "optimum at every reg and lowering reg cannot help; the features "
                          "must change")
            else:
                advice = f"lower reg (scores scale like 1/reg); {hull}"
            message = (f"TopPush fit is degenerate: {what}, so the model ranks every instance "
                       f"alike (reg={self.reg:g}; data: {scale}). "
                       f"{advice[0].upper()}{advice[1:]}.")
        else:
            message = (f"TopPush fit is degenerate at reg={self.reg:g}: w = 0 is within "
                       f"tol={self.tol:g} of the optimum of eq. 6 (P(0) = {p_zero:.4g}, "
                       f"optimum >= {lower_bound:.6g}, coef_ has P = {primal:.6g}), so the "
                       f"objective hardly prefers this ranking to a constant score. For the "
                       f"data's scale ({scale}) reg is large: the possible decrease below P(0) "
                       f"grows about like 1/reg. Lower reg (or tol); {hull}.")
        warnings.warn(message, DegenerateFitWarning, stacklevel=3)

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
        X = check_X(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, the model was trained with "
                             f"{self.n_features_in_}")
        return np.asarray(X @ self.coef_).ravel() + self.intercept_

    def _warm_arrays(self) -> dict:
        """``pos_ids``/``alpha`` (the positives' ids and α), ``neg_ids``/``beta`` (the
        negatives' ids and β), ``coef`` (w), ``lipschitz`` (the line search's last L, reused as
        the first step size) and ``reg`` (0-d arrays for the two scalars)."""
        return {"pos_ids": self._pos_ids, "alpha": self.dual_alpha_,
                "neg_ids": self._neg_ids, "beta": self.dual_beta_,
                "coef": self.coef_, "lipschitz": np.array(self._lipschitz),
                "reg": np.array(float(self.reg))}

    def _state_arrays(self) -> dict:
        state = self._warm_arrays()
        return {**state, "intercept": np.array(self.intercept_), "n_iter": np.array(self.n_iter_),
                "converged": np.array(self.converged_),
                "dual_objective": np.array(self.dual_objective_)}

    def _from_state(self, a: dict) -> None:
        self.coef_, self.dual_alpha_, self.dual_beta_ = a["coef"], a["alpha"], a["beta"]
        self._pos_ids, self._neg_ids = a["pos_ids"], a["neg_ids"]
        self.intercept_ = float(a["intercept"])
        self.n_iter_, self.converged_ = int(a["n_iter"]), bool(a["converged"])
        self.dual_objective_ = float(a["dual_objective"])
        self.n_features_in_ = int(self.coef_.shape[0])
        self._lipschitz = float(a["lipschitz"])

    @classmethod
    def _tiny_problem(cls):
        rng = np.random.default_rng(0)
        X = rng.random((60, 4))
        X[:10, 0] += 1.0  # the positives stand out along one feature: not a degenerate fit
        y = np.r_[np.ones(10), np.zeros(50)]
        return (X, y), {"ids": np.arange(60)}

    # ----------------------------------------------------------------------------------------
    # helpers
    # ----------------------------------------------------------------------------------------

    @staticmethod
    def _check_X_y(X, y):
        X = check_X(X)
        y = np.asarray(y)
        if y.ndim != 1:
            y = y.reshape(-1) if (y.ndim == 2 and 1 in y.shape) else y
            if y.ndim != 1:
                raise ValueError(f"y has shape {y.shape}, expected a 1-D array of labels")
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} labels")
        if X.shape[0] == 0:
            raise ValueError(f"X has 0 rows (shape {X.shape}) and y has 0 labels; TopPush "
                             "needs at least one positive and one negative instance")
        if X.shape[1] == 0:
            raise ValueError(f"X has 0 features (shape {X.shape}), expected at least 1")
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
            raise ValueError(f"y has only one class: all {y.shape[0]} labels are {only} "
                             f"({n_pos} positives, {y.shape[0] - n_pos} negatives); TopPush "
                             "needs at least one positive and one negative")
        return X, y_pos

    def _map_warm_start(self, state, pos_ids, neg_ids):
        full = state
        state = self._check_warm_state(state)
        alpha = map_by_id(state["pos_ids"], state["alpha"], pos_ids, "alpha")
        beta = map_by_id(state["neg_ids"], state["beta"], neg_ids, "beta")
        l_prev = None
        if "lipschitz" in full:
            lp = float(np.asarray(full["lipschitz"]))
            same_reg = float(np.asarray(full.get("reg", self.reg))) == float(self.reg)
            if np.isfinite(lp) and lp > 0 and same_reg:
                l_prev = lp
        return alpha, beta, l_prev


def _data_scale(X, y_pos):
    """(largest row norm, ‖mean x⁺ − mean x⁻‖) of a dense or CSR X; ``y_pos`` marks x⁺."""
    if sp.issparse(X):
        sq = np.asarray(X.multiply(X).sum(axis=1)).ravel()
    else:
        sq = np.einsum("ij,ij->i", X, X, dtype=np.float64)
    weights = np.where(y_pos, 1.0 / y_pos.sum(), -1.0 / (~y_pos).sum())
    diff = np.asarray(X.T @ weights.astype(X.dtype), dtype=np.float64).ravel()
    return float(np.sqrt(sq.max())), float(np.sqrt(diff @ diff))
