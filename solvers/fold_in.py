"""A new user's factor from a few of their items, against fixed item factors: the serving-time
half of two factor models, each solving exactly the problem its training solves for a user.

* :func:`pairwise_fold_in`: the user sub-problem of collaborative ranking by pairwise
  comparisons (AltSVM's problem 5), ``min_u reg/2 ‖u‖² + Σ_c L(1 − uᵀ(v_w − v_l) − (b_w − b_l))``
  over the user's (winner, loser) comparisons: Newton's method for the squared hinge, dual
  coordinate descent to a duality gap for the hinge.
  Met items become comparisons against ``per_item`` sampled items the user did not meet, as
  training's implicit comparisons are made (:func:`implicit_pairs`).
* :func:`least_squares_fold_in`: implicit feedback ALS (Hu, Koren & Volinsky) with confidence
  ``c = alpha`` on met items, in implicit's convention:
  ``u = (VᵀV + reg I + Σ_i (c − 1) v_i v_iᵀ)⁻¹ Σ_i c v_i`` (one exact linear solve).

Examples
--------
>>> import numpy as np
>>> V = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
>>> u = pairwise_fold_in(V, None, [[0, 2]], reg=1.0, loss="squared_hinge")
>>> bool(V[0] @ u > V[2] @ u)
True
>>> least_squares_fold_in(V, [0], reg=1.0, alpha=10.0).round(3)
array([0.833, 0.   ])
"""

from __future__ import annotations

import zlib

import numpy as np

from solvers._pairs_kernels import MAX_TRIES
from solvers._random import mix64


def implicit_pairs(items, n_items: int, per_item: int, *, seen=None, cap=None,
                   cum=None) -> np.ndarray:
    """(winner, loser) rows: each of ``items`` against ``per_item`` items drawn uniformly (with
    replacement) from those not ``seen`` (default: ``items``; a user's met items, of which
    ``items`` win, as training never draws a met item as a loser); the draw is seeded by the
    items, so the same request gets the same pairs; at most ``cap`` rows, those of smallest
    hash (:func:`keep_smallest`), as training trims a user's to ``implicit_per_user``. A
    counter-based draw (splitmix64 of the items' CRC and a counter; no generator object to
    seed: a refresher draws for thousands of users a second), in
    O(per_item · |items| · log |seen|), whatever the number of items.

    ``cum`` (:func:`solvers.pairs.popularity_cum`, or any cumulative positive int64 weights of
    the ``n_items``): losers drawn in proportion to the weights, as training draws its
    popularity-sampled ones: a value below the next power of two >= the total, rejected past
    it or on a seen item, up to ``MAX_TRIES`` values per draw (counter ``k + t · count`` for
    the t-th of draw k), then the uniform draw.

    >>> implicit_pairs([0, 1], 4, 2).tolist()   # items 2 and 3 are the ones not met
    [[0, 3], [0, 2], [1, 2], [1, 3]]
    >>> implicit_pairs([0, 1], 4, 2, seen=[0, 1, 3], cap=3).tolist()   # 3 met, not a winner
    [[0, 2], [0, 2], [1, 2]]
    """
    met = sorted_unique(items)
    excluded = met if seen is None else sorted_unique(
        np.concatenate([met, np.asarray(seen, np.int64).ravel()]))
    n_others = n_items - len(excluded)
    if not len(met) or n_others <= 0 or per_item < 1:
        return np.zeros((0, 2), np.int64)
    count = len(met) * per_item
    seed = np.uint64(zlib.crc32(met.tobytes())) << np.uint64(32)
    with np.errstate(over="ignore"):
        bits = mix64(seed + np.arange(count, dtype=np.uint64))
    # uniform on [0, n_others): a modulo of 64 random bits (bias below n_others / 2⁶⁴)
    r = (bits % np.uint64(n_others)).astype(np.int64).reshape(len(met), per_item)
    # the r-th item not seen is r plus the number of seen items s_j with s_j - j <= r
    losers = (r + np.searchsorted(excluded - np.arange(len(excluded)), r, side="right")).ravel()
    if cum is not None:
        losers = _weighted_losers(np.asarray(cum, np.int64), excluded, seed, count, losers)
    return keep_smallest(np.column_stack([np.repeat(met, per_item), losers]), seed, cap)


