"""Kernel RankSVM: pairwise large-margin ranking within queries, with any of three kernels.

Kuo, Lee, Lin, "Large-scale Kernel RankSVM" (SDM 2014). With φ the kernel's feature map, the
ranker f(x) = Σ_i β_i K(x_i, x) solves the l-variable form of RankSVM (1.2):

    min_β  ½ βᵀQβ + C Σ_{(i,j)∈P} ℓ(1 − (Qβ)_i + (Qβ)_j),    Q_ij = K(x_i, x_j)

over the preference pairs P = {(i, j) : query_i = query_j, label_i > label_j}, with ℓ the
squared hinge ((3.13), default) or the hinge ((3.12), smoothed). ``solver="tron"`` is the
paper's trust-region Newton method (:mod:`solvers._ranksvm_tron`); ``solver="frank_wolfe"``
is ROSVM's conditional gradient on the pairwise dual (:mod:`solvers._ranksvm_frank_wolfe`).
Pair sums come from one sort per query (:mod:`solvers._ranksvm_kernels`), Q from BLAS blocks
under a memory limit (:mod:`solvers._gram`). This module validates, lays the data out, warm
starts, sets the learned attributes and persists.
"""

from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from solvers import _params as P
from solvers import _ranksvm_kernels as _k
from solvers._base import (
    Estimator,
    check_finite,
    check_ids,
    check_threads,
    check_X,
    map_by_id,
    numba_threads,
    rng_of,
)
from solvers._gram import (
    KERNELS,
    FeatureSpace,
    GramMatrix,
    KernelSpace,
    KernelSpec,
    kernel_dot,
    nystroem_features,
)
from solvers._ranksvm_frank_wolfe import frank_wolfe
from solvers._ranksvm_tron import HINGE, HINGE_SMOOTHING, SQUARED_HINGE, PairLoss, tron

__all__ = ["KernelRankSVM"]

_LOSSES = (SQUARED_HINGE, HINGE)
_SOLVERS = ("tron", "frank_wolfe")
_APPROXIMATIONS = (None, "nystroem")
_EMPTY = np.zeros(0)


