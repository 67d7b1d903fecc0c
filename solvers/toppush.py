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

from solvers import _params as P
from solvers import _toppush_solver as S
from solvers._base import (
    DegenerateFitWarning,
    Estimator,
    check_ids,
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
    a fit warns (:class:`DegenerateFitWarning`), and its advice is checked against the data:
    the distance of the positives' mean to the negatives' hull (Frank-Wolfe) says whether any
    reg can help, and a point on the steepest-descent ray from w = 0 certifies down to which
    reg the fit stays degenerate (:func:`solvers._toppush_solver.zero_analysis`).

    ``coef_`` is never worse than w = 0: after the solver stops, P(w) of eq. 9's w is computed
    exactly; if it exceeds P(0) = ℓ(0) (which happens on degenerate data: P is not smooth at the
    top negative, so the w recovered from an approximate dual is first-order worse than the
    optimum while the dual bound is second-order close), ``coef_`` is instead the minimizer of
    eq. 6 along the steepest-descent direction of P at w = 0 (x̄⁺ minus the nearest point of
    the negatives' hull), or w = 0 itself when no direction descends (the hull case, where 0 is
    the optimum). ``coef_source_`` says which, and the warning says so.

    Parameters
    ----------
    reg : float, default=1.0
        λ of eq. 6 (the authors' code and experiments use λ = 1 by default). Larger is
        smoother; w = (αᵀX⁺ − βᵀX⁻)/(λm) (eq. 9).
    loss : {"truncated_quadratic", "logistic", "exponential"}, default="truncated_quadratic"
        ℓ(z) = [1 + z]₊² (the paper's), log(1 + eᶻ) or eᶻ, each used through its conjugate.
    tol : float, default=2e-2
        Relative duality gap at which to stop: the first iterate (α, β) at which the better of
        its w (eq. 9) and w = 0 satisfies min(P(w), P(0)) − D(α, β) ≤ ``tol``·D(α, β), with P
        the primal objective (eq. 6), P(0) = ℓ(0) and D = −g(α, β)/m the dual value, a lower
        bound on min P. So on return P(coef_) ≤ min(P(0), (1 + ``tol``)·min P), whether the
        fit started cold or warm. The default, 2%, costs about LogisticRegression's fit time
        on w8a (docs/solver-notes.md). If w = 0 itself meets the rule (P(0) ≤ (1 + ``tol``)·D),
        the objective hardly prefers any ranking to a constant score, and the fit warns
        (:class:`DegenerateFitWarning`).
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
        w of eq. 9, in the dtype of the training X (float32 or float64); if that w has
        P(w) > P(0), the point of the steepest-descent ray from w = 0 or w = 0 itself
        (``coef_source_``).
    objective_ : float
        P(coef_), eq. 6 evaluated exactly (float64) over all training rows; ≤ ``objective_zero_``.
    objective_zero_ : float
        P(0) = ℓ(0): 1 for the truncated quadratic and exponential losses, log 2 for the logistic.
    coef_source_ : {"dual", "descent_from_zero", "zero"}
        "dual": ``coef_`` is eq. 9 of the returned duals; otherwise that w was worse than
        w = 0, and ``coef_`` is the minimizer of eq. 6 along its steepest-descent direction from
        w = 0 ("descent_from_zero") or w = 0 itself ("zero"; then w = 0 is the optimum or within
        ``tol`` of it).
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
    hull of the negatives; then w = 0 is the optimum of eq. 6 at every ``reg``, ``coef_`` is
    0 and the fit says so with a :class:`DegenerateFitWarning`.

    >>> bool(model.objective_ <= model.objective_zero_)
    True
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

    _parameter_constraints = {
        "reg": P.Positive(), "loss": P.Choice(tuple(S.LOSSES)),
        "tol": P.Positive(allow_zero=True), "max_iter": P.Int(1), "fit_intercept": P.Bool(),
        "random_state": P.Seed(), "verbose": P.Bool()}

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

        p_zero = S.LOSS_AT_ZERO[self.loss]
        gam, nu, n_iter, converged, gap, big_l, objective, _ = S.solve(
            Xs, m, gam, float(self.reg), loss, float(self.tol), int(self.max_iter),
            float(l_init), rng_state, bool(self.verbose), p_zero)
        # the guard: never return a w worse than w = 0 (see the class docstring)
        coef = (nu / (self.reg * m)).astype(dtype)  # eq. 9
        primal_dual_w = S.primal_value(Xs, m, coef, self.reg, loss)
        analysis = None
        source = "dual"
        if not primal_dual_w <= p_zero * (1.0 + S.PRIMAL_ROUNDOFF):
            analysis = S.zero_analysis(Xs, m, float(self.reg), loss, float(self.tol))
            coef = np.zeros_like(coef)
            source = "zero"
            if analysis["direction"] is not None:
                descent = (analysis["t"] * analysis["direction"]).astype(dtype)
                if S.primal_value(Xs, m, descent, self.reg, loss) < p_zero:
                    coef, source = descent, "descent_from_zero"
            # the hull point is a dual point too: α = ℓ'(0)·1, β = ℓ'(0)·m·β_hull is feasible,
            # with D = ℓ(0) − ℓ'(0)²δ̂²/(2λ) (zero_analysis); keep it if it is the better bound
            gam_hull, g_hull = S.hull_duals(Xs, m, analysis["beta"], float(self.reg), loss)
            if g_hull < min(objective, 0.0):
                gam, objective = gam_hull, g_hull
                p_coef = S.primal_value(Xs, m, coef, self.reg, loss)
                gap = (p_coef + g_hull / m) / (-g_hull / m)
                converged = converged or gap <= self.tol
        train_scores = np.asarray(Xs @ coef).ravel()

        self.coef_ = coef
        self.objective_ = S.primal_value(Xs, m, coef, self.reg, loss)
        self.objective_zero_ = float(p_zero)
        self.coef_source_ = source
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
                  + (f" ({n_distinct} distinct)" if n_distinct < n else "")
                  + f"; P(coef_) {self.objective_:.6g} (coef_ from {source}), "
                    f"P(0) {p_zero:.4g}")
        guard_note = self._guard_note(primal_dual_w)
        if not converged:
            self._warn_not_converged(f"relative duality gap {gap:.2e} > tol={self.tol:g}"
                                     + (f"; {guard_note}" if guard_note else ""))
        self._warn_if_degenerate(X, y_pos, Xs, m, train_scores, -self.dual_objective_ / m,
                                 converged, guard_note, analysis)
        return self

    def _guard_note(self, primal_dual_w):
        """What the guard did, for the warnings ('' if coef_ is eq. 9's w)."""
        p_zero = self.objective_zero_
        if self.coef_source_ == "dual":
            return ""
        instead = ("coef_ is w = 0 itself" if self.coef_source_ == "zero" else
                   f"coef_ is instead the minimizer of eq. 6 along its steepest-descent "
                   f"direction from w = 0, with P = {self.objective_:.6g}")
        return (f"eq. 9's w from the duals had P = {primal_dual_w:.6g} > P(0) = {p_zero:.4g}, "
                f"worse than w = 0, so {instead}")

    def _warn_if_degenerate(self, X, y_pos, Xs, m, scores, lower_bound, converged, guard_note,
                            analysis):
        """:class:`DegenerateFitWarning` when the training scores are constant, or when w = 0
        met the stopping rule: P(0) − D ≤ tol·D, with P(0) = ℓ(0) and D the dual lower bound
        on min P (then P(0) ≤ (1 + tol)·min P: eq. 6 hardly prefers any ranking to a constant
        score at this reg), or when a converged fit's eq. 9 w was worse than w = 0.

        The advice follows :func:`solvers._toppush_solver.zero_analysis`: if the positives'
        mean lies in the negatives' convex hull, w = 0 is the optimum at every reg and lowering
        reg cannot help; if it lies outside, lowering reg is advised only down to a reg at which
        a point certifies that w = 0 no longer meets the rule, and every reg above the bound
        from the hull distance is named as degenerate too."""
        p_zero = self.objective_zero_
        constant = not np.ptp(scores) > 0.0
        near_zero = p_zero - lower_bound <= self.tol * lower_bound
        if not (constant or near_zero or (converged and guard_note)):
            return
        row_norm, mean_gap = _data_scale(X, y_pos)
        scale = f"max row norm {row_norm:.3g}, ‖mean x⁺ − mean x⁻‖ = {mean_gap:.3g}"
        if constant:
            what = "coef_ is all zero" if not np.any(self.coef_) else \
                "the training scores are all equal"
            head = (f"TopPush fit is degenerate: {what}, so the model ranks every instance "
                    f"alike (reg={self.reg:g}; data: {scale}).")
        else:
            head = (f"TopPush fit is degenerate at reg={self.reg:g}: w = 0 is within "
                    f"tol={self.tol:g} of the optimum of eq. 6 (P(0) = {p_zero:.4g}, "
                    f"optimum >= {lower_bound:.6g}, coef_ has P = {self.objective_:.6g}), so "
                    f"the objective hardly prefers any ranking to a constant score (data: "
                    f"{scale}).")
        if guard_note:
            head += f" {guard_note[0].upper()}{guard_note[1:]}."
        challenger = ("What can help: more or other features that set the positives apart "
                      "from the top negatives, a loss on the whole ranking instead of the top "
                      "(e.g. RankSVM / AUC), or a challenger such as logistic regression")
        if row_norm == 0.0:
            advice = "X is all zeros: there is nothing to rank by; give X varying features."
        elif mean_gap == 0.0:
            advice = ("The positives' and negatives' means coincide, so w = 0 is the optimum "
                      f"at every reg and lowering reg cannot help. {challenger}.")
        else:
            if analysis is None:
                analysis = S.zero_analysis(Xs, m, float(self.reg), S.LOSSES[self.loss],
                                           float(self.tol))
            advice = self._degenerate_advice(analysis, challenger)
        warnings.warn(f"{head} {advice}", DegenerateFitWarning, stacklevel=3)

    def _degenerate_advice(self, a, challenger):
        """The advice of the degenerate-fit warning from ``zero_analysis``'s dict ``a``."""
        # 3 significant digits, rounded the way that keeps each statement true
        reg_no = (f"w = 0 stays within tol of the optimum at every reg >= "
                  f"{_round_sig(a['reg_no'], up=True):.3g}" if np.isfinite(a["reg_no"]) else "")
        if a["status"] == "inside" or (a["reg_yes"] == 0.0 and a["reg_no"] < 1e-6 * self.reg):
            return (f"The positives' mean lies in the convex hull of the negatives (to within "
                    f"a distance of {a['delta']:.2g}): every w scores some negative at least as "
                    f"high as that mean, so w = 0 is the optimum of eq. 6 at every reg"
                    + (f" (certified: {reg_no})" if reg_no else "")
                    + f" and no reg pushes the positives above the top negative; lowering reg "
                      f"cannot help. {challenger}.")
        if a["reg_yes"] > 0.0:
            bracket = f" ({reg_no})" if reg_no else ""
            return (f"The positives' mean lies outside the negatives' convex hull (distance "
                    f"about {a['delta']:.2g}), so eq. 6 does prefer a ranking, by less than "
                    f"tol at this reg{bracket}. Lower reg to "
                    f"{_round_sig(a['reg_yes'], up=False):.3g} or below: there "
                    f"a point on the steepest-descent ray from w = 0 already has P < "
                    f"P(0)/(1 + tol), so the fit is no longer degenerate.")
        known = f"; {reg_no}" if reg_no else ""
        return (f"The positives' mean is within {a['delta']:.2g} of the negatives' convex hull"
                f"{known}; no lower reg was found at which eq. 6 gains more than tol over "
                f"w = 0 (hull test: {a['status']} after {a['steps']} steps), so lowering reg "
                f"is not known to help. {challenger}.")

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
                "dual_objective": np.array(self.dual_objective_),
                "objective": np.array(self.objective_),
                "objective_zero": np.array(self.objective_zero_),
                "coef_source": np.array(self.coef_source_)}

    def _from_state(self, a: dict) -> None:
        self.coef_, self.dual_alpha_, self.dual_beta_ = a["coef"], a["alpha"], a["beta"]
        self._pos_ids, self._neg_ids = a["pos_ids"], a["neg_ids"]
        self.intercept_ = float(a["intercept"])
        self.n_iter_, self.converged_ = int(a["n_iter"]), bool(a["converged"])
        self.dual_objective_ = float(a["dual_objective"])
        # optional keys (absent from bundles written before they existed; older readers skip
        # them), so the format version stays
        self.objective_ = float(a.get("objective", np.nan))
        self.objective_zero_ = float(a.get("objective_zero", S.LOSS_AT_ZERO[self.loss]))
        self.coef_source_ = str(a.get("coef_source", "dual"))
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


def _round_sig(x, up, digits=3):
    """x rounded up (``up``) or down to ``digits`` significant digits (0 and inf as they are)."""
    if not (np.isfinite(x) and x > 0.0):
        return x
    unit = 10.0 ** (np.floor(np.log10(x)) - digits + 1)
    return float((np.ceil if up else np.floor)(x / unit) * unit)


def _data_scale(X, y_pos):
    """(largest row norm, ‖mean x⁺ − mean x⁻‖) of a dense or CSR X; ``y_pos`` marks x⁺."""
    if sp.issparse(X):
        sq = np.asarray(X.multiply(X).sum(axis=1)).ravel()
    else:
        sq = np.einsum("ij,ij->i", X, X, dtype=np.float64)
    weights = np.where(y_pos, 1.0 / y_pos.sum(), -1.0 / (~y_pos).sum())
    diff = np.asarray(X.T @ weights.astype(X.dtype), dtype=np.float64).ravel()
    return float(np.sqrt(sq.max())), float(np.sqrt(diff @ diff))