def _weighted_losers(cum, excluded, seed, count: int, uniform) -> np.ndarray:
    """:func:`implicit_pairs`' draws by weights ``cum``; ``uniform`` where every try failed."""
    span = 1 << max(int(cum[-1]) - 1, 0).bit_length()    # the next power of two >= the total
    out = np.full(count, -1, np.int64)
    for t in range(MAX_TRIES):
        k = np.flatnonzero(out < 0)
        if not len(k):
            break
        with np.errstate(over="ignore"):
            v = (mix64(seed + (k + t * count).astype(np.uint64))
                 & np.uint64(span - 1)).astype(np.int64)
        j = np.searchsorted(cum, v, side="right")
        seen_j = np.zeros(len(k), bool)
        if len(excluded):
            seen_j = excluded[np.minimum(np.searchsorted(excluded, j), len(excluded) - 1)] == j
        hit = (v < cum[-1]) & ~seen_j
        out[k[hit]] = j[hit]
    return np.where(out < 0, uniform, out)


def keep_smallest(pairs: np.ndarray, seed, cap) -> np.ndarray:
    """The ``cap`` rows of ``pairs`` (winner, loser) of smallest hash under ``seed``, in their
    order (all of them when ``cap`` is None or not below their count): a user's cap keeps the
    same draws however they were made."""
    if cap is None or len(pairs) <= int(cap):
        return pairs
    with np.errstate(over="ignore"):
        h = mix64(mix64(np.uint64(seed) ^ pairs[:, 0].astype(np.uint64))
                  ^ pairs[:, 1].astype(np.uint64))
    return pairs[np.sort(np.argsort(h, kind="stable")[:int(cap)])]


def implicit_pairs_many(items_of_users: list, n_items: int, per_item: list, *, seen=None,
                        caps=None, cum=None) -> list:
    """:func:`implicit_pairs` of several users (``per_item[n]``, ``seen[n]`` and ``caps[n]``
    each; ``cum`` for all), draw for draw, in one jitted call: a list of (winner, loser) row
    arrays."""
    from solvers._fold_in_kernels import implicit_pairs_many as draw

    met = [sorted_unique(x) for x in items_of_users]
    excluded = met if seen is None else [
        sorted_unique(np.concatenate([m, np.asarray(s, np.int64).ravel()]))
        for m, s in zip(met, seen)]
    seeds = np.array([zlib.crc32(x.tobytes()) << 32 for x in met], np.uint64)
    winners, losers, at = draw(*_ragged(met), *_ragged(excluded), seeds,
                               np.asarray(per_item, np.int64).reshape(len(met)), int(n_items),
                               np.zeros(0, np.int64) if cum is None else np.asarray(cum, np.int64))
    pairs = np.column_stack([winners, losers])
    caps = caps if caps is not None else [None] * len(met)
    return [keep_smallest(pairs[at[n]:at[n + 1]], seeds[n], caps[n]) for n in range(len(met))]


def _ragged(rows: list) -> tuple[np.ndarray, np.ndarray]:
    """Arrays of int64 rows as one array and its row pointers."""
    indptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([len(x) for x in rows], out=indptr[1:])
    return (np.concatenate(rows) if rows else np.zeros(0, np.int64)), indptr