class KernelRankSVM(Estimator):
    """Kernel RankSVM trained on the l-variable problem (TRON) or its pairwise dual
    (Frank-Wolfe).

    Minimises ``½ βᵀQβ + C Σ_P ℓ(1 − (Qβ)_i + (Qβ)_j)`` (Kuo, Lee, Lin 2014, (3.13) for the
    squared hinge, (3.12) for the hinge) over one coefficient β_i per training instance, where
    P holds the pairs (i, j) of one query with label_i > label_j. Queries with one document or
    one relevance level add no pair and no variable. The scorer is
    ``f(x) = Σ_i β_i K(x_i, x)`` over the support instances (β_i ≠ 0).

    Parameters
    ----------
    C : float, default=1.0
        Weight of the pairwise loss (C of (1.2)); larger fits the training pairs harder.
    kernel : {"rbf", "linear", "poly"}, default="rbf"
        exp(−γ‖x − x'‖²), xᵀx' or (γ xᵀx' + coef0)^degree.
    gamma : float or None, default=None
        γ of the rbf and poly kernels; None means 1 / n_features.
    degree : int, default=3
        Degree of the poly kernel.
    coef0 : float, default=1.0
        coef0 of the poly kernel.
    loss : {"squared_hinge", "hinge"}, default="squared_hinge"
        ℓ(z) = max(0, z)² ((3.13), differentiable: TRON's natural problem) or max(0, z)
        ((3.12)). With ``solver="tron"`` the hinge is smoothed (Huber: z²/(2μ) for 0 < z ≤ μ)
        and solved for μ = 1, 0.1, 0.01 in turn, which stays within C·|P|·0.005 of (3.12)'s
        optimum; ``solver="frank_wolfe"`` solves the hinge's dual exactly and needs
        ``loss="hinge"``.
    solver : {"tron", "frank_wolfe"}, default="tron"
        Trust-region Newton with conjugate gradient on generalized Hessian-vector products,
        or conditional gradient with exact line search on the dual over pairs.
    tol : float, default=1e-3
        Stopping tolerance, measured from the start β = 0 whether or not the fit is warm
        started. ``tron``: stop when the norm of the gradient of the objective in the
        kernel's feature space, sqrt(ρᵀQρ) with ∇F(β) = Qρ, is at most ``tol`` times its
        value at β = 0 (LIBLINEAR's rule). ``frank_wolfe``: stop when the duality gap, an upper
        bound on the distance to the optimum, is at most ``tol`` times C·|P| (the gap and the
        primal objective at β = 0).
    max_iter : int, default=1000
        Cap on trust-region iterations (``tron``, all smoothing stages together) or on
        Frank-Wolfe iterations; reaching it raises a :class:`~solvers.ConvergenceWarning`.
    cache_size : float, default=2048
        Megabytes for the stored part of Q (float32, one triangle: l(l+1)/2 · 4 bytes, e.g.
        125 MB at l = 7,900 and 5 GB at l = 50,000). Rows that do not fit are recomputed by
        blocks at every product with Q (about 32 MB of working blocks besides). The solution
        does not depend on it.
    approximation : {None, "nystroem"}, default=None
        None solves the exact kernel problem. "nystroem" replaces K by its Nyström
        approximation on ``n_components`` landmark instances drawn from the training set, so
        that the problem becomes a linear RankSVM in explicit features: memory O(l·m) instead
        of O(l²), for l in the millions.
    n_components : int, default=1000
        Landmarks of the Nyström approximation.
    keep_gram : bool, default=True
        Keep the stored part of Q (at most ``cache_size`` MB) with the fitted model, so that
        the next ``fit`` of this estimator with the same kernel parameters computes only the
        rows of instances whose id is new or whose features changed (ids as given to
        ``fit``; the default ids are row positions). After 2% new judgments that is about 2% of
        Q's cost, the part of a warm refit that a warm start of β cannot save; it also serves a
        grid over C. False frees Q when ``fit`` returns. Never saved with the model.
    n_threads : int or None, default=None
        Threads of the parallel numba kernels (kernel values of Q's blocks, products with
        the stored part of Q, the pair sums from 10⁵ rows on) and of BLAS for the blocks of
        Q recomputed at every product (None: all numba threads). BLAS products with blocks
        and LAPACK calls run on one thread: OpenBLAS's threaded gemv and eigh were 10-20x
        slower than one thread on a machine busy with other processes.
    random_state : int, numpy.random.Generator or None, default=None
        Draws the Nyström landmarks; the exact solvers do not use it.
    verbose : bool, default=False
        Print the solver's iterations and a summary.

    Attributes
    ----------
    support_ : ndarray of int
        Rows of the training X with β_i ≠ 0 (the Nyström landmarks with ``"nystroem"``).
        Rows in no preference pair (queries with one document or one label) are never
        support. With TRON nearly every other row is: the optimum of (3.13) has β_i = 0 only
        where all of row i's pairs hold with margin, and an iterate stopped at ``tol`` is
        not exactly there. Frank-Wolfe's β = Aᵀα is zero on rows whose pairs were never
        violated along the way.
    support_vectors_ : ndarray of shape (n_support, n_features)
    dual_coef_ : ndarray of shape (n_support,)
        β of the support instances: ``decision_function(x) = Σ dual_coef_ K(sv, x)``.
    n_iter_ : int
        Trust-region or Frank-Wolfe iterations of the last ``fit`` (0: a warm start already
        met the stopping rule).
    n_cg_iter_ : int
        Conjugate-gradient steps of TRON (0 for Frank-Wolfe).
    converged_ : bool
    objective_ : float
        The objective at the solution (TRON: the smoothed one for ``loss="hinge"``;
        Frank-Wolfe: the dual (2)).
    n_pairs_ : int
        |P|, the preference pairs of the training data.
    gamma_ : float
        The γ used (``gamma`` or 1 / n_features).
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> from solvers.kernel_ranksvm import KernelRankSVM
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(200, 5))
    >>> query = np.repeat(np.arange(20), 10)
    >>> y = (X[:, 0] + 0.3 * rng.normal(size=200) > 0.5).astype(int)
    >>> model = KernelRankSVM(C=1.0).fit(X, y, query)
    >>> order = model.rank(X[:10], query[:10])
    >>> bool(y[order[0]] >= y[order[-1]])
    True
    """

    algorithm = "KernelRankSVM"
    scorer_kind = "kernel"           # published as pipeline.serving.scorers' kernel expansion
    format_version = 1
    fitted_attribute = "dual_coef_"
    warm_keys = ("ids", "beta", "landmark_ids", "landmark_w")

    def __init__(self, *, C=1.0, kernel="rbf", gamma=None, degree=3, coef0=1.0,
                 loss="squared_hinge", solver="tron", tol=1e-3, max_iter=1000,
                 cache_size=2048, approximation=None, n_components=1000, keep_gram=True,
                 n_threads=None, random_state=None, verbose=False):
        self.C = C
        self.kernel = kernel
        self.gamma = gamma
        self.degree = degree
        self.coef0 = coef0
        self.loss = loss
        self.solver = solver
        self.tol = tol
        self.max_iter = max_iter
        self.cache_size = cache_size
        self.approximation = approximation
        self.n_components = n_components
        self.keep_gram = keep_gram
        self.n_threads = n_threads
        self.random_state = random_state
        self.verbose = verbose

    # ----------------------------------------------------------------------------------------
    # parameters
    # ----------------------------------------------------------------------------------------

    _parameter_constraints = {
        "C": P.Positive(), "kernel": P.Choice(tuple(KERNELS)),
        "gamma": P.Optional(P.Positive()), "degree": P.Int(1), "coef0": P.Finite(),
        "loss": P.Choice(tuple(_LOSSES)), "solver": P.Choice(tuple(_SOLVERS)),
        "tol": P.Positive(allow_zero=True), "max_iter": P.Int(1), "cache_size": P.Positive(),
        "approximation": P.Optional(P.Choice(tuple(a for a in _APPROXIMATIONS if a))),
        "n_components": P.Int(1), "keep_gram": P.Bool(), "n_threads": P.Threads(),
        "random_state": P.Seed(), "verbose": P.Bool()}

    def _check_joint_params(self):
        """The Frank-Wolfe solver is the hinge loss's dual."""
        if self.solver == "frank_wolfe" and self.loss != HINGE:
            raise ValueError(f"solver='frank_wolfe' solves the dual of the hinge loss, but loss "
                             f"is {self.loss!r}; use loss='hinge' with it, or solver='tron' "
                             f"for loss={self.loss!r}")

    def _spec(self, n_features: int) -> KernelSpec:
        gamma = 1.0 / n_features if self.gamma is None else float(self.gamma)
        return KernelSpec(self.kernel, gamma, int(self.degree), float(self.coef0))

    # ----------------------------------------------------------------------------------------
    # fit
    # ----------------------------------------------------------------------------------------

    def fit(self, X, y, query, ids=None, warm_start=None):
        """Learn β from judged instances grouped in queries.

        Parameters
        ----------
        X : array-like or scipy.sparse matrix of shape (n_samples, n_features)
            Features (sparse input is made dense: the kernel blocks are dense).
        y : array-like of shape (n_samples,)
            Relevance labels (any real numbers; higher is more relevant).
        query : array-like of shape (n_samples,)
            Query of each row (integers or strings). Pairs are formed within a query only.
        ids : array-like of shape (n_samples,), optional
            Unique instance ids (integers or strings) that key β for a later warm start.
            Default: the row positions.
        warm_start : dict, optional
            A previous :meth:`warm_state`. β of instances whose id is kept is reused, new
            instances start at 0; the stopping rule is still measured from β = 0, so the result
            is as accurate as a cold fit's, and comes sooner when little changed.

        Returns
        -------
        self : KernelRankSVM
        """
        started = time.perf_counter()
        self._check_params()
        X, y, query = _check_X_y_query(X, y, query)
        n_samples, n_features = X.shape
        ids = check_ids(ids, n_samples)
        rows, qptr, level, n_pairs, n_queries = _pair_layout(y, query)
        if n_pairs == 0:
            raise ValueError(f"no preference pairs: none of the {n_queries} queries has two "
                             f"documents with different labels (all {n_samples} rows were "
                             "judged alike within their query)")
        spec = self._spec(n_features)
        Xt = X[rows]
        train_ids = ids[rows]
        state = None if warm_start is None else self._check_warm_state(warm_start)
        if state is not None:
            for key in ("beta", "landmark_w"):
                check_finite(f"warm_start['{key}']", state[key].astype(np.float64))
        n_threads = check_threads(self.n_threads)

        with numba_threads(n_threads):
            if self.approximation == "nystroem":
                space, landmark_pos, T = self._nystroem_space(Xt, spec)
                theta0 = self._nystroem_warm(state, space, train_ids, landmark_pos)
            else:
                space = KernelSpace(self._gram_of(Xt, train_ids, spec, n_threads))
                theta0 = None
                if state is not None:
                    theta0 = map_by_id(state["ids"], state["beta"], train_ids, "beta")
            solved = self._solve(space, qptr, level, n_pairs, theta0, n_threads)
        theta, f, n_iter, n_cg, converged, objective, detail = solved
        self._gram = space.gram if self.keep_gram and isinstance(space, KernelSpace) else None
        if self._gram is not None:
            self._gram.remember(theta, f)  # the next refit's warm start: Qθ without a product

        # learned attributes
        if self.approximation == "nystroem":
            support = rows[landmark_pos]
            dual = T @ theta
            # the representer β = −C ∇L(f) (exact at the optimum) keys the warm start by id
            beta_repr = self._representer(qptr, level, f)
            nz = np.flatnonzero(beta_repr)
            self._warm = {"ids": train_ids[nz], "beta": beta_repr[nz],
                          "landmark_ids": train_ids[landmark_pos], "landmark_w": theta.copy()}
        else:
            nz = np.flatnonzero(theta)
            support = rows[nz]
            dual = theta[nz]
            self._warm = {"ids": train_ids[nz], "beta": theta[nz].copy(),
                          "landmark_ids": train_ids[:0], "landmark_w": _EMPTY.copy()}
        self.support_ = support.astype(np.int64)
        self.support_vectors_ = np.array(X[support], dtype=np.float64)
        self.dual_coef_ = np.asarray(dual, dtype=np.float64)
        self.n_iter_ = int(n_iter)
        self.n_cg_iter_ = int(n_cg)
        self.converged_ = bool(converged)
        self.objective_ = float(objective)
        self.n_pairs_ = int(n_pairs)
        self.gamma_ = float(spec.gamma)
        self.n_features_in_ = int(n_features)
        if not converged:
            self._warn_not_converged(detail)
        if self.verbose:
            print(f"KernelRankSVM: {self.solver} on {rows.size} instances in "
                  f"{qptr.size - 1} queries with pairs, {n_pairs} pairs; {n_iter} iterations"
                  f"{f', {n_cg} CG steps' if self.solver == 'tron' else ''}, "
                  f"{space.n_products} products"
                  f"{f' ({space.gram.n_reused} rows of Q reused)' if self._gram else ''}; "
                  f"{'converged' if converged else detail}; "
                  f"{len(self.support_)} support instances; "
                  f"{time.perf_counter() - started:.2f} s")
        return self

    def _gram_of(self, Xt, train_ids, spec, n_threads) -> GramMatrix:
        """Q of the training rows: grown from the previous fit's when it was kept with the same
        kernel, otherwise built (the previous one is released first: never two at once)."""
        cache_bytes = float(self.cache_size) * 2**20
        previous, self._gram = getattr(self, "_gram", None), None
        if previous is not None and previous.spec == spec:
            grown = previous.grown(Xt, train_ids, cache_bytes, n_threads)
            if grown is not None:
                return grown
        del previous
        return GramMatrix(Xt, spec, cache_bytes, n_threads, ids=train_ids)

    def _solve(self, space, qptr, level, n_pairs, theta0, n_threads):
        """Run the chosen solver; returns (theta, f, n_iter, n_cg, converged, objective,
        detail of non-convergence)."""
        tol, C = float(self.tol), float(self.C)
        if self.solver == "frank_wolfe":
            f_warm = None
            if theta0 is not None and np.any(theta0):
                known = space.known_riesz(theta0)
                f_warm = space.forward(theta0, space.riesz(theta0) if known is None else known)
            res = frank_wolfe(space, PairLoss(qptr, level, n_threads=n_threads), C, n_pairs,
                              f_warm, tol=tol, max_iter=self.max_iter, verbose=self.verbose)
            detail = (f"duality gap {res.gap / res.gap0:.2e} of C|P| > tol={self.tol:g}")
            return (res.theta, res.f, res.n_iter, 0, res.converged, res.dual_objective, detail)
        if self.loss == SQUARED_HINGE:
            stages = [(None, tol)]
        elif theta0 is not None and np.any(theta0):
            stages = [(HINGE_SMOOTHING[-1], tol)]  # warm: straight to the final smoothing
        else:
            stages = [(mu, max(tol, 1e-2)) for mu in HINGE_SMOOTHING[:-1]]
            stages.append((HINGE_SMOOTHING[-1], tol))
        theta = theta0
        n_iter = n_cg = 0
        res = None
        for stage, (mu, stage_tol) in enumerate(stages):
            budget = self.max_iter - n_iter
            if budget <= 0:
                break
            res = tron(space, PairLoss(qptr, level, mu, n_threads), C, theta, tol=stage_tol,
                       max_iter=budget, verbose=self.verbose)
            theta = res.theta
            n_iter += res.n_iter
            n_cg += res.n_cg
        converged = res.converged and stage == len(stages) - 1
        detail = (f"gradient norm {res.grad_norm / max(res.grad_norm0, 1e-300):.2e} of its "
                  f"value at 0 > tol={self.tol:g}; {res.message}")
        return res.theta, res.f, n_iter, n_cg, converged, res.objective, detail

    def _nystroem_space(self, Xt, spec):
        n_rows = Xt.shape[0]
        m = min(int(self.n_components), n_rows)
        rng = rng_of(self.random_state)
        landmark_pos = np.sort(rng.choice(n_rows, size=m, replace=False))
        Z, T = nystroem_features(Xt, Xt[landmark_pos], spec)
        return FeatureSpace(Z), landmark_pos, T

    def _nystroem_warm(self, state, space, train_ids, landmark_pos):
        if state is None:
            return None
        same = (state["landmark_ids"].shape == landmark_pos.shape
                and state["landmark_w"].shape == (space.dim,)
                and np.array_equal(state["landmark_ids"], train_ids[landmark_pos]))
        if same:
            return state["landmark_w"].astype(np.float64)
        beta = map_by_id(state["ids"], state["beta"], train_ids, "beta")
        return space.adjoint(beta)

    def _representer(self, qptr, level, f):
        mu = None if self.loss == SQUARED_HINGE else HINGE_SMOOTHING[-1]
        _, grad, _ = PairLoss(qptr, level, mu).evaluate(f)
        return -float(self.C) * grad

    # ----------------------------------------------------------------------------------------
    # prediction
    # ----------------------------------------------------------------------------------------

    @classmethod
    def from_scorer(cls, params: dict, arrays: dict) -> "KernelRankSVM":
        """A predict-only model from a published ``kernel`` scorer (the kernel, and the
        ``support_vectors`` with their ``dual_coef``)."""
        m = cls(kernel=params["kernel"], degree=params["degree"], coef0=params["coef0"])
        m.support_vectors_ = arrays["support_vectors"].astype(np.float64)
        m.dual_coef_, m.gamma_ = arrays["dual_coef"], params["gamma"]
        m.n_features_in_ = params["n_features"]
        return m

    def decision_function(self, X):
        """Scores ``Σ_s dual_coef_[s] K(support_vectors_[s], x)`` of the rows of X (float64)."""
        self._check_fitted()
        X = _check_X_predict(X, self.n_features_in_)
        spec = KernelSpec(self.kernel, self.gamma_, int(self.degree), float(self.coef0))
        return kernel_dot(X, self.support_vectors_, self.dual_coef_, spec)

    def predict_rank(self, X, query):
        """Each row's 0-based position within its query when the query's rows are sorted by
        decreasing score (0 = ranked first; ties keep the input order)."""
        order, starts, group = self._order(X, query)
        position = np.empty(order.size, dtype=np.int64)
        position[order] = np.arange(order.size) - starts[group]
        return position

    def rank(self, X, query):
        """The rows of X as one ordering: queries in increasing query value, and within each
        query the rows by decreasing score (ties keep the input order). ``rank(X, q)[a:b]`` for
        a query's block is that query's ranking."""
        return self._order(X, query)[0]

    def _order(self, X, query):
        scores = self.decision_function(X)
        query = np.asarray(query)
        if query.ndim != 1 or query.shape[0] != scores.shape[0]:
            raise ValueError(f"query has shape {query.shape}, expected ({scores.shape[0]},) to "
                             f"match the {scores.shape[0]} rows of X")
        _, qinv = np.unique(query, return_inverse=True)
        order = np.lexsort((np.arange(scores.size), -scores, qinv))
        qs = qinv[order]
        new = np.ones(order.size, dtype=bool)
        new[1:] = qs[1:] != qs[:-1]
        group = np.cumsum(new) - 1
        starts = np.flatnonzero(new)
        return order, starts, group

    # ----------------------------------------------------------------------------------------
    # warm start and persistence
    # ----------------------------------------------------------------------------------------

    def _warm_arrays(self) -> dict:
        return dict(self._warm)

    def _state_arrays(self) -> dict:
        self._check_fitted()
        return {"support": self.support_, "support_vectors": self.support_vectors_,
                "dual_coef": self.dual_coef_, "n_iter": np.array(self.n_iter_),
                "n_cg_iter": np.array(self.n_cg_iter_), "converged": np.array(self.converged_),
                "objective": np.array(self.objective_), "n_pairs": np.array(self.n_pairs_),
                "gamma": np.array(self.gamma_), "n_features_in": np.array(self.n_features_in_),
                **{f"warm_{k}": v for k, v in self._warm.items()}}

    def _from_state(self, arrays: dict) -> None:
        self.support_ = arrays["support"].astype(np.int64)
        self.support_vectors_ = arrays["support_vectors"].astype(np.float64)
        self.dual_coef_ = arrays["dual_coef"].astype(np.float64)
        self.n_iter_ = int(arrays["n_iter"])
        self.n_cg_iter_ = int(arrays["n_cg_iter"])
        self.converged_ = bool(arrays["converged"])
        self.objective_ = float(arrays["objective"])
        self.n_pairs_ = int(arrays["n_pairs"])
        self.gamma_ = float(arrays["gamma"])
        self.n_features_in_ = int(arrays["n_features_in"])
        self._warm = {k: arrays[f"warm_{k}"] for k in self.warm_keys}

    @classmethod
    def _tiny_problem(cls):
        rng = np.random.default_rng(0)
        X = rng.normal(size=(120, 5))
        query = np.repeat(np.arange(12), 10)
        y = np.digitize(X[:, 0] + 0.5 * rng.normal(size=120), [0.0, 1.0])
        return (X, y, query), {}


