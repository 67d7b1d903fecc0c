"""AltSVM: collaborative ranking from pairwise comparisons (Park et al., ICML 2015).

Fits X = U Vᵀ (+ 1 bᵀ with ``item_bias=True``) to comparisons "user i prefers item j over
item k" by minimizing eq. (3),

    P(U, V, b) = Σ_(i,j,k) L(u_iᵀ(v_j − v_k) + b_j − b_k) + reg/2 (‖U‖² + ‖V‖² + ‖b‖²),

alternating a V-step (a linear SVM in (V, b), eq. 6) and a U-step (a rankSVM per user, eq. 5)
by stochastic dual coordinate descent (Algorithm 1). The driver, its stopping rule and the
dual variables are described in :mod:`solvers._altsvm_solver`, the coordinate steps in
:mod:`solvers._altsvm_kernels`. This module validates, warm-starts, predicts and persists.
"""

from __future__ import annotations

import warnings

import numba
import numpy as np

from solvers import _altsvm_layout as L
from solvers import _altsvm_solver as S
from solvers import _params as P
from solvers._base import (
    CollapseWarning,
    ConvergenceWarning,
    Estimator,
    check_finite,
    check_int,
    check_threads,
    numba_threads,
    rng_of,
)
from solvers.fold_in import pairwise_duals
from solvers.pairs import as_ids
from solvers.topk import user_topk

__all__ = ["AltSVM", "CollapseWarning"]


def _check_comparisons(comparisons, n_users, n_items):
    """Validate (n, 3) user/winner/loser ids; return (ids array, n_users, n_items).

    int32 and int64 arrays are checked in one parallel pass (:func:`_altsvm_layout.check_ids`)
    and used as they are (no copy); other dtypes go through :func:`solvers.pairs.as_ids`
    first. A failed check is redone in numpy to name the first offending row.
    """
    c = np.asarray(comparisons)
    if c.ndim != 2 or c.shape[1] != 3:
        raise ValueError(f"comparisons has shape {c.shape}, expected (n, 3): user, winner, loser")
    if c.shape[0] == 0:
        raise ValueError("comparisons is empty; expected at least one (user, winner, loser) row")
    if c.dtype not in (np.int32, np.int64):
        c = as_ids("comparisons", c, ndim=2)
    spans = max(1, min(numba.get_num_threads(), c.shape[0]))
    low, same, top_user, top_item = L.check_ids(c[:, 0], c[:, 1], c[:, 2], spans)
    if low < 0:
        as_ids("comparisons", c, ndim=2)  # raises, naming the first negative id
    if same >= 0:
        raise ValueError(f"comparisons[{same}] has winner == loser == {c[same, 1]}; "
                         "a comparison needs two different items")
    n_users = _check_bound("n_users", n_users, int(top_user), lambda: c[:, 0],
                           lambda p, v: f"comparisons[{p}, 0] is user {v}")
    n_items = _check_bound("n_items", n_items, int(top_item), lambda: c[:, 1:].ravel(),
                           lambda p, v: f"comparisons[{p // 2}, {1 + p % 2}] is item {v}")
    return c, n_users, n_items


def _check_bound(name, given, top, ids, where):
    """The id-space size: ``given``, checked against the largest id ``top``, or top + 1.
    ``ids()`` (called only when the check fails) gives the ids to locate the first one out of
    range in."""
    if given is None:
        return top + 1
    if int(given) != given or given < 1:
        raise ValueError(f"{name} is {given!r}, expected an integer >= 1 or None")
    given = int(given)
    if top >= given:
        ids = ids()
        p = int(np.flatnonzero(ids >= given)[0])
        raise ValueError(f"{where(p, int(ids[p]))}, but {name}={given}; ids must be < {name}")
    return given


RAY_RETRIES = 2      # fits started again when a Ray worker dies (see AltSVM._solve_on_ray)