def pairwise_fold_in(V, b, comparisons, *, reg: float, loss: str, max_epochs: int = 200,
                     gap_tol: float = 1e-6, start=None) -> np.ndarray:
    """The user factor minimizing the pairwise problem above with ``V``, ``b`` fixed.
    ``comparisons``: (winner, loser) item indices; ``b`` may be None (no item bias).

    The squared hinge (AltSVM's default) is solved in the primal by Newton's method: one
    user's problem is ``rank`` unknowns, and its generalized Newton steps reach the optimum in a
    few iterations (a third of the dual's time at a 20-item fold-in). The hinge keeps AltSVM's
    own dual coordinate descent (``max_epochs``, ``gap_tol``: its duality gap).

    ``start``: where Newton's method starts (the user's last factor; the problem is strongly
    convex, so the optimum is the same and the stopping rule, an absolute gradient norm, does
    not depend on it); a refreshed user whose history grew by an event is then a step or two
    away. The hinge's dual descent starts from zero duals whatever it is given."""
    V = np.ascontiguousarray(V, dtype=np.float64)
    c = np.asarray(comparisons, dtype=np.int64).reshape(-1, 2)
    if not len(c):
        return np.zeros(V.shape[1])
    if c.min() < 0 or c.max() >= len(V):
        raise ValueError(f"comparisons name item {int(c.max())}, the factors have {len(V)} "
                         "items")
    if loss == "squared_hinge":
        bias = np.zeros(len(V)) if b is None else np.ascontiguousarray(b, dtype=np.float64)
        return _squared_hinge_newton(V[c[:, 0]] - V[c[:, 1]], bias[c[:, 0]] - bias[c[:, 1]],
                                     float(reg), start=start)
    return pairwise_duals(V, b, c, reg=reg, loss=loss, max_epochs=max_epochs,
                          gap_tol=gap_tol)[0]


def pairwise_duals(V, b, comparisons, *, reg: float, loss: str, max_epochs: int = 200,
                   gap_tol: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """``(u, alpha)``: one user's factor and the duals of their ``comparisons`` (in their
    order) by dual coordinate descent to a relative duality gap ``gap_tol``
    (:func:`solvers._fold_in_kernels.dual_cd_many`; u = (1/reg) Σ_c alpha_c d_c)."""
    V, bias, winners, losers, indptr = _user_rows(V, b, [comparisons])
    U, alpha = _dual_cd(V, bias, winners, losers, indptr, reg, loss, max_epochs, gap_tol)
    return U[0], alpha


def pairwise_fold_in_many(V, b, comparisons_of_users: list, *, reg: float, loss: str,
                          starts=None, max_epochs: int = 200, gap_tol: float = 1e-6
                          ) -> np.ndarray:
    """:func:`pairwise_fold_in` of several users, one row each (``starts``: each user's start
    or None), in one jitted call over every user, spread over numba's threads: the same
    Newton steps for the squared hinge (:func:`solvers._fold_in_kernels.squared_hinge_newton_many`),
    the same dual passes for the others (:func:`solvers._fold_in_kernels.dual_cd_many`)."""
    import numba

    V, bias, winners, losers, indptr = _user_rows(V, b, comparisons_of_users)
    if loss != "squared_hinge":
        return _dual_cd(V, bias, winners, losers, indptr, reg, loss, max_epochs, gap_tol)[0]
    from solvers._fold_in_kernels import squared_hinge_newton_many

    begin = np.zeros((len(indptr) - 1, V.shape[1]))
    has = np.zeros(len(indptr) - 1, np.bool_)
    for n, x in enumerate(starts if starts is not None else ()):
        if x is not None and np.shape(x) == (V.shape[1],) and np.isfinite(x).all():
            begin[n], has[n] = x, True
    return squared_hinge_newton_many(V, bias, winners, losers, indptr, float(reg), begin, has,
                                     50, 1e-12, 4 * numba.get_num_threads())


def _user_rows(V, b, comparisons_of_users: list) -> tuple:
    """``(V, bias, winners, losers, indptr)`` as the kernels take them (float64, int64, the
    users' (winner, loser) rows one after another), the item numbers checked against V."""
    V = np.ascontiguousarray(V, dtype=np.float64)
    rows = [np.asarray(c, dtype=np.int64).reshape(-1, 2) for c in comparisons_of_users]
    pairs = np.concatenate(rows) if rows else np.zeros((0, 2), np.int64)
    if len(pairs) and (pairs.min() < 0 or pairs.max() >= len(V)):
        raise ValueError(f"comparisons name item {int(pairs.max())}, the factors have "
                         f"{len(V)} items")
    indptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([len(c) for c in rows], out=indptr[1:])
    bias = np.zeros(len(V)) if b is None else np.ascontiguousarray(b, dtype=np.float64)
    return (V, bias, np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1]),
            indptr)


