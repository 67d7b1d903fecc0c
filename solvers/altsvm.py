"""AltSVM: collaborative ranking from pairwise comparisons (Park et al., ICML 2015).

Fits X = U Vᵀ (+ 1 bᵀ with ``item_bias=True``) to comparisons "user i prefers item j over
item k" by minimizing eq. (3),

    P(U, V, b) = Σ_(i,j,k) L(u_iᵀ(v_j − v_k) + b_j − b_k) + reg/2 (‖U‖² + ‖V‖² + ‖b‖²),

alternating a V-step (a linear SVM in (V, b) with U fixed, eq. 6) and a U-step (one small
rankSVM per user with V fixed, eq. 5), each by stochastic dual coordinate descent (Algorithm 1).
The math and the exact coordinate steps are written above each kernel in
:mod:`solvers._altsvm_kernels`.

Dual variables. Each comparison has one dual for the V-step (``beta``, eq. 9) and one for the
U-step (``alpha``, eq. 7), kept across outer iterations (§4.2) and across fits (warm start).
They are scaled as loss slopes (a = −L'(z) at the optimum), so they do not depend on ``reg``:
w = (1/reg) Σ a x. Before each half-step the primal is rebuilt exactly from its duals with the
current other factor (Algorithm 1 lines 3 and 13), then one epoch of random-order coordinate
steps runs. Rebuilds and objective values go through the distinct (user, item) pairs of the
comparisons (z = x_ij − x_ik with x_ij = u_iᵀv_j + b_j), so they cost O(|E| r + |Ω|), not
O(|Ω| r); on rating data |E| is the number of ratings.

Monotone objective. A rebuilt primal can be worse than the point the previous half-step left
(the duals were fitted against the old other factor), most of all at small ``reg``. So:
P(U_old, V_new) is computed in the same pass that rebuilds U; while it exceeds the previous
objective, up to 2 more V epochs run, and if it still does, V and b go back to their previous
values (beta keeps its progress and starts the next V-step). Per user, the U-step likewise
runs up to 50 more epochs while the user's share of the objective is above its value at the
old u_i, and else keeps the old u_i. On MovieLens at the paper's settings none of this fires;
it makes ``objective_`` non-increasing by construction. An outer iteration whose V-step was
reverted never counts as converged. (With the hinge loss at small ``reg`` the V-step revert
is frequent: its dual iterates give rough primal points.)

Parallel schedule (``n_threads`` > 1). The U-step, fused with the rebuild of U and the
objective, runs over users in parallel (``prange``, users dealt dynamically in chunks of 4),
race-free and with per-user random streams, so it gives the same numbers for any thread
count; the rebuild of V is serial (it is O(|E| r)). V-step: lock-free (Hogwild) as in §4.1:
the comparisons (grouped by user) are cut into blocks of 256; every epoch visits the blocks in
a fresh random order, each block sequentially (memory is read in order; a random permutation
of all comparisons gave the same iterations and NDCG but cost more time), the blocks dealt to
the threads dynamically, which update the 2r + 2 numbers of v_j, v_k, b_j, b_k of each step
without locks. A race-free schedule was built and measured too (items in 16 blocks, the
comparisons between two blocks one task, the 15 rounds of a round-robin tournament running
disjoint tasks in parallel: no shared writes, bit-identical results for any thread count,
same NDCG). On this shared 2-core machine it was at best 15% faster than Hogwild and under
load about 2x slower (15 barriers per epoch wait for descheduled threads), so Hogwild is
used. With ``n_threads=1`` every kernel is the serial
one and a fit is bit-for-bit reproducible for a given ``random_state``. All kernels are cached
on disk (``cache=True``, parallel ones included); see :func:`warm_up`. On a machine whose
cores are busy with other work, ``OMP_WAIT_POLICY=PASSIVE`` stops idle OpenMP threads from
spinning (numba's default threading layer here is OpenMP).

Stopping rule: the decrease of the primal objective in a full outer iteration, measured
against the whole decrease from the point w = 0 (U = V = 0, b = 0, where P(0) = n L(0)):

    f_{t−1} − f_t  <=  tol · (P(0) − f_t),

f_0 being the objective at the starting point (random U, V = 0; or, for a warm start, after
its first U-step). The reference P(0) is the same for a cold and a warm fit, so a good warm
start neither stops the solver before it has taken in the new comparisons nor keeps it
running: it stops as soon as an iteration makes as little progress, relative to the distance
travelled from 0, as a cold fit's last one. (The rule of the authors' code, (f_{t−1} − f_t) /
f_{t−1} < tol, depends on how small f can get: with 5M MovieLens comparisons at tol = 1e-5 it
needs ~80 iterations, NDCG@10 being flat from ~30.) While f_t >= P(0) (a cold start begins at
P(0) + reg/2 ‖U_random‖²) the rule does not hold, except that a decrease below round-off
(1e-12 P(0)) stops the fit. A warm start begins with one U-step against the stored V (it
brings the new comparisons' alpha in before the first V-step; without it the warm fit takes
as many iterations and ends slightly higher). Default
``tol = 3e-4``: on MovieLens 100K all-pairs (5M comparisons, rank 10, reg 1000) a cold fit
stops after ~30 iterations with the NDCG@10 of 50-80 iterations (tol 1e-3: 15 iterations,
NDCG@10 about 0.003 lower); on the paper's N = 50 split (427k comparisons) after 8, like the
authors' code. Much smaller tol (1e-5 on the small planted problems of the tests) puts the
threshold at the noise level of the per-iteration decrease (random coordinate orders): a fit
may then stop on a dip, and a continuation from it run a few iterations more.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from solvers import _altsvm_kernels as K
from solvers._base import (
    ConvergenceWarning,
    ParamsMixin,
    check_choice,
    check_finite,
    check_positive,
    load_npz,
    save_npz,
)
from solvers.pairs import as_ids, pairs_from_ratings

__all__ = ["AltSVM", "warm_up"]

_LOSSES = {"squared_hinge": K.SQUARED_HINGE, "hinge": K.HINGE, "logistic": K.LOGISTIC}
_MAX_EXTRA_V_EPOCHS = 2  # see "Monotone objective" above
_MAX_EXTRA_U_EPOCHS = 50
_STATE_KEYS = ("U", "V", "b", "user", "winner", "loser", "alpha", "beta")
_RECOMMEND_CHUNK = 2048
_BLOCK = 256  # comparisons per block of the V-step's block-shuffled order
_CHUNK = 4  # blocks (V-step) or users (U-step) a thread takes at a time


def _num_threads_available() -> int:
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


def _check_comparisons(comparisons, n_users, n_items):
    """Validate (n, 3) user/winner/loser ids; return (int64 array, n_users, n_items)."""
    c = np.asarray(comparisons)
    if c.ndim != 2 or c.shape[1] != 3:
        raise ValueError(f"comparisons has shape {c.shape}, expected (n, 3): user, winner, loser")
    if c.shape[0] == 0:
        raise ValueError("comparisons is empty; expected at least one (user, winner, loser) row")
    c = as_ids("comparisons", c, ndim=2)
    same = c[:, 1] == c[:, 2]
    if same.any():
        p = int(np.flatnonzero(same)[0])
        raise ValueError(f"comparisons[{p}] has winner == loser == {c[p, 1]}; "
                         "a comparison needs two different items")
    n_users = _check_bound("n_users", n_users, c[:, 0], "comparisons[{}, 0] is user {}")
    items = np.concatenate([c[:, 1], c[:, 2]])
    n_items = _check_bound("n_items", n_items, items, None, columns=c)
    return c, n_users, n_items


def _check_bound(name, given, ids, template, columns=None):
    top = int(ids.max()) + 1
    if given is None:
        return top
    if int(given) != given or given < 1:
        raise ValueError(f"{name} is {given!r}, expected an integer >= 1 or None")
    given = int(given)
    if top > given:
        if columns is None:
            p = int(np.flatnonzero(ids >= given)[0])
            where = template.format(p, int(ids[p]))
        else:
            bad = columns[:, 1:] >= given
            p, col = (int(x) for x in np.argwhere(bad)[0])
            where = f"comparisons[{p}, {col + 1}] is item {int(columns[p, col + 1])}"
        raise ValueError(f"{where}, but {name}={given}; ids must be < {name}")
    return given


def _layout(c, n_users, n_items) -> dict:
    """Index arrays for the kernels, from comparisons sorted by user.

    Entries are the distinct (user, item) pairs of the comparisons, sorted by user; see
    :mod:`solvers._altsvm_kernels`.
    """
    cu = np.ascontiguousarray(c[:, 0], dtype=np.int32)
    cw = np.ascontiguousarray(c[:, 1], dtype=np.int32)
    cl = np.ascontiguousarray(c[:, 2], dtype=np.int32)
    user_ptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(cu, minlength=n_users), out=user_ptr[1:])
    pos_w, pos_l, entry_user, entry_item, entry_ptr = K.build_entries(user_ptr, cw, cl, n_items)
    item_entry_ptr = np.zeros(n_items + 1, dtype=np.int64)
    np.cumsum(np.bincount(entry_item, minlength=n_items), out=item_entry_ptr[1:])
    return {"cu": cu, "cw": cw, "cl": cl, "user_ptr": user_ptr, "pos_w": pos_w, "pos_l": pos_l,
            "entry_user": entry_user, "entry_item": entry_item, "entry_ptr": entry_ptr,
            "item_entry_ptr": item_entry_ptr,
            "item_entries": np.argsort(entry_item, kind="stable").astype(np.int64),
            "n_entries": entry_item.shape[0]}


def _by_user(c):
    """Rows of ``c`` stably sorted by user (no copy when they already are)."""
    u = c[:, 0]
    if (u[1:] >= u[:-1]).all():
        return c
    return c[np.argsort(u, kind="stable")]


def _join_duals(old_user, old_winner, old_loser, old_duals, lay):
    """Carry two dual vectors keyed by (user, winner, loser) onto the comparisons of layout
    ``lay`` (:func:`solvers._altsvm_kernels.join_duals`). Returns ([alpha, beta], matched)."""
    old_duals = [np.ascontiguousarray(d, dtype=np.float64) for d in old_duals]
    if (old_user[1:] < old_user[:-1]).any():  # warm_state() keeps them sorted by user
        order = np.argsort(old_user, kind="stable")
        old_user, old_winner, old_loser = old_user[order], old_winner[order], old_loser[order]
        old_duals = [d[order] for d in old_duals]
    n_users = lay["user_ptr"].shape[0] - 1
    old_ptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(old_user[old_user < n_users], minlength=n_users), out=old_ptr[1:])
    n = lay["cw"].shape[0]
    out_a, out_b = np.empty(n), np.empty(n)
    matched = K.join_duals(old_ptr, np.ascontiguousarray(old_winner, dtype=np.int64),
                           np.ascontiguousarray(old_loser, dtype=np.int64),
                           old_duals[0], old_duals[1], lay["user_ptr"], lay["pos_w"],
                           lay["pos_l"], lay["entry_ptr"], lay["entry_item"], out_a, out_b)
    return [out_a, out_b], int(matched)


def _map_duals(old_triples, old_duals, new_triples):
    """:func:`_join_duals` for comparisons in any order: returns the two dual vectors in the
    order of ``new_triples``. A triple that occurs m times in both sets maps its occurrences
    in order; new triples get 0; vanished ones are dropped."""
    old_triples = np.asarray(old_triples, dtype=np.int64)
    new_triples = np.asarray(new_triples, dtype=np.int64)
    order = np.argsort(new_triples[:, 0], kind="stable")
    n_users = int(max(old_triples[:, 0].max(initial=-1), new_triples[:, 0].max(initial=-1))) + 1
    n_items = int(max(old_triples[:, 1:].max(initial=-1), new_triples[:, 1:].max(initial=-1))) + 1
    lay = _layout(new_triples[order], n_users, n_items)
    (a, b), matched = _join_duals(old_triples[:, 0], old_triples[:, 1], old_triples[:, 2],
                                  old_duals, lay)
    out_a, out_b = np.empty_like(a), np.empty_like(b)
    out_a[order] = a
    out_b[order] = b
    return [out_a, out_b], matched


class AltSVM(ParamsMixin):
    """Collaborative ranking by alternating SVMs on pairwise comparisons (AltSVM).

    Minimizes Σ L(u_iᵀ(v_j − v_k) + b_j − b_k) + reg/2 (‖U‖² + ‖V‖² + ‖b‖²) over the
    comparisons (user i, winner j, loser k) by alternating stochastic dual coordinate descent
    (Park et al. 2015, Algorithm 1), in parallel with numba.

    Parameters
    ----------
    rank : int, default 10
        Number of latent factors r. ``rank=0`` with ``item_bias=True`` is a global ranking.
    reg : float, default 1000.0
        L2 regularization λ of U, V and b.
    loss : {"squared_hinge", "hinge", "logistic"}, default "squared_hinge"
        L(z) = max(0, 1 − z)², max(0, 1 − z) or log(1 + e^{−z}).
    item_bias : bool, default False
        Add an item bias b (X = U Vᵀ + 1 bᵀ), so a global ranking is a special case.
    max_iter : int, default 50
        Maximum number of outer iterations (one V-step and one U-step each).
    tol : float, default 3e-4
        Stop when the decrease of the objective in an outer iteration is at most tol times
        its decrease from U = V = 0, b = 0 (P(0) − P); see the module docstring.
    n_threads : int or None, default None
        Threads for the numba kernels; None uses all. ``n_threads=1`` with an integer
        ``random_state`` gives bit-for-bit reproducible fits.
    random_state : int, numpy.random.Generator or None
        Seed for the initial U and the coordinate orders.
    verbose : bool, default False
        Print one line per outer iteration and a summary.

    Attributes
    ----------
    user_factors_ : ndarray, shape (n_users, rank)
    item_factors_ : ndarray, shape (n_items, rank)
    item_bias_ : ndarray, shape (n_items,)
        Zeros when ``item_bias=False``.
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
        How often the monotone safeguards of the V-step acted (module docstring).

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

    def __init__(self, *, rank=10, reg=1000.0, loss="squared_hinge", item_bias=False,
                 max_iter=50, tol=3e-4, n_threads=None, random_state=None, verbose=False):
        self.rank = rank
        self.reg = reg
        self.loss = loss
        self.item_bias = item_bias
        self.max_iter = max_iter
        self.tol = tol
        self.n_threads = n_threads
        self.random_state = random_state
        self.verbose = verbose

    # ---------------------------------------------------------------- parameters

    def _validate_params(self) -> int:
        if not isinstance(self.rank, (int, np.integer)) or isinstance(self.rank, bool) \
                or self.rank < 0:
            raise ValueError(f"rank is {self.rank!r}, expected an integer >= 0")
        if self.rank == 0 and not self.item_bias:
            raise ValueError("rank is 0 and item_bias is False: the model would be empty; "
                             "use rank >= 1 or item_bias=True (a global ranking)")
        check_positive("reg", self.reg)
        check_choice("loss", self.loss, _LOSSES)
        if not isinstance(self.item_bias, (bool, np.bool_)):
            raise ValueError(f"item_bias is {self.item_bias!r}, expected True or False")
        if not isinstance(self.max_iter, (int, np.integer)) or self.max_iter < 1:
            raise ValueError(f"max_iter is {self.max_iter!r}, expected an integer >= 1")
        check_positive("tol", self.tol, allow_zero=True)
        available = _num_threads_available()
        if self.n_threads is None:
            return available
        if not isinstance(self.n_threads, (int, np.integer)) or self.n_threads < 1:
            raise ValueError(f"n_threads is {self.n_threads!r}, expected an integer >= 1 or None")
        if self.n_threads > available:
            raise ValueError(f"n_threads is {self.n_threads}, but numba has {available} threads "
                             "(NUMBA_NUM_THREADS)")
        return int(self.n_threads)

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
        n_threads = self._validate_params()
        given = {"n_users": n_users, "n_items": n_items}
        c, n_users, n_items = _check_comparisons(comparisons, n_users, n_items)
        state = None if warm_start is None else self._check_warm_state(warm_start)
        if state is not None:
            sizes = {"n_users": state["U"].shape[0], "n_items": state["V"].shape[0]}
            for name, size in sizes.items():
                if given[name] is not None and given[name] < size:
                    raise ValueError(f"{name}={given[name]}, but warm_start has {size}; ids "
                                     "never shrink across warm starts")
            n_users = max(n_users, sizes["n_users"])
            n_items = max(n_items, sizes["n_items"])
        loss = _LOSSES[self.loss]
        reg = float(self.reg)
        r = int(self.rank)
        fit_bias = bool(self.item_bias)
        rng = np.random.default_rng(self.random_state)

        c = _by_user(c)  # internal order: by user, then as given
        if np.shares_memory(c, np.asarray(comparisons)):
            c = c.copy()  # the model keeps its comparisons; never alias the caller's array
        lay = _layout(c, n_users, n_items)
        n = c.shape[0]

        U = np.zeros((n_users, r))
        V = np.zeros((n_items, r))
        b = np.zeros(n_items)
        self.n_warm_matched_ = 0
        if state is None:
            alpha = np.zeros(n)
            beta = np.zeros(n)
            U[:] = rng.random((n_users, r)) / np.sqrt(max(r, 1))
        else:
            (alpha, beta), self.n_warm_matched_ = _join_duals(
                state["user"], state["winner"], state["loser"], (state["alpha"], state["beta"]),
                lay)
            hi = np.inf if loss == K.SQUARED_HINGE else 1.0
            np.clip(alpha, 0.0, hi, out=alpha)
            np.clip(beta, 0.0, hi, out=beta)
            V[: state["V"].shape[0]] = state["V"]
            if fit_bias:
                b[: state["b"].shape[0]] = state["b"]
            # u_i = (1/reg) Σ alpha_c (v_j − v_k) with the stored V, exactly (LIBLINEAR's setup
            # loop); users without duals (new ones) start at 0
            K.users_from_duals(lay["user_ptr"], lay["pos_w"], lay["pos_l"], lay["entry_ptr"],
                               lay["entry_item"], alpha, V, reg, np.empty(lay["n_entries"]), U)

        prev = None
        if n_threads > 1:
            import numba

            prev = numba.get_num_threads(), numba.get_parallel_chunksize()
            numba.set_num_threads(n_threads)
            # deal blocks / users to threads dynamically: a thread the OS preempts (shared
            # machines) does not hold back a fixed half of the work
            numba.set_parallel_chunksize(_CHUNK)
        try:
            U, beta = self._run(rng, n_threads, lay, alpha, beta, U, V, b, reg, loss, fit_bias,
                                state is not None)
        finally:
            if prev is not None:
                numba.set_num_threads(prev[0])
                numba.set_parallel_chunksize(prev[1])

        self.user_factors_ = U
        self.item_factors_ = V
        self.item_bias_ = b
        self._comparisons = c
        self._alpha = alpha
        self._beta = beta
        return self

    def _run(self, rng, n_threads, lay, alpha, beta, U, V, b, reg, loss, fit_bias, warm):
        """Algorithm 1 with the monotone safeguards described in the module docstring.

        Updates ``alpha``, ``V`` and ``b`` in place; returns U and the V-step duals (in the
        internal, user-sorted order).
        """
        n = lay["cu"].shape[0]
        n_users, r = U.shape
        parallel = n_threads > 1
        ustep = K.ustep_parallel if parallel else K.ustep_serial
        vstep = K.vstep_hogwild if parallel else K.vstep_serial
        user_ptr, cw, cl = lay["user_ptr"], lay["cw"], lay["cl"]
        pos_w, pos_l = lay["pos_w"], lay["pos_l"]
        entry_ptr, entry_item = lay["entry_ptr"], lay["entry_item"]

        # V-step: the comparisons (in user order) cut into blocks of _BLOCK, visited in a fresh
        # random block order every epoch, each block sequentially (see the kernels)
        vu = lay["cu"]
        block_start = np.r_[np.arange(0, n, _BLOCK), n].astype(np.int64)
        blocks = np.arange(block_start.shape[0] - 1, dtype=np.int64)

        B = np.empty(lay["n_entries"])
        A = np.empty(lay["n_entries"])
        x = np.empty(lay["n_entries"])
        shares = np.empty((n_users, 2))
        U_old = U.copy()

        def penalty_vb():
            return 0.5 * reg * K.sum_squares(V, b)

        def u_step(seed):
            """U-step from U_old (the V-step's features); returns P before and after it."""
            if r == 0:
                K.user_shares(user_ptr, pos_w, pos_l, entry_ptr, entry_item, U, V, b, reg, loss,
                              x, shares[:, 0])
                f = float(shares[:, 0].sum()) + penalty_vb()
                return f, f
            ustep(user_ptr, cw, cl, pos_w, pos_l, entry_ptr, entry_item, alpha, U_old, V, b, reg,
                  loss, _MAX_EXTRA_U_EPOCHS, seed, A, x, U, shares)
            vb = penalty_vb()
            return float(shares[:, 0].sum()) + vb, float(shares[:, 1].sum()) + vb

        K.user_shares(user_ptr, pos_w, pos_l, entry_ptr, entry_item, U, V, b, reg, loss, x,
                      shares[:, 0])
        f_prev = float(shares[:, 0].sum()) + penalty_vb()
        self.objective_init_ = f_prev
        f_zero = n * K.loss_value(loss, 0.0)  # P(0, 0, 0): the stopping rule's reference
        if warm and r > 0:
            # a U-step against the stored V first: brings in the new comparisons' alpha
            _, f_prev = u_step(_draw_seeds(rng, 1)[0])
        objective = []
        self.converged_ = False
        self.n_extra_v_epochs_ = 0
        self.n_v_reverts_ = 0
        rel = np.inf
        t0 = time.perf_counter()
        it = 0
        for it in range(1, self.max_iter + 1):
            U_old[:] = U
            V_old, b_old = V.copy(), b.copy()
            reverted = False
            # V-step: V, b rebuilt from beta with the current U (Alg. 1 line 3), then CD
            K.scatter_duals(pos_w, pos_l, beta, B)
            K.items_from_duals(lay["item_entry_ptr"], lay["item_entries"], lay["entry_user"], B,
                               U_old, reg, V, b, fit_bias)
            for attempt in range(_MAX_EXTRA_V_EPOCHS + 2):
                if attempt <= _MAX_EXTRA_V_EPOCHS:
                    vstep(blocks, block_start, vu, cw, cl, beta, U_old, V, b, fit_bias, reg,
                          loss, _draw_seeds(rng, 1)[0])
                else:
                    # still above the previous objective: keep the old V, b (beta keeps its
                    # progress and starts the next V-step)
                    V[:] = V_old
                    b[:] = b_old
                    self.n_v_reverts_ += 1
                    reverted = True
                # U-step (Alg. 1 lines 13-20): U rebuilt from alpha with the new V, CD per
                # user; the same pass gives P(U_old, V_new), the V-step's result
                f_v, f = u_step(_draw_seeds(rng, 1)[0])
                if f_v <= f_prev or attempt > _MAX_EXTRA_V_EPOCHS:
                    break
                # the V-step went up: undo the U-step (alpha keeps its progress), more V epochs
                U[:] = U_old
                self.n_extra_v_epochs_ += attempt < _MAX_EXTRA_V_EPOCHS
            objective.append(f)
            # decrease of this iteration relative to the whole decrease from w = 0
            # (a cold start begins above P(0) by reg/2 ‖U_random‖²: no test until below it;
            # a decrease at round-off level, 1e-12 P(0), is a stall and stops the fit)
            progress = f_zero - f
            stalled = f_prev - f <= 1e-12 * f_zero
            rel = (f_prev - f) / progress if progress > 0 else (0.0 if stalled else np.inf)
            if self.verbose:
                print(f"AltSVM iter {it:3d}  objective {f:.6e}  decrease / (P(0) - P) "
                      f"{rel:.2e}  {time.perf_counter() - t0:.3f} s")
            if self.tol > 0 and (0.0 <= rel <= self.tol or stalled) and not reverted:
                self.converged_ = True
                break
            f_prev = f
        self.n_iter_ = it
        self.objective_ = np.asarray(objective)
        if self.verbose:
            print(f"AltSVM: {n} comparisons, rank {r}, {it} outer iterations, objective "
                  f"{objective[-1]:.6e}, {'converged' if self.converged_ else 'NOT converged'} "
                  f"in {time.perf_counter() - t0:.3f} s")
        if not self.converged_:
            warnings.warn(f"AltSVM did not converge in max_iter={self.max_iter} outer iterations "
                          f"(last decrease / (P(0) - P) {rel:.2e} > tol={self.tol:g}); "
                          "increase max_iter or tol, or start from warm_start",
                          ConvergenceWarning, stacklevel=3)
        return U, beta

    # ---------------------------------------------------------------- warm start

    def warm_state(self) -> dict:
        """The state a later :meth:`fit` can start from, as a dict of plain numpy arrays.

        Keys: ``U`` (n_users, rank), ``V`` (n_items, rank), ``b`` (n_items,), ``user``,
        ``winner``, ``loser`` (the comparison keys, int64), ``alpha`` (U-step duals, eq. 7)
        and ``beta`` (V-step duals, eq. 9), one per comparison. Everything is a copy and can be
        stored with ``np.savez`` or as JSON lists.
        """
        self._check_fitted()
        c = self._comparisons
        return {"U": self.user_factors_.copy(), "V": self.item_factors_.copy(),
                "b": self.item_bias_.copy(), "user": c[:, 0].copy(), "winner": c[:, 1].copy(),
                "loser": c[:, 2].copy(), "alpha": self._alpha.copy(), "beta": self._beta.copy()}

    def _check_warm_state(self, state) -> dict:
        if not isinstance(state, dict):
            raise ValueError(f"warm_start is a {type(state).__name__}, expected the dict "
                             "returned by warm_state()")
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ValueError(f"warm_start lacks {missing}; expected keys {list(_STATE_KEYS)}")
        s = {k: np.asarray(state[k]) for k in _STATE_KEYS}
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
        return s

    # ---------------------------------------------------------------- using the model

    def _check_fitted(self):
        if not hasattr(self, "item_factors_"):
            raise ValueError("this AltSVM is not fitted yet; call fit() first")

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
        n_items = self.item_factors_.shape[0]
        if int(k) != k or k < 1:
            raise ValueError(f"k is {k!r}, expected an integer >= 1")
        k = int(k)
        kk = min(k, n_items)
        out_items = np.full((users.shape[0], k), -1, dtype=np.int64)
        out_scores = np.full((users.shape[0], k), -np.inf)
        sparse_exclude = exclude is not None and hasattr(exclude, "tocsr")
        if sparse_exclude:
            exclude = exclude.tocsr()
            if exclude.shape[1] != n_items or exclude.shape[0] <= (users.max() if users.size
                                                                   else -1):
                raise ValueError(f"exclude has shape {exclude.shape}; expected (n_users, "
                                 f"{n_items}) with a row for every requested user")
        elif exclude is not None and len(exclude) != users.shape[0]:
            raise ValueError(f"exclude has {len(exclude)} entries, users has {users.shape[0]}; "
                             "expected one id list per user")
        Vt = np.ascontiguousarray(self.item_factors_.T)
        for lo in range(0, users.shape[0], _RECOMMEND_CHUNK):
            hi = min(lo + _RECOMMEND_CHUNK, users.shape[0])
            S = self.user_factors_[users[lo:hi]] @ Vt
            S += self.item_bias_
            if sparse_exclude:
                sub = exclude[users[lo:hi]]
                rows = np.repeat(np.arange(hi - lo), np.diff(sub.indptr))
                S[rows, sub.indices] = -np.inf
            elif exclude is not None:
                for row, ids in enumerate(exclude[lo:hi]):
                    ids = np.asarray(ids, dtype=np.int64)
                    if ids.size and (ids.min() < 0 or ids.max() >= n_items):
                        bad = ids[(ids < 0) | (ids >= n_items)][0]
                        raise ValueError(f"exclude[{lo + row}] contains item {bad}, expected "
                                         f"ids in [0, {n_items})")
                    S[row, ids] = -np.inf
            top = np.argpartition(-S, kk - 1, axis=1)[:, :kk] if kk < n_items else \
                np.broadcast_to(np.arange(n_items), (hi - lo, n_items)).copy()
            ts = np.take_along_axis(S, top, axis=1)
            o = np.argsort(-ts, axis=1, kind="stable")
            top = np.take_along_axis(top, o, axis=1)
            ts = np.take_along_axis(ts, o, axis=1)
            top[~np.isfinite(ts)] = -1
            out_items[lo:hi, :kk] = top
            out_scores[lo:hi, :kk] = ts
        if scalar:
            return out_items[0], out_scores[0]
        return out_items, out_scores

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
        u, _, _ = self._solve_users(c[:, 0], c[:, 1], c[:, 2], 1, max_epochs, gap_tol)
        return u[0]

    def _solve_users(self, users, winners, losers, n_users, max_epochs, gap_tol, seed=0):
        """Solve the U-subproblem (4) to a duality gap, V and b fixed; returns U, alpha, gap.

        ``alpha`` is in the order of the input comparisons.
        """
        loss = _LOSSES[self.loss]
        reg = float(self.reg)
        c = np.column_stack([users, winners, losers]).astype(np.int64)
        o = np.argsort(c[:, 0], kind="stable")
        c = c[o]
        V, b = self.item_factors_, self.item_bias_
        user_ptr = np.zeros(n_users + 1, dtype=np.int64)
        np.cumsum(np.bincount(c[:, 0], minlength=n_users), out=user_ptr[1:])
        cw = np.ascontiguousarray(c[:, 1], dtype=np.int32)
        cl = np.ascontiguousarray(c[:, 2], dtype=np.int32)
        U = np.zeros((n_users, V.shape[1]))  # = w(alpha) for alpha = 0
        alpha = np.zeros(c.shape[0])
        gap = np.inf
        for epoch in range(0, max_epochs, 10):
            K.solve_users(user_ptr, cw, cl, alpha, U, V, b, reg, loss, 10,
                          np.uint64(seed + epoch))
            gap, primal = _user_duality_gap(c[:, 0], cw, cl, alpha, U, V, b, reg, self.loss)
            if gap <= gap_tol * max(1.0, primal):
                break
        out = np.empty_like(alpha)
        out[o] = alpha
        return U, out, gap

    # ---------------------------------------------------------------- persistence

    def save(self, path):
        """Write the fitted model and its warm-start state to directory ``path`` (npz + JSON).

        Examples
        --------
        >>> import numpy as np, tempfile, os
        >>> from solvers import AltSVM
        >>> m = AltSVM(rank=2, reg=1.0, n_threads=1, random_state=0).fit([[0, 1, 0], [1, 0, 1]])
        >>> path = os.path.join(tempfile.mkdtemp(), "model")
        >>> m.save(path)
        >>> np.array_equal(AltSVM.load(path).item_factors_, m.item_factors_)
        True
        """
        self._check_fitted()
        params = self.get_params()
        if not (params["random_state"] is None or isinstance(params["random_state"],
                                                             (int, np.integer))):
            params["random_state"] = None
        elif params["random_state"] is not None:
            params["random_state"] = int(params["random_state"])
        arrays = self.warm_state()
        arrays["objective"] = self.objective_
        save_npz(path, algorithm="AltSVM", params=params, arrays=arrays,
                 extra={"n_iter": int(self.n_iter_), "converged": bool(self.converged_)})

    @classmethod
    def load(cls, path) -> AltSVM:
        """Read a model written by :meth:`save` (``allow_pickle=False``)."""
        params, arrays, extra = load_npz(path, algorithm="AltSVM")
        model = cls(**params)
        model.user_factors_ = arrays["U"]
        model.item_factors_ = arrays["V"]
        model.item_bias_ = arrays["b"]
        model._comparisons = np.column_stack([arrays["user"], arrays["winner"],
                                              arrays["loser"]]).astype(np.int64)
        model._alpha = arrays["alpha"]
        model._beta = arrays["beta"]
        model.objective_ = arrays["objective"]
        model.n_iter_ = int(extra["n_iter"])
        model.converged_ = bool(extra["converged"])
        return model