class AltSVM(Estimator):
    """Collaborative ranking by alternating SVMs on pairwise comparisons (AltSVM).

    Minimizes Σ L(u_iᵀ(v_j − v_k) + b_j − b_k) + reg/2 (‖U‖² + ‖V‖² + ‖b‖²) over the
    comparisons (user i, winner j, loser k) by alternating stochastic dual coordinate descent
    (Park et al. 2015, Algorithm 1), in parallel with numba.

    Parameters
    ----------
    rank : int, default 10
        Number of latent factors r. ``rank=0`` with ``item_bias=True`` is a global ranking.
    reg : float or None, default None
        L2 regularization λ of U, V and b, given directly. ``None``: λ = ``reg_ratio`` ·
        reg_max of the data (:meth:`reg_max`), which is what carries from one data set to
        another: the right λ grows with the number of comparisons.
    reg_ratio : float, default 0.3
        λ as a fraction of reg_max, the threshold at and above which U = V = 0 is the optimum
        (the model collapses to no model, or to the global ranking with ``item_bias``); used
        when ``reg`` is None. :meth:`fit_path` chooses it on a validation split.
    loss : {"squared_hinge", "hinge", "logistic"}, default "squared_hinge"
        L(z) = max(0, 1 − z)², max(0, 1 − z) or log(1 + e^{−z}).
    item_bias : bool, default False
        Add an item bias b (X = U Vᵀ + 1 bᵀ), so a global ranking is a special case.
    max_iter : int, default 50
        Maximum number of outer iterations (one V-step and one U-step each).
    tol : float, default 3e-4
        Stop when the decrease of the objective in an outer iteration is at most tol times
        its decrease from U = V = 0, b = 0 (P(0) − P); see :mod:`solvers._altsvm_solver`.
    n_threads : int or None, default None
        Threads for the numba kernels; None uses all. Every pass of a fit over the comparisons
        runs on them (checks, sort by user, layout, reg_max, rebuilds, V- and U-steps).
    deterministic : bool, default True
        With an integer ``random_state``, a fit on the same comparisons is bit-for-bit
        reproducible on any ``n_threads``: 1, 2 or 16 threads give the same factors, duals,
        objective and iterations. The V-step is stratified (items in blocks; comparisons
        grouped by the pair of blocks of their items; groups with disjoint blocks run in
        parallel, in a fixed order of rounds: see :func:`solvers._altsvm_kernels.vstep_strata`),
        and every other pass is race-free by construction. ``False`` runs the V-step lock-free
        on every thread (Hogwild, the paper's §4.1): threads update shared item factors in an
        order set by timing, and the non-convex problem amplifies it: two fits on MovieLens
        100K differ by up to 0.19 in an item factor after 10 iterations, and may stop an
        iteration apart (``bench/altsvm_determinism.py``).
    random_state : int, numpy.random.Generator or None
        Seed for the initial U and the coordinate orders.
    verbose : bool, default False
        Print one line per outer iteration and a summary.
    ray_address : str or None, default None
        ``HOST:PORT`` of a Ray cluster: the fit's comparisons, duals and users' factors are
        spread over ``ray_workers`` workers there (:mod:`solvers.altsvm_ray`), and the result
        is the same, bit for bit, as this process's fit (``deterministic`` must be True).
        ``reg=None`` computes reg_max in this process first, on every comparison.
    ray_workers : int or None, default None
        Workers of a Ray fit (one CPU each); None: every CPU of the cluster.

    Attributes
    ----------
    user_factors_ : ndarray, shape (n_users, rank)
    item_factors_ : ndarray, shape (n_items, rank)
    item_bias_ : ndarray, shape (n_items,)
        Zeros when ``item_bias=False``.
    engine_ : str
        Where the fit ran: "this process, N threads" or "Ray at HOST:PORT, N workers".
    worker_peak_rss_ : list of int
        On Ray: each worker's peak resident memory in bytes.
    ray_retried_ : list of str
        On Ray: why the fit started again (a worker that died), one line per retry.
    n_iter_ : int
        Outer iterations run.
    objective_ : ndarray, shape (n_iter_,)
        Primal objective after each outer iteration.
    converged_ : bool
        Whether the stopping rule held before ``max_iter``.
    objective_init_ : float
        Objective at the starting point (after the warm start's primal rebuild).
    n_warm_matched_ : int
        Comparisons whose duals came from the warm start (0 for a cold fit).
    n_extra_v_epochs_, n_v_reverts_ : int
        How often the monotone safeguards of the V-step acted.
    reg_ : float
        The λ the fit used.
    reg_max_ : float
        The data's reg_max (computed when first read if ``reg`` was given).
    collapsed_ : bool
        The fit ended with factors at round-off level (λ ≥ reg_max): the scores are the item
        bias alone (or all zero). Always comes with a :class:`CollapseWarning`.
    past_reg_max_ : bool
        λ ≥ reg_max: collapsed, or (a given ``reg``) small factors on their way to zero, each
        said by a :class:`CollapseWarning`.
    path_ : list of dict
        After :meth:`fit_path`: per point of the path its ratio, reg, score, iterations and
        seconds.

    Examples
    --------
    >>> import numpy as np
    >>> from solvers import AltSVM
    >>> comparisons = np.array([[0, 1, 0], [0, 2, 0], [1, 2, 1], [1, 2, 0], [2, 1, 0]])
    >>> model = AltSVM(rank=2, reg=1.0, n_threads=1, random_state=0).fit(comparisons)
    >>> items, scores = model.recommend(0, k=2)
    >>> items.shape
    (2,)
    """

    algorithm = "AltSVM"
    format_version = 3
    fitted_attribute = "item_factors_"
    warm_keys = ("U", "V", "b", "user", "winner", "loser", "alpha", "beta")

    def __init__(self, *, rank=10, reg=None, reg_ratio=0.3, loss="squared_hinge",
                 item_bias=False, max_iter=50, tol=3e-4, n_threads=None, deterministic=True,
                 random_state=None, verbose=False, ray_address=None, ray_workers=None):
        self.rank = rank
        self.reg = reg
        self.reg_ratio = reg_ratio
        self.loss = loss
        self.item_bias = item_bias
        self.max_iter = max_iter
        self.tol = tol
        self.n_threads = n_threads
        self.deterministic = deterministic
        self.random_state = random_state
        self.verbose = verbose
        self.ray_address = ray_address
        self.ray_workers = ray_workers

    _parameter_constraints = {
        "rank": P.Int(0), "reg": P.Optional(P.Positive()), "reg_ratio": P.Positive(),
        "loss": P.Choice(tuple(S.LOSSES)), "item_bias": P.Bool(), "max_iter": P.Int(1),
        "tol": P.Positive(allow_zero=True), "n_threads": P.Threads(),
        "deterministic": P.Bool(), "random_state": P.Seed(), "verbose": P.Bool(),
        "ray_address": P.Optional(P.Address()), "ray_workers": P.Optional(P.Int(1))}

    def _check_joint_params(self) -> int:
        """A model of rank 0 needs the item bias; returns the thread count to use."""
        if self.rank == 0 and not self.item_bias:
            raise ValueError("rank is 0 and item_bias is False: the model would be empty; "
                             "use rank >= 1 or item_bias=True (a global ranking)")
        if self.ray_address is not None and not self.deterministic:
            raise ValueError(f"ray_address is {self.ray_address!r} and deterministic is False: "
                             "the lock-free V-step runs in one process only; use "
                             "deterministic=True")
        return check_threads(self.n_threads)

    # ---------------------------------------------------------------- fitting

    def fit(self, comparisons, n_users=None, n_items=None, warm_start=None):
        """Fit U, V (and b) to comparisons.

        Parameters
        ----------
        comparisons : array-like of int, shape (n, 3)
            Rows (user, winner, loser), 0-based; winner != loser. Repeated rows are separate
            comparisons.
        n_users, n_items : int or None
            Sizes of the id spaces (default: largest id + 1, or the warm start's sizes if
            larger).
        warm_start : dict or None
            A :meth:`warm_state` of an earlier fit. Its duals are joined onto ``comparisons``
            by (user, winner, loser) (new rows start at 0, vanished rows are dropped), clipped
            into the feasible set of ``loss``; U and V grow with zero rows for new ids; the
            primal is rebuilt from the duals and the fit continues.

        Returns
        -------
        self : AltSVM
        """
        return self._fit(comparisons, n_users, n_items, warm_start, reg_max=None)

    def _fit(self, comparisons, n_users, n_items, warm_start, reg_max):
        """:meth:`fit`, with ``reg_max`` of these comparisons when the caller knows it
        (:meth:`fit_path`), else None."""
        n_threads = self._check_params()
        given = {"n_users": n_users, "n_items": n_items}
        with numba_threads(n_threads):  # every pass below is parallel, on n_threads threads
            c, n_users, n_items = _check_comparisons(comparisons, n_users, n_items)
            state = None if warm_start is None else self._check_warm_state(warm_start)
            if state is not None:
                sizes = {"n_users": state["U"].shape[0], "n_items": state["V"].shape[0]}
                for name, size in sizes.items():
                    if given[name] is not None and given[name] < size:
                        raise ValueError(f"{name}={given[name]}, but warm_start has {size}; "
                                         "ids never shrink across warm starts")
                n_users = max(n_users, sizes["n_users"])
                n_items = max(n_items, sizes["n_items"])
            # internal order: by user, then as given; the model keeps these columns. On Ray
            # the workers lay their users' comparisons out
            lay = S.layout(c, n_users, n_items) if self.ray_address is None else None
            cols = S.by_user(c, n_users, n_items) if lay is None else lay["cols"]
            del c
            self._reg_max, self._sigma_vector = reg_max, None
            if self.reg is None:
                if self._reg_max is None:       # a warm start's bias seeds its bias-only fits
                    bias = known = None             # and its reg_max the secant
                    if state is not None:           # new items start at 0
                        bias = np.zeros(n_items)
                        bias[:len(state["b"])] = state["b"]
                        if "known_reg_max" in state:
                            known = (state["known_reg_max"], state.get("sigma_vector"))
                    threshold = S.Threshold(tuple(cols), n_users, n_items, self.loss, lay=lay)
                    self._reg_max = threshold.reg_max(self.item_bias, bias, known)
                    self._sigma_vector = threshold.v0
                reg = float(self.reg_ratio) * self._reg_max
                if self.reg_ratio >= 1.0:
                    warnings.warn(f"reg_ratio is {self.reg_ratio:g}: λ = {reg:.4g} >= reg_max = "
                                  f"{self._reg_max:.4g}, where U = V = 0 is the optimum; use a "
                                  "reg_ratio below 1 (or fit_path to choose one)",
                                  CollapseWarning, stacklevel=2)
                if reg <= 0:
                    raise ValueError("reg_max of these comparisons is 0 (every user's wins and "
                                     "losses cancel out), so reg_ratio gives λ = 0; give reg")
            else:
                reg = float(self.reg)
            self.reg_ = reg
            rng = rng_of(self.random_state)
            if lay is None:
                res, matched, self.worker_peak_rss_ = self._solve_on_ray(
                    cols, n_users, n_items, state, reg, rng)
            else:
                if state is None:
                    start = S.cold_start(lay, n_users, n_items, int(self.rank), rng)
                else:
                    start = S.warm_start(lay, state, n_users, n_items, int(self.rank),
                                         self.loss, reg, bool(self.item_bias))
                with numba_threads(n_threads, chunksize=S.CHUNK):
                    res = S.solve(lay, start, reg=reg, loss=self.loss,
                                  fit_bias=bool(self.item_bias), max_iter=int(self.max_iter),
                                  tol=float(self.tol), rng=rng, parallel=n_threads > 1,
                                  hogwild=not self.deterministic,
                                  verbose=bool(self.verbose))
                matched = start.n_matched
                self.engine_ = f"this process, {n_threads} thread{'s' * (n_threads > 1)}"
        self.user_factors_, self.item_factors_, self.item_bias_ = res.U, res.V, res.b
        self._comparisons, self._alpha, self._beta = cols, res.alpha, res.beta
        self.objective_, self.objective_init_ = res.objective, res.objective_init
        self.n_iter_, self.converged_ = res.n_iter, res.converged
        self.n_warm_matched_ = matched
        self.n_extra_v_epochs_, self.n_v_reverts_ = res.n_extra_v_epochs, res.n_v_reverts
        if not res.converged:
            self._warn_not_converged(f"last decrease / (P(0) - P) {res.last_ratio:.2e} > "
                                     f"tol={self.tol:g}")
        bound = self._factor_bound()
        self.collapsed_ = self.past_reg_max_ = bound < 1e-7
        model = "the item bias alone (a global ranking)" if self.item_bias else "no model"
        if self.collapsed_:
            warnings.warn(f"AltSVM's factors ended at round-off level: λ = {reg:.4g} is at or "
                          f"above reg_max = {self.reg_max_:.4g}, where U = V = 0 is the "
                          f"optimum, so the scores are {model}. Lower reg (or use "
                          "reg_ratio < 1, or fit_path)", CollapseWarning, stacklevel=2)
        elif self.reg is not None and bound < 0.1 and self._zero_is_optimal(reg, lay):
            # small factors from a given reg: is U = V = 0 the optimum at this λ? (one σ_max;
            # reg_max itself, a secant of several, is not computed for the message: on 8.6M
            # comparisons it was 11 s of a warning)
            self.past_reg_max_ = True
            warnings.warn(f"λ = {reg:.4g} is at or above reg_max (reg_max_ has its value), where "
                          f"U = V = 0 is the optimum: the factors (every |u·v| ≤ {bound:.2g}) "
                          f"are on their way to zero, and the scores to {model}. Lower reg (or "
                          "use reg_ratio < 1, or fit_path)", CollapseWarning, stacklevel=2)
        return self

    def _solve_on_ray(self, cols, n_users, n_items, state, reg, rng):
        """The alternation on the Ray cluster at ``ray_address`` (:mod:`solvers.altsvm_ray`).
        A worker (or its node) that dies makes the fit start again, up to ``RAY_RETRIES``
        times, on the workers the cluster has then, from the same random state: the result
        does not depend on the number of workers, so it is the same bits; ``ray_retried_``
        says why each retry was made."""
        from solvers.altsvm_ray import OnRay, is_worker_failure, solve_on_workers

        runner = OnRay(self.ray_address)
        start_state, self.ray_retried_ = rng.bit_generator.state, []
        for attempt in range(RAY_RETRIES + 1):
            workers = self.ray_workers or runner.cpus()
            if workers < 1:
                raise ValueError(f"the Ray cluster at {self.ray_address} has no CPU for a "
                                 "worker; start worker nodes (infra/ray/start.sh)")
            self.engine_ = f"Ray at {self.ray_address}, {workers} worker{'s' * (workers > 1)}"
            try:
                return solve_on_workers(cols, n_users, n_items, state, rank=int(self.rank),
                                        reg=reg, loss=self.loss, fit_bias=bool(self.item_bias),
                                        max_iter=int(self.max_iter), tol=float(self.tol),
                                        rng=rng, n_workers=workers, runner=runner,
                                        verbose=bool(self.verbose))
            except Exception as err:
                if attempt == RAY_RETRIES or not is_worker_failure(err):
                    raise
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                self.ray_retried_.append(f"{type(err).__name__}: {first}"[:300])
                warnings.warn(f"a Ray worker died ({self.ray_retried_[-1]}); the fit starts "
                              "again on the cluster's workers, from the same random state "
                              "(the same bits)", RuntimeWarning, stacklevel=3)
                rng.bit_generator.state = start_state

    def _factor_bound(self) -> float:
        """max ‖u‖ · max ‖v‖, a bound on every |u_i·v_j| (scores are compared with a margin of
        1; below 1e-7 the factors are at round-off level, the fit collapsed)."""
        if self.rank == 0:
            return np.inf
        U, V = self.user_factors_, self.item_factors_
        return float(np.sqrt((U * U).sum(1).max(initial=0.0) * (V * V).sum(1).max(initial=0.0)))

    # ---------------------------------------------------------------- reg_max and the path

    def reg_max(self, comparisons, n_users=None, n_items=None) -> float:
        """The λ at and above which U = V = 0 is the optimum of these comparisons.

        With G the users x items matrix of loss slopes at U = V = 0 (for each comparison of
        user i, +|L'(z)| at the winner and −|L'(z)| at the loser, z = b_j − b_k), convexity
        gives P(U, V, b) ≥ P(0, 0, b*) − σ_max(G)·‖UVᵀ‖_* + λ/2 (‖U‖² + ‖V‖²) ≥ P(0, 0, b*)
        whenever λ ≥ σ_max(G), since ‖UVᵀ‖_* ≤ (‖U‖² + ‖V‖²)/2 (b* is the bias-only optimum,
        whose gradient in b vanishes). So reg_max = σ_max(G): |L'(0)| times the top singular
        value of the wins − losses matrix without an item bias (the lasso's λ_max, in matrix
        form). With an item bias, b* depends on λ; reg_max is the fixed point
        λ = σ_max(G_{b*(λ)}), found in a few bias-only fits. Cost: a sparse top singular value
        (ARPACK), plus those fits.

        Examples
        --------
        >>> import numpy as np
        >>> c = np.array([[0, 1, 0], [0, 2, 0], [1, 2, 1], [1, 2, 0]])
        >>> AltSVM(loss="hinge").reg_max(c)   # G = [[-2, 1, 1], [-1, -1, 2]]: GGᵀ has eigenvalue 9
        3.0
        """
        n_threads = self._check_params()
        with numba_threads(n_threads):
            c, n_users, n_items = _check_comparisons(comparisons, n_users, n_items)
            return self._threshold(c, n_users, n_items)

    def _zero_is_optimal(self, reg: float, lay: dict | None) -> bool:
        """Whether U = V = 0 is optimal at λ = ``reg`` for the fitted comparisons (``lay``
        their layout, None on Ray): λ >= reg_max."""
        if getattr(self, "_reg_max", None) is not None:
            return reg >= self._reg_max
        with numba_threads(check_threads(self.n_threads)):
            return S.Threshold(tuple(self._comparisons), self.user_factors_.shape[0],
                               self.item_factors_.shape[0], self.loss,
                               lay=lay).zero_is_optimal(reg, self.item_bias, self.item_bias_)

    def _threshold(self, c, n_users, n_items) -> float:
        """reg_max of comparisons ``c`` as :func:`_altsvm_solver.layout` takes them."""
        return S.Threshold(c, n_users, n_items, self.loss).reg_max(self.item_bias)

    @property
    def reg_max_(self) -> float:
        self._check_fitted()
        if getattr(self, "_reg_max", None) is None:
            with numba_threads(check_threads(self.n_threads)):
                self._reg_max = self._threshold(tuple(self._fitted_comparisons()),
                                                self.user_factors_.shape[0],
                                                self.item_factors_.shape[0])
        return self._reg_max

    def fit_path(self, comparisons, n_users=None, n_items=None, *, score, ratios=None,
                 patience=2, warm_start=None, max_seconds=None):
        """Fit along a regularization path and keep the best point (glmnet's λ sequence).

        λ runs down the geometric grid ``ratios`` · reg_max (default 0.8 down to 0.01, 10
        points), each fit warm-started from the previous one's duals and factors (duals are
        loss slopes, so they carry across λ; the factors are rebuilt from them). Each point is
        scored by ``score(model)`` (higher is better, e.g. NDCG on a validation split); the
        path stops after ``patience`` points without improvement. The best point's fit is kept
        in ``self`` (``reg`` is set to its λ), and every point is in ``path_``.

        Parameters
        ----------
        comparisons, n_users, n_items
            As for :meth:`fit`.
        score : callable
            ``score(model) -> float`` of a fitted model.
        ratios : sequence of float, optional
            Fractions of reg_max, decreasing.
        patience : int
            Points without a better score before the path stops.
        warm_start : dict, optional
            A :meth:`warm_state` the first point starts from (e.g. yesterday's model, with
            ``ratios`` around yesterday's choice).
        max_seconds : float, optional
            Stop after the first point that ends this long after the path started (a tuning
            budget); the first point is always fitted.

        Returns
        -------
        self : AltSVM

        Examples
        --------
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> c = np.column_stack([rng.integers(0, 20, 400), rng.integers(0, 30, 400),
        ...                      rng.integers(0, 30, 400)])
        >>> c = c[c[:, 1] != c[:, 2]]
        >>> m = AltSVM(rank=2, n_threads=1, random_state=0)
        >>> m = m.fit_path(c, score=lambda model: -model.objective_[-1] / model.reg_)
        >>> len(m.path_) >= 3, m.reg_ == m.reg
        (True, True)
        """
        import time

        n_threads = self._check_params()
        with numba_threads(n_threads):
            c, n_users, n_items = _check_comparisons(comparisons, n_users, n_items)
            reg_max = self._threshold(c, n_users, n_items)
        ratios = np.geomspace(0.8, 0.01, 10) if ratios is None else np.asarray(ratios, float)
        if reg_max <= 0:
            raise ValueError("reg_max of these comparisons is 0; no path to follow")
        path, best, state, since_best = [], None, warm_start, 0
        began = time.perf_counter()
        for ratio in ratios:
            if path and max_seconds is not None and time.perf_counter() - began >= max_seconds:
                break
            model = type(self)(**{**self.get_params(), "reg": float(ratio * reg_max)})
            started = time.perf_counter()
            with warnings.catch_warnings():   # said once, for the chosen point, below
                warnings.simplefilter("ignore", CollapseWarning)
                warnings.simplefilter("ignore", ConvergenceWarning)
                # reg_max given: the small-factor check of the path's high ratios would
                # otherwise recompute it (an SVD, and bias-only fits) at every point
                model._fit(c, n_users, n_items, state, reg_max)
            value = float(score(model))
            path.append({"ratio": float(ratio), "reg": model.reg_, "score": value,
                         "n_iter": int(model.n_iter_), "converged": model.converged_,
                         "collapsed": model.collapsed_,
                         "seconds": time.perf_counter() - started})
            state = model.warm_state()
            if best is None or value > best[0]:
                best, since_best = (value, model), 0
            else:
                since_best += 1
                if since_best >= patience:
                    break
        chosen = best[1]
        self.__dict__.update({k: v for k, v in vars(chosen).items() if k not in
                              self.get_params()})
        self.reg = chosen.reg
        self._reg_max = reg_max
        self.path_ = path
        if not chosen.converged_:
            self._warn_not_converged(f"at the chosen point of the path, λ = {chosen.reg_:.4g}")
        if chosen.collapsed_:
            warnings.warn(f"the best point of the path has collapsed factors (λ = "
                          f"{chosen.reg_:.4g}, reg_max = {reg_max:.4g}): the validation score "
                          "prefers no factor model; extend ratios below "
                          f"{ratios[-1]:g} or check the score", CollapseWarning, stacklevel=2)
        return self

    # ---------------------------------------------------------------- warm start

    def drop_duals(self) -> "AltSVM":
        """Forget the comparisons and their duals (28 bytes per comparison), keeping the
        factors, λ and what else scores or describes the fit: a model that is only scored and
        published (a retrain's refit on every event). ``warm_state``, ``save`` and an uncached
        ``reg_max_`` then refuse, naming this."""
        self._check_fitted()
        self._comparisons = self._alpha = self._beta = None
        return self

    def _fitted_comparisons(self) -> np.ndarray:
        if self._comparisons is None:
            raise ValueError("this AltSVM's comparisons and duals were dropped (drop_duals); "
                             "fit it again to warm-start from it, save it or get its reg_max_")
        return self._comparisons

    fresh_warm_keys = ("user", "winner", "loser")   # astype() copies

    def _warm_arrays(self, widen: bool = True) -> dict:
        """``U``, ``V``, ``b``, the comparison keys ``user``/``winner``/``loser`` (int64, or
        as held unless ``widen``) and their duals ``alpha`` (U-step, eq. 7) and ``beta``
        (V-step, eq. 9)."""
        c = self._fitted_comparisons()  # (3, n), int32 while the ids fit
        keys = [k.astype(np.int64) if widen else k for k in c]
        return {"U": self.user_factors_, "V": self.item_factors_, "b": self.item_bias_,
                "user": keys[0], "winner": keys[1], "loser": keys[2], "alpha": self._alpha,
                "beta": self._beta, **self.known_reg_max()}

    def known_reg_max(self) -> dict:
        """reg_max of these comparisons and ARPACK's last singular vector, when the fit
        computed them (kept by :meth:`drop_duals`): a warm start's reg_max secant starts there
        (comparisons grow little between retrains, and reg_max with them)."""
        reg_max, vector = getattr(self, "_reg_max", None), getattr(self, "_sigma_vector", None)
        if reg_max is None:
            return {}
        return {"known_reg_max": np.array(float(reg_max)),
                **({} if vector is None else {"sigma_vector": vector})}

    def warm_view(self) -> dict:
        """:meth:`warm_state` without a copy, for a fit in this process that only reads it (a
        retrain's refit on every event, from its evaluated fit): the model's own arrays, the
        comparison keys in the dtype it holds. On 7M comparisons that is 280 MB less at the
        refit's peak. Neither change them nor keep them past this model's next fit."""
        self._check_fitted()
        return {**self._warm_arrays(widen=False), "algorithm": np.array(self.algorithm)}

    def _check_warm_state(self, state) -> dict:
        s = super()._check_warm_state(state)
        for k in ("U", "V", "b", "alpha", "beta"):
            s[k] = s[k].astype(np.float64, copy=False)
            check_finite(f"warm_start[{k!r}]", s[k])
        for k in ("user", "winner", "loser"):
            s[k] = as_ids(f"warm_start[{k!r}]", s[k])
        if s["U"].ndim != 2 or s["V"].ndim != 2:
            raise ValueError(f"warm_start U and V have shapes {s['U'].shape} and "
                             f"{s['V'].shape}, expected 2-D arrays")
        for k in ("U", "V"):
            if s[k].shape[1] != self.rank:
                raise ValueError(f"warm_start[{k!r}] has rank {s[k].shape[1]}, this model has "
                                 f"rank={self.rank}")
        if s["b"].shape != (s["V"].shape[0],):
            raise ValueError(f"warm_start['b'] has shape {s['b'].shape}, expected "
                             f"({s['V'].shape[0]},) to match V")
        m = s["user"].shape[0]
        for k in ("winner", "loser", "alpha", "beta"):
            if s[k].shape != (m,):
                raise ValueError(f"warm_start[{k!r}] has shape {s[k].shape}, expected ({m},) "
                                 "like warm_start['user']")
        if "known_reg_max" in state:      # optional: where reg_max's secant starts
            known = np.asarray(state["known_reg_max"], np.float64)
            check_finite("warm_start['known_reg_max']", known)
            if known.shape != ():
                raise ValueError(f"warm_start['known_reg_max'] has shape {known.shape}, "
                                 "expected a scalar")
            s["known_reg_max"] = float(known)
            if "sigma_vector" in state:
                s["sigma_vector"] = np.asarray(state["sigma_vector"], np.float64).ravel()
                check_finite("warm_start['sigma_vector']", s["sigma_vector"])
        return s

    # ---------------------------------------------------------------- using the model

    def _check_users(self, users):
        scalar = np.ndim(users) == 0
        users = as_ids("users", np.atleast_1d(users))
        n_users = self.user_factors_.shape[0]
        if users.size and users.max() >= n_users:
            p = int(np.flatnonzero(users >= n_users)[0])
            raise ValueError(f"users[{p}] is {users[p]}, but the model has {n_users} users")
        return users, scalar

    def predict(self, users, items):
        """Scores X[users, items] = u·v + b, elementwise over equal-length id arrays."""
        self._check_fitted()
        users, _ = self._check_users(users)
        items = as_ids("items", np.atleast_1d(items))
        n_items = self.item_factors_.shape[0]
        if users.shape != items.shape:
            raise ValueError(f"users and items have shapes {users.shape} and {items.shape}; "
                             "expected equal shapes")
        if items.size and items.max() >= n_items:
            p = int(np.flatnonzero(items >= n_items)[0])
            raise ValueError(f"items[{p}] is {items[p]}, but the model has {n_items} items")
        U, V = self.user_factors_, self.item_factors_
        return np.einsum("ij,ij->i", U[users], V[items]) + self.item_bias_[items]

    def recommend(self, users, k=10, exclude=None):
        """Top-k items for one user or a batch, best first.

        The lists are exactly those the publisher stores (:func:`solvers.topk.user_topk_blocks`:
        float32 scores, equal scores by lower item index).

        Parameters
        ----------
        users : int or array-like of int
            User ids.
        k : int
            Number of items per user.
        exclude : scipy.sparse matrix, sequence of id arrays, or None
            Items never to return, e.g. those already seen. A sparse matrix is indexed by user
            id (row i = items of user i); a sequence gives one id array per entry of ``users``.

        Returns
        -------
        items : ndarray of int64, shape (k,) or (len(users), k)
        scores : ndarray of float64, same shape
            When fewer than k items remain after exclusion the tail is item -1, score -inf.

        Examples
        --------
        >>> import numpy as np
        >>> from solvers import AltSVM
        >>> c = np.array([[0, 1, 0], [0, 2, 1], [1, 2, 0], [1, 3, 2]])
        >>> m = AltSVM(rank=2, reg=1.0, n_threads=1, random_state=0).fit(c)
        >>> items, scores = m.recommend([0, 1], k=2, exclude=[[1, 2], [3]])
        >>> items.shape, bool(np.isin(items[0], [1, 2]).any())
        ((2, 2), False)
        """
        self._check_fitted()
        users, scalar = self._check_users(users)
        k = check_int("k", k, minimum=1)
        indptr, indices = self._exclusions(users, exclude)
        bias = self.item_bias_ if self.item_bias else None
        out_items, out_scores = user_topk(self.user_factors_[users], self.item_factors_, k,
                                          item_bias=bias, seen_indptr=indptr,
                                          seen_indices=indices,
                                          workers=check_threads(self.n_threads))
        if scalar:
            return out_items[0], out_scores[0]
        return out_items, out_scores

    def _exclusions(self, users, exclude) -> tuple:
        """CSR (indptr, indices) of the items to exclude for each entry of ``users``."""
        n_items = self.item_factors_.shape[0]
        if exclude is None:
            return None, None
        if hasattr(exclude, "tocsr"):
            exclude = exclude.tocsr()
            if exclude.shape[1] != n_items or exclude.shape[0] <= (users.max() if users.size
                                                                   else -1):
                raise ValueError(f"exclude has shape {exclude.shape}; expected (n_users, "
                                 f"{n_items}) with a row for every requested user")
            sub = exclude[users]
            return sub.indptr, sub.indices
        if len(exclude) != users.shape[0]:
            raise ValueError(f"exclude has {len(exclude)} entries, users has {users.shape[0]}; "
                             "expected one id list per user")
        lists = [np.asarray(ids, dtype=np.int64).ravel() for ids in exclude]
        for row, ids in enumerate(lists):
            if ids.size and (ids.min() < 0 or ids.max() >= n_items):
                bad = ids[(ids < 0) | (ids >= n_items)][0]
                raise ValueError(f"exclude[{row}] contains item {bad}, expected ids in "
                                 f"[0, {n_items})")
        indptr = np.r_[0, np.cumsum([ids.size for ids in lists])]
        return indptr, np.concatenate(lists) if lists else np.zeros(0, np.int64)

    def fold_in(self, comparisons, *, max_epochs=1000, gap_tol=1e-9):
        """Factor of a new user from their comparisons, with V and b fixed (problem 5).

        Solved by dual coordinate descent until the duality gap is below
        ``gap_tol * max(1, objective)``. Score items with ``item_factors_ @ u + item_bias_``.

        Parameters
        ----------
        comparisons : array-like of int, shape (n, 2) or (n, 3)
            (winner, loser) rows, or (user, winner, loser) rows of one user.

        Returns
        -------
        u : ndarray, shape (rank,)

        Examples
        --------
        >>> import numpy as np
        >>> from solvers import AltSVM
        >>> c = np.array([[0, 1, 0], [0, 2, 1], [1, 2, 0], [1, 3, 2]])
        >>> m = AltSVM(rank=2, reg=1.0, n_threads=1, random_state=0).fit(c)
        >>> m.fold_in([[2, 0], [3, 1]]).shape
        (2,)
        """
        self._check_fitted()
        c = np.asarray(comparisons)
        if c.ndim != 2 or c.shape[1] not in (2, 3) or c.shape[0] == 0:
            raise ValueError(f"comparisons has shape {c.shape}, expected (n, 2) winner/loser "
                             "or (n, 3) user/winner/loser rows, n >= 1")
        if c.shape[1] == 3:
            c = as_ids("comparisons", c, ndim=2)
            if (c[:, 0] != c[0, 0]).any():
                p = int(np.flatnonzero(c[:, 0] != c[0, 0])[0])
                raise ValueError(f"comparisons[{p}, 0] is user {c[p, 0]}, but comparisons[0, 0] "
                                 f"is user {c[0, 0]}; fold_in takes one user")
            c = c[:, 1:]
        c = np.column_stack([np.zeros(len(c), dtype=np.int64), c])
        c, _, _ = _check_comparisons(c, 1, self.item_factors_.shape[0])
        reg = getattr(self, "reg_", None) or self.reg
        return pairwise_duals(self.item_factors_, self.item_bias_, c[:, 1:], reg=float(reg),
                              loss=self.loss, max_epochs=max_epochs, gap_tol=gap_tol)[0]

    # ---------------------------------------------------------------- persistence

    def _state_arrays(self) -> dict:
        return {**self._warm_arrays(), "objective": self.objective_,
                "n_iter": np.array(self.n_iter_), "converged": np.array(self.converged_),
                "reg": np.array(self.reg_), "collapsed": np.array(self.collapsed_)}

    def _from_state(self, arrays: dict) -> None:
        self.user_factors_, self.item_factors_ = arrays["U"], arrays["V"]
        self.item_bias_ = arrays["b"]
        self._comparisons = np.stack([arrays["user"], arrays["winner"], arrays["loser"]]).astype(
            S.id_dtype(arrays["U"].shape[0], arrays["V"].shape[0]))
        self._alpha, self._beta = arrays["alpha"], arrays["beta"]
        self.objective_ = arrays["objective"]
        self.n_iter_, self.converged_ = int(arrays["n_iter"]), bool(arrays["converged"])
        self.reg_, self.collapsed_ = float(arrays["reg"]), bool(arrays["collapsed"])
        self.past_reg_max_ = self.collapsed_
        # a model saved before reg_max was kept with it computes it when asked
        self._reg_max = float(arrays["known_reg_max"]) if "known_reg_max" in arrays else None
        self._sigma_vector = arrays.get("sigma_vector")

    # ---------------------------------------------------------------- warm-up

    @classmethod
    def warm_up(cls, n_threads=None) -> float:
        """Compile, or load from numba's disk cache, every AltSVM kernel (serial and parallel,
        the warm start's dual join, fold-in, top-K and reg_max; the comparison samplers are
        :func:`solvers.pairs.warm_up`'s); returns the seconds. Call it at service start so the
        first real fit does not pay the compile.

        Examples
        --------
        >>> seconds = AltSVM.warm_up(n_threads=1)
        """
        import time

        t0 = time.perf_counter()
        rng = np.random.default_rng(0)
        c = np.column_stack([rng.integers(0, 5, 200), rng.integers(0, 8, 200),
                             rng.integers(0, 8, 200)])
        c = c[c[:, 1] != c[:, 2]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            for t in sorted({1, check_threads(n_threads)}):
                m = cls(rank=2, reg=1.0, n_threads=t, random_state=0, max_iter=2).fit(c[:-20])
                for _ in range(2):  # changed comparisons (the hash join), then unchanged
                    m = cls(rank=2, reg=1.0, n_threads=t, random_state=0, max_iter=2).fit(
                        c, warm_start=m.warm_state())
            m.fold_in(c[:5, 1:], max_epochs=10)
            m.recommend([0, 1], k=3)
            _ = m.reg_max_  # the layout kernels on the model's own int32 columns
            for loss in ("squared_hinge", "logistic"):  # the bias-only fit of reg_max
                cls(item_bias=True, loss=loss, n_threads=t).reg_max(c)
        return time.perf_counter() - t0