def _dual_cd(V, bias, winners, losers, indptr, reg, loss, max_epochs, gap_tol) -> tuple:
    import numba

    from solvers._altsvm_solver import LOSSES
    from solvers._fold_in_kernels import dual_cd_many

    if loss not in LOSSES:
        raise ValueError(f"loss is {loss!r}, expected one of {sorted(LOSSES)}")
    return dual_cd_many(V, bias, winners, losers, indptr, float(reg), LOSSES[loss],
                        int(max_epochs), float(gap_tol), 4 * numba.get_num_threads())


def _squared_hinge_newton(D, offset, reg: float, max_iter: int = 50,
                          tol: float = 1e-12, start=None) -> np.ndarray:
    """argmin_u reg/2 ‖u‖² + Σ_c max(0, 1 − d_cᵀu − o_c)² by generalized Newton steps
    (Hessian reg I + 2 D_Aᵀ D_A over the active comparisons A) with backtracking, until
    ‖∇‖² ≤ tol · max(1, reg)."""
    u = np.zeros(D.shape[1])
    if start is not None and np.shape(start) == u.shape and np.isfinite(start).all():
        u = np.array(start, dtype=np.float64)
    eye = reg * np.eye(D.shape[1])

    def objective(x):
        r = np.maximum(1.0 - D @ x - offset, 0.0)
        return 0.5 * reg * (x @ x) + r @ r, r

    value, r = objective(u)
    for _ in range(max_iter):
        active = r > 0
        g = reg * u - 2.0 * (D[active].T @ r[active])
        if g @ g <= tol * max(1.0, reg):
            break
        step = np.linalg.solve(eye + 2.0 * (D[active].T @ D[active]), -g)
        t = 1.0
        while True:     # the generalized Hessian can overshoot past a kink: backtrack
            new_value, new_r = objective(u + t * step)
            if new_value <= value + 1e-4 * t * (g @ step) or t < 1e-10:
                break
            t *= 0.5
        u, value, r = u + t * step, new_value, new_r
    return u


def sorted_unique(a) -> np.ndarray:
    """``np.unique`` of a small int array by a sort (a few µs, not np.unique's hashing)."""
    a = np.sort(np.asarray(a, dtype=np.int64).reshape(-1))
    if a.size > 1:
        keep = a[1:] != a[:-1]
        if not keep.all():
            a = a[np.concatenate(([True], keep))]
    return a


def least_squares_fold_in(V, items, *, reg: float, alpha: float, gram=None) -> np.ndarray:
    """The implicit-ALS user factor for met ``items`` (see the module); ``gram`` is ``VᵀV``
    when the caller keeps it per version."""
    return least_squares_fold_in_many(V, [items], reg=reg, alpha=alpha, gram=gram)[0]


def least_squares_fold_in_many(V, items_of_users, *, reg: float, alpha: float,
                               gram=None) -> np.ndarray:
    """:func:`least_squares_fold_in` of several users at once, one row each: their systems
    ``(VᵀV + λI + (α−1) YᵤᵀYᵤ) u = α Yᵤᵀ1`` stacked and solved in one batched LAPACK call."""
    V = np.asarray(V, dtype=np.float64)
    base = (V.T @ V if gram is None else gram) + reg * np.eye(V.shape[1])
    A = np.empty((len(items_of_users), *base.shape))
    rhs = np.empty((len(items_of_users), V.shape[1], 1))
    for n, items in enumerate(items_of_users):
        Y = V[sorted_unique(items)]
        np.add(base, (alpha - 1.0) * (Y.T @ Y), out=A[n])
        rhs[n, :, 0] = alpha * Y.sum(axis=0)
    return np.linalg.solve(A, rhs)[:, :, 0] if len(A) else np.zeros((0, V.shape[1]))


def warm_up() -> float:
    """Load the jitted fold-in kernels (from numba's cache, or compiled) with a tiny problem,
    so a server worker's or the refresher's first fold-in does not pay for it (six seconds on
    a fresh clone's first demo run, once); returns the seconds."""
    import time

    started = time.perf_counter()
    V = np.eye(3)
    pairwise_fold_in_many(V, None, implicit_pairs_many([np.array([0])], 3, [2]), reg=1.0,
                          loss="squared_hinge")
    return time.perf_counter() - started