def warm_up(n_threads=None) -> float:
    """Compile, or load from numba's on-disk cache, every AltSVM kernel; returns the seconds.

    The first call in a fresh environment compiles (several seconds); later processes load the
    cached machine code (well under a second). Call it at service start so that the first
    real fit does not pay this.

    Examples
    --------
    >>> from solvers.altsvm import warm_up
    >>> seconds = warm_up(n_threads=1)
    """
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    c = np.column_stack([rng.integers(0, 5, 200), rng.integers(0, 8, 200), rng.integers(0, 8, 200)])
    c = c[c[:, 1] != c[:, 2]]
    threads = {1, _num_threads_available() if n_threads is None else int(n_threads)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for t in sorted(threads):
            m = AltSVM(rank=2, reg=1.0, n_threads=t, random_state=0, max_iter=2).fit(c[:-20])
            for _ in range(2):  # changed comparisons (the hash join), then unchanged (a copy)
                m = AltSVM(rank=2, reg=1.0, n_threads=t, random_state=0, max_iter=2).fit(
                    c, warm_start=m.warm_state())
        m.fold_in(c[:5, 1:], max_epochs=10)
        m.recommend([0, 1], k=3)
    ratings = rng.integers(1, 6, 40).astype(float)   # the pair kernels of pairs_from_ratings
    for cap, strategy in ((None, "random"), (3, "random"), (3, "largest_gap")):
        pairs_from_ratings(np.repeat(np.arange(4), 10), np.tile(np.arange(10), 4), ratings,
                           max_pairs_per_user=cap, strategy=strategy, random_state=0)
    return time.perf_counter() - t0


def _draw_seeds(rng, m):
    return rng.integers(0, 2**63, size=m, dtype=np.int64).astype(np.uint64)


def _user_duality_gap(users, cw, cl, alpha, U, V, b, reg, loss_name) -> float:
    """Duality gap P(U) + D(alpha) of the U-subproblem (4) in the rescaled dual, and P(U).

    With the bias offset o_c = b_j − b_k the margin is z_c = u_iᵀx_c + o_c, whose loss has
    conjugate L*(−a) + a o_c, so D(a) = reg/2 ‖U(a)‖² + Σ_c [L*(−a_c) + a_c o_c] (U(a) is
    maintained by the kernel) and P(U) + D(alpha) >= 0 with equality at the optimum.
    """
    offset = b[cw] - b[cl]
    z = np.einsum("ij,ij->i", U[users], V[cw] - V[cl]) + offset
    if loss_name == "squared_hinge":
        primal_loss = np.maximum(0.0, 1.0 - z) ** 2
        conj = -alpha + 0.25 * alpha**2
    elif loss_name == "hinge":
        primal_loss = np.maximum(0.0, 1.0 - z)
        conj = -alpha
    else:
        primal_loss = np.logaddexp(0.0, -z)
        with np.errstate(divide="ignore", invalid="ignore"):
            conj = np.where(alpha > 0, alpha * np.log(alpha), 0.0) + \
                np.where(alpha < 1, (1 - alpha) * np.log1p(-alpha), 0.0)
    UU = float(np.vdot(U, U))
    primal = float(primal_loss.sum()) + 0.5 * reg * UU
    return primal + 0.5 * reg * UU + float((conj + alpha * offset).sum()), primal
