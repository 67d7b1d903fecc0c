"""NPSVOR: linear nonparallel support vector ordinal regression by dual coordinate descent.

Shi, Wang, Shen, Niu, "A Novel Large-scale Ordinal Regression Model" (linear NPSVOR, DCD-2,
and the predictor r_new). One ε-insensitive "proximal" hyperplane f_k per rank k = 1..p:
rank-k instances within ε of f_k, lower ranks below −1 and higher ranks above +1 (problem 2).
The p problems are independent; each is solved through its n-variable dual (eq. 20) by
Algorithm 2 with shrinking, in parallel threads. The problem, the coordinate step, the stopping
rule and shrinking are written out in :mod:`solvers._npsvor_kernels`; this module validates,
dispatches, warm-starts, predicts and persists.
"""

from __future__ import annotations

import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from solvers import _npsvor_kernels as K
from solvers import _params as P
from solvers._base import (
    ConvergenceWarning,
    Estimator,
    check_ids,
    check_threads,
    check_X,
    map_by_id,
    seed_of,
)

__all__ = ["NPSVOR"]

INTERCEPT_FEATURE = 1.0  # value of the constant feature appended when fit_intercept=True
_PREDICT_ROWS = 1 << 14  # rows per block in decision_function (bounds temporary memory)


class NPSVOR(Estimator):
    """Linear ordinal regression with one ε-insensitive proximal hyperplane per rank.

    For each rank k (ranks are the consecutive integer labels of ``y``; I_k its instances)
    this solves (paper eq. 4, the linear form of problem 2)::

        min_w  ½‖w‖² + C1 Σ_{i∈I_k} max(|f_k(x_i)| − ε, 0) + C2 Σ_{i∉I_k} max(1 − ỹ_ki f_k(x_i), 0)

    with f_k(x) = wᵀx + b and ỹ_ki = +1 for instances of higher rank, −1 for lower rank: the
    hyperplane runs through rank k, lower ranks lie below −1 and higher ranks above +1. The
    bias is the weight of an appended constant feature of value 1 (LIBLINEAR's ``-B 1``), so it
    is regularised like the other weights. Each rank's dual (eq. 20, n variables: the merged
    α⁺ − α⁻ for rank-k rows) is solved by dual coordinate descent (Algorithm 2, DCD-2): a
    random order every pass, closed-form steps, shrinking, and the stopping rule of eq. 31
    measured against α = 0. Ranks are solved in parallel threads. ``loss="squared_hinge"``
    squares both losses (the L2 loss the paper's conclusion names; the authors' code ``-m 2``).

    Parameters
    ----------
    C1 : float, default=1.0
        Weight of the ε-insensitive loss of the rank's own instances.
    C2 : float or None, default=None
        Weight of the hinge loss of the other ranks' instances; None means equal to ``C1``
        (the paper's recommendation, section 4.2.2).
    epsilon : float, default=0.1
        Half-width ε of the insensitive zone around each hyperplane (the paper's 0.1).
    loss : {"hinge", "squared_hinge"}, default="hinge"
        ``"hinge"``: the losses above (problem 4, the paper's experiments).
        ``"squared_hinge"``: both squared, C1 Σ max(|f| − ε, 0)² + C2 Σ max(1 − ỹ f, 0)²
        (the L2 loss the paper's conclusion names; what the authors' LinearNPSVOR solves with
        ``-m 2``). Its dual is strongly convex, so it needs fewer passes. Each loss wants its
        own C: on Treebank at C = 2^-1 the squared optimum scores test MAE 0.775 against the
        hinge's 0.788, at C = 1 both about 0.785 (bench/npsvor_treebank.py, docs/solver-notes.md).
    fit_intercept : bool, default=True
        Append the constant feature 1 (a bias per rank, regularised).
    predictor : {"new", "old"}, default="new"
        ``predict`` rule: r_new (eq. 36), 1 + #{k < p : f_k(x) + f_{k+1}(x) > 0}, or r_old
        (eq. 3), argmin_k |f_k(x)|.
    tol : float, default=0.1
        Stop a rank when a pass's summed optimality violation is at most ``tol`` times that of
        the point α = 0 (eq. 31; the paper's 0.1). The reference does not depend on the
        starting point, so a warm start from a solution stops after one pass. At 0.1 a rank
        may stop with a relative duality gap of up to 30 %, so the model (and its test error)
        moves with ``random_state``; 1e-2 or 1e-4 land near the seed-independent optimum at
        about 1.3x or 3x the time (Treebank: bench/npsvor_treebank.py).
    max_iter : int, default=1000
        Most passes over the data per rank.
    shrinking : bool, default=True
        Drop coordinates stuck at a bound (eqs. 32-33); all come back for a final full pass.
    n_threads : int or None, default=None
        Threads over the rank problems (None: numba's thread count). The result does not
        depend on it.
    random_state : None, int or numpy.random.Generator, default=None
        Seeds the order of coordinates; with an int the fit is bit-for-bit reproducible.
    verbose : bool, default=False
        Print one line per rank.

    Attributes
    ----------
    coef_ : ndarray of shape (p, n_features)
        w_k, one row per rank.
    intercept_ : ndarray of shape (p,)
        b_k.
    classes_ : ndarray of shape (p,)
        The ranks (consecutive integers, increasing).
    dual_coef_ : ndarray of shape (p, n_samples)
        α of eq. 20 per rank and training row: w_k = Σ_i ỹ_ki α_ki x_i, with α in
        [−C1, C1] for rank-k rows (α⁺ − α⁻) and in [0, C2] for the others (unbounded above
        with ``loss="squared_hinge"``).
    ids_ : ndarray of shape (n_samples,)
        Instance ids of the training rows (``ids``, default 0..n−1), the keys of the warm state.
    n_iter_ : int
        Most passes any rank took; ``n_iter_per_rank_`` holds each.
    converged_ : bool
        Whether every rank met the stopping rule before ``max_iter``.
    rank_fit_seconds_ : ndarray of shape (p,)
        Wall time of each rank's solve (diagnostic).
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 4))
    >>> y = np.digitize(X[:, 0] + 0.2 * rng.normal(size=300), [-1.0, 0.0, 1.0]) + 1
    >>> model = NPSVOR(C1=1.0, random_state=0).fit(X, y)
    >>> model.classes_.tolist(), model.coef_.shape
    ([1, 2, 3, 4], (4, 4))
    >>> float(np.mean(model.predict(X) == y)) > 0.8
    True
    """

    algorithm = "NPSVOR"
    scorer_kind = "ordinal_linear"   # published as pipeline.serving.scorers' linear rater
    format_version = 1
    fitted_attribute = "coef_"
    warm_keys = ("ids", "duals", "classes")

    def __init__(self, *, C1=1.0, C2=None, epsilon=0.1, loss="hinge", fit_intercept=True,
                 predictor="new", tol=0.1, max_iter=1000, shrinking=True, n_threads=None,
                 random_state=None, verbose=False):
        self.C1 = C1
        self.C2 = C2
        self.epsilon = epsilon
        self.loss = loss
        self.fit_intercept = fit_intercept
        self.predictor = predictor
        self.tol = tol
        self.max_iter = max_iter
        self.shrinking = shrinking
        self.n_threads = n_threads
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------------ fit

    def fit(self, X, y, ids=None, warm_start=None):
        """Fit the p rank hyperplanes.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
            float32/float64 dense or CSR (used as it is; other sparse formats become CSR,
            other dtypes float64; a CSR with duplicate entries is summed into a copy).
        y : array-like of shape (n_samples,)
            Integer ranks covering a consecutive range (e.g. 1..5, or 0..3).
        ids : array-like of shape (n_samples,), optional
            Unique instance ids (integers or strings) that key the warm state; default the
            row positions.
        warm_start : dict, optional
            ``warm_state()`` of an earlier fit. Its duals are taken over by instance id and
            rank label (new rows and new ranks start at 0, vanished rows are dropped), clipped
            into this fit's box (its ``loss``'s), and w is rebuilt from them exactly.

        Returns
        -------
        self
        """
        C1, C2, eps, squared, tol, max_iter, shrinking, n_threads = self._check_params()
        X = _as_kernel_matrix(X)
        n, m = X.shape
        classes, y_rank = _check_ranks(y, n)
        ids = check_ids(ids, n)
        p = classes.size
        duals = np.zeros((p, n))
        if warm_start is not None:
            bounds = (np.inf, np.inf) if squared else (C1, C2)
            duals = self._warm_duals(warm_start, ids, classes, y_rank, *bounds)
        data, indices, indptr = _kernel_arrays(X)
        sq_norms = np.empty(n)
        K.row_sq_norms(data, indices, indptr, n, sq_norms)
        bias = INTERCEPT_FEATURE if self.fit_intercept else 0.0
        seed = seed_of(self.random_state) % 2**64  # SeedSequence takes non-negative ints
        seeds = np.random.SeedSequence(seed).generate_state(p, np.uint64)
        coef = np.zeros((p, m))
        intercept = np.zeros(p)
        n_iter = np.zeros(p, dtype=np.int64)
        ratios = np.zeros(p)
        converged = np.zeros(p, dtype=bool)
        seconds = np.zeros(p)

        def solve(k):
            started = time.perf_counter()
            out = K.solve_rank(data, indices, indptr, sq_norms, y_rank, k, bias, C1, C2, eps,
                               squared, tol, max_iter, shrinking, seeds[k], duals[k], coef[k])
            n_iter[k], wb, ratios[k], converged[k] = out
            intercept[k] = wb * bias
            seconds[k] = time.perf_counter() - started
            if self.verbose:
                print(f"NPSVOR rank {classes[k]} ({k + 1}/{p}): {n_iter[k]} passes, "
                      f"|v|_1/|v(0)|_1 = {ratios[k]:.3g}, {seconds[k]:.3f} s", flush=True)

        workers = min(n_threads, p)
        if workers == 1:
            for k in range(p):
                solve(k)
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(solve, range(p)))

        self.coef_ = coef
        self.intercept_ = intercept
        self.classes_ = classes
        self.dual_coef_ = duals
        self.ids_ = ids.copy()
        self.n_iter_per_rank_ = n_iter
        self.n_iter_ = int(n_iter.max())
        self.converged_ = bool(converged.all())
        self.rank_fit_seconds_ = seconds
        self.n_features_in_ = m
        if not self.converged_:
            bad = np.flatnonzero(~converged)
            detail = ", ".join(f"rank {classes[k]}: |v|_1/|v(0)|_1 = {ratios[k]:.3g}"
                               for k in bad[:5])
            self._warn_not_converged(f"{detail}; the rule needs |v|_1/|v(0)|_1 <= tol={tol:g}")
        return self

    _parameter_constraints = {
        "C1": P.Positive(), "C2": P.Optional(P.Positive()),
        "epsilon": P.Positive(allow_zero=True), "loss": P.Choice(("hinge", "squared_hinge")),
        "fit_intercept": P.Bool(),
        "predictor": P.Choice(("new", "old")), "tol": P.Positive(), "max_iter": P.Int(1),
        "shrinking": P.Bool(), "n_threads": P.Threads(), "random_state": P.Seed(),
        "verbose": P.Bool()}

    def _check_joint_params(self):
        """C2 defaults to C1; returns the parameters as ``fit`` uses them."""
        C1 = float(self.C1)
        C2 = C1 if self.C2 is None else float(self.C2)
        return (C1, C2, float(self.epsilon), self.loss == "squared_hinge", float(self.tol),
                int(self.max_iter), bool(self.shrinking), check_threads(self.n_threads))

    def _warm_duals(self, state, ids, classes, y_rank, U1, U2):
        """The warm start's duals on this fit's rows and ranks, clipped into the box
        [−U1, U1] (rank's own rows) and [0, U2] (the others), as (p, n)."""
        state = self._check_warm_state(state)
        old_ids, old_duals, old_classes = state["ids"], state["duals"], state["classes"]
        if old_duals.ndim != 2 or old_duals.shape != (old_ids.size, old_classes.size):
            raise ValueError(f"warm_start duals have shape {old_duals.shape}, expected "
                             f"({old_ids.size}, {old_classes.size}) for its {old_ids.size} ids "
                             f"and {old_classes.size} ranks")
        mapped = map_by_id(old_ids, old_duals, ids, name="duals")  # (n, p_old)
        duals = np.zeros((classes.size, ids.size))
        column = {int(c): j for j, c in enumerate(old_classes.tolist())}
        for k, label in enumerate(classes.tolist()):
            j = column.get(int(label))
            if j is None:
                continue
            in_rank = y_rank == k
            duals[k] = np.where(in_rank, np.clip(mapped[:, j], -U1, U1),
                                np.clip(mapped[:, j], 0.0, U2))
        return duals

    # ------------------------------------------------------------------ predict

    def decision_function(self, X):
        """Hyperplane values f_k(x) = w_kᵀx + b_k, shape (n_samples, p)."""
        self._check_fitted()
        X = check_X(X)
        if X.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {X.shape[1]} features, the model was trained with "
                             f"{self.n_features_in_}")
        F = np.empty((X.shape[0], self.coef_.shape[0]))
        W = self.coef_.T
        for start in range(0, X.shape[0], _PREDICT_ROWS):
            stop = min(start + _PREDICT_ROWS, X.shape[0])
            F[start:stop] = X[start:stop] @ W
        F += self.intercept_
        return F

    def predict(self, X):
        """Predicted ranks (labels of ``classes_``) by ``predictor``: r_new (eq. 36) or
        r_old (eq. 3, the first of equally near hyperplanes)."""
        F = self.decision_function(X)
        index = np.empty(F.shape[0], dtype=np.int64)
        (K.rank_new if self.predictor == "new" else K.rank_old)(F, index)
        return self.classes_[index]

    @classmethod
    def from_scorer(cls, params: dict, arrays: dict) -> "NPSVOR":
        """A predict-only model from a published ``ordinal_linear`` scorer (its
        ``predictor``, and ``coef``, ``intercept``, ``classes`` of the kept columns)."""
        m = cls(predictor=params["predictor"])
        m.coef_ = arrays["coef"].astype(np.float64)
        m.intercept_, m.classes_ = arrays["intercept"], arrays["classes"]
        m.n_features_in_ = m.coef_.shape[1]
        return m

    def predict_score(self, X):
        """Continuous rank score: the predicted rank plus an offset in [−½, ½].

        For ranking items (higher = better rated). The score is the label ``predict`` gives,
        made continuous by where x lies between the two decision boundaries around it, so it
        orders items as ``predict`` does (a higher predicted rank never scores lower) and
        breaks ties within a rank. With ``predictor="new"``: the p − 1 ordered decisions
        g_k = f_k + f_{k+1} of eq. 35, sorted decreasingly, have c positive ones (r_new = c + 1)
        and the score is ``classes_[0] + c − ½ + u`` with u = g_(c)/(g_(c) − g_(c+1)) (linear
        between the boundaries), u = 2σ(g_(1)) at the lowest and tanh(g_(p−1)/2) at the highest
        rank. With ``predictor="old"``: r + ½(a − b)/(a + b), a and b the margins by which the
        neighbouring ranks' |f| lose to the nearest (1 past the extreme ranks). Both are
        continuous across adjacent ranks (see :func:`solvers._npsvor_kernels.score_new`).
        """
        F = self.decision_function(X)
        out = np.empty(F.shape[0])
        (K.score_new if self.predictor == "new" else K.score_old)(F, out)
        return out + self.classes_[0]

    # ------------------------------------------------------------------ state

    def _warm_arrays(self) -> dict:
        return {"ids": self.ids_, "duals": self.dual_coef_.T, "classes": self.classes_}

    def _state_arrays(self) -> dict:
        return {"coef": self.coef_, "intercept": self.intercept_, "classes": self.classes_,
                "dual_coef": self.dual_coef_, "ids": self.ids_,
                "n_iter_per_rank": self.n_iter_per_rank_,
                "converged": np.array(self.converged_),
                "rank_fit_seconds": self.rank_fit_seconds_}

    def _from_state(self, arrays: dict) -> None:
        self.coef_ = np.ascontiguousarray(arrays["coef"], dtype=np.float64)
        self.intercept_ = np.asarray(arrays["intercept"], dtype=np.float64)
        self.classes_ = np.asarray(arrays["classes"])
        self.dual_coef_ = np.ascontiguousarray(arrays["dual_coef"], dtype=np.float64)
        self.ids_ = np.asarray(arrays["ids"])
        self.n_iter_per_rank_ = np.asarray(arrays["n_iter_per_rank"])
        self.n_iter_ = int(self.n_iter_per_rank_.max())
        self.converged_ = bool(arrays["converged"])
        self.rank_fit_seconds_ = np.asarray(arrays["rank_fit_seconds"])
        self.n_features_in_ = self.coef_.shape[1]

    @classmethod
    def _tiny_problem(cls):
        X, y = _tiny_data(np.float32)
        return (sp.csr_matrix(X), y), {"ids": np.arange(X.shape[0])}

    @classmethod
    def warm_up(cls, n_threads=None) -> float:
        """Compile (or load from numba's cache) the kernels for CSR float32 (the text
        featurizer's output, via the base's tiny fit and warm refit) and, besides, for CSR
        float64 with int32 and int64 indices and for dense float32/float64, plus the
        predictors. Returns the seconds it took."""
        started = time.perf_counter()
        super().warm_up(n_threads=n_threads)
        X32, y = _tiny_data(np.float32)
        X64 = X32.astype(np.float64)
        csr64 = sp.csr_matrix(X64)
        wide = sp.csr_matrix(X64)
        wide.indices = wide.indices.astype(np.int64)
        wide.indptr = wide.indptr.astype(np.int64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            for X in (X32, X64, csr64, wide):
                model = cls(n_threads=n_threads, max_iter=3).fit(X, y)
        for predictor in ("new", "old"):
            model.set_params(predictor=predictor)
            model.predict(X64)
            model.predict_score(X64)
        return time.perf_counter() - started


# ---------------------------------------------------------------------- helpers


def _as_kernel_matrix(X):
    """``check_X`` plus: a CSR with duplicate entries is summed into a copy (the kernels take
    ‖x_i‖² from the stored entries)."""
    if sp.issparse(X) and X.format == "csr":
        bad = ~np.isfinite(X.data)
        if bad.any():  # named here as the dense check names it: nan, not np.float64(nan)
            p = int(np.flatnonzero(bad)[0])
            row = int(np.searchsorted(X.indptr, p, side="right") - 1)
            raise ValueError(f"X contains {X.data[p].item()!r} at position ({row}, "
                             f"{int(X.indices[p])}); expected finite values")
    X = check_X(X)
    if X.shape[0] == 0:
        raise ValueError("X has 0 rows; NPSVOR needs training instances")
    if sp.issparse(X) and not X.has_canonical_format:
        X = X.copy()
        X.sum_duplicates()
    return X


def _kernel_arrays(X):
    if sp.issparse(X):
        return X.data, X.indices, X.indptr
    empty = np.empty(0, dtype=np.int64)
    return X, empty, empty


def _check_ranks(y, n):
    """``(classes, y_rank)``: the consecutive integer labels and each row's rank index 0..p−1;
    errors name what is wrong."""
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"y has shape {y.shape}, expected ({n},) to match the {n} rows of X")
    if y.dtype.kind == "f":
        bad = ~np.isfinite(y) | (y != np.round(y))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"y contains {y[i].item()!r} at position {i}; expected integer "
                             "ranks")
        y = y.astype(np.int64)
    elif y.dtype.kind not in "iu":
        raise ValueError(f"y has dtype {y.dtype}; expected integer ranks")
    classes, y_rank = np.unique(y, return_inverse=True)
    if classes.size < 2:
        raise ValueError(f"y has the single label {classes.tolist()}; NPSVOR needs at least "
                         "two consecutive ranks")
    lo, hi = int(classes[0]), int(classes[-1])
    if hi - lo + 1 != classes.size:
        # the first missing ranks from the gaps between labels: never a range over the labels'
        # span, which one stray label (1e9) would make as large as memory
        n_missing, missing = hi - lo + 1 - classes.size, []
        for g in np.flatnonzero(np.diff(classes) > 1):
            start = int(classes[g]) + 1
            missing += range(start, min(int(classes[g + 1]), start + 10 - len(missing)))
            if len(missing) >= 10:
                break
        shown = classes.tolist() if classes.size <= 20 else classes[:20].tolist() + ["..."]
        gone = (f"{missing[0]} is missing" if n_missing == 1 else
                f"{n_missing:,} ranks are missing: {', '.join(map(str, missing))}"
                + (", ..." if n_missing > len(missing) else ""))
        raise ValueError(f"y has labels {shown}; expected consecutive integers ({gone}: rank "
                         f"{missing[0]} has no instance)")
    return classes.astype(np.int64), y_rank.astype(np.int64).reshape(-1)


def _tiny_data(dtype):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 8)).astype(dtype)
    X[rng.random(X.shape) < 0.5] = 0.0
    y = np.digitize(X[:, 0] + X[:, 1], [-0.5, 0.5]) + 1
    return X, y