# --------------------------------------------------------------------------------------------
# input checks and layout
# --------------------------------------------------------------------------------------------


def _as_dense(X, name="X"):
    """``check_X`` (finite, 2-D, float), then dense float64: the kernel blocks are dense."""
    X = check_X(X, name)
    if sp.issparse(X):
        X = X.toarray()
    return np.asarray(X, dtype=np.float64)


def _check_X_y_query(X, y, query):
    X = _as_dense(X)
    n = X.shape[0]
    if n == 0 or X.shape[1] == 0:
        raise ValueError(f"X has shape {X.shape}; expected at least one row and one feature")
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"y has shape {y.shape}, expected ({n},) to match the {n} rows of X")
    if y.dtype.kind not in "biuf":
        raise ValueError(f"y has dtype {y.dtype}; expected numeric relevance labels")
    y = y.astype(np.float64)
    check_finite("y", y)
    query = np.asarray(query)
    if query.ndim != 1 or query.shape[0] != n:
        raise ValueError(f"query has shape {query.shape}, expected ({n},) to match the {n} "
                         "rows of X")
    if query.dtype.kind == "f":
        check_finite("query", query)
    elif query.dtype.kind not in "biuUS":
        raise ValueError(f"query has dtype {query.dtype}; expected integers or strings")
    return X, y, query


def _check_X_predict(X, n_features):
    X = _as_dense(X)
    if X.shape[1] != n_features:
        raise ValueError(f"X has {X.shape[1]} features, the model was trained with "
                         f"{n_features}")
    return X


def _pair_layout(y, query):
    """Rows that take part in a pair, grouped by query, with dense levels.

    Returns ``(rows, qptr, level, n_pairs, n_queries)``: ``rows`` index the input (query by
    query, increasing label within a query), ``qptr`` the query boundaries in ``rows``,
    ``level`` the dense label rank within the query, ``n_pairs`` = |P| and ``n_queries`` the
    number of distinct queries in the input.
    """
    _, qinv = np.unique(query, return_inverse=True)
    qinv = qinv.ravel()
    o = np.lexsort((y, qinv))
    qs, ys = qinv[o], y[o]
    n = o.size
    new_q = np.ones(n, dtype=bool)
    new_q[1:] = qs[1:] != qs[:-1]
    new_l = new_q.copy()
    new_l[1:] |= ys[1:] != ys[:-1]
    c = np.cumsum(new_l) - 1
    starts = np.flatnonzero(new_q)
    group = np.cumsum(new_q) - 1
    level = c - c[starts][group]
    n_levels = np.maximum.reduceat(level, starts) + 1
    keep = n_levels[group] >= 2
    rows = o[keep]
    kept_q = np.flatnonzero(n_levels >= 2)
    sizes = np.diff(np.append(starts, n))[kept_q]
    qptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    level = level[keep].astype(np.int64)
    n_pairs = int(_k.pair_counts_total(qptr, level).sum()) if rows.size else 0
    return rows, qptr, level, n_pairs, int(starts.size)
