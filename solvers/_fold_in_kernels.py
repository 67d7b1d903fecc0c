"""Jitted kernels of :mod:`solvers.fold_in`: the pairwise fold-in of many users in one call
(what the refresher recomputes every batch), by Newton's method for the squared hinge and by
dual coordinate descent for the other losses. Plain arrays in, plain arrays out.

For each user n, over their comparisons ``c`` in ``indptr[n]:indptr[n + 1]`` with
``d_c = V[winner_c] − V[loser_c]`` and ``o_c = bias[winner_c] − bias[loser_c]``::

    min_u  reg/2 ‖u‖² + Σ_c max(0, 1 − d_cᵀu − o_c)²

by generalized Newton steps (Hessian ``reg I + 2 Σ_{c active} d_c d_cᵀ``) with Armijo
backtracking, from ``starts[n]`` where ``has_start[n]`` (else 0), until
``‖∇‖² ≤ tol · max(1, reg)``: step for step the method of
:func:`solvers.fold_in._squared_hinge_newton`, its reference, without building ``D`` in numpy.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from solvers._altsvm_kernels import (
    _FAST,
    HINGE,
    SQUARED_HINGE,
    _affine_order,
    _stream_seed,
    dual_step,
)
from solvers._pairs_kernels import MAX_TRIES
from solvers._random import next_u64

GAP_EVERY = 10     # dual CD passes between two duality-gap checks


@njit(cache=True)
def _objective(D, offset, m, u, reg, residual):
    """``reg/2 ‖u‖² + Σ max(0, r_c)²`` with ``r_c = 1 − d_cᵀu − o_c`` written to ``residual``."""
    value = 0.5 * reg * np.dot(u, u)
    for c in range(m):
        r = 1.0 - offset[c]
        for k in range(u.shape[0]):
            r -= D[c, k] * u[k]
        residual[c] = r
        if r > 0.0:
            value += r * r
    return value


@njit(cache=True, nogil=True)
def _longest(t, spans, indptr):
    """The most comparisons of one user among users t, t + spans, ... (their buffers' size)."""
    longest = 0
    for n in range(t, len(indptr) - 1, spans):
        longest = max(longest, indptr[n + 1] - indptr[n])
    return longest


@njit(cache=True, nogil=True)
def _gather(V, bias, winners, losers, lo, m, D, offset):
    """``D[c] = V[w_c] − V[l_c]`` and ``offset[c] = bias[w_c] − bias[l_c]`` of comparisons
    lo .. lo + m − 1: a user's rows, contiguous for the passes over them."""
    for c in range(m):
        w, x = winners[lo + c], losers[lo + c]
        offset[c] = bias[w] - bias[x]
        for k in range(V.shape[1]):
            D[c, k] = V[w, k] - V[x, k]


@njit(cache=True, nogil=True, parallel=True)
def squared_hinge_newton_many(V, bias, winners, losers, indptr, reg, starts, has_start,
                              max_iter, tol, spans):
    """Every user's row of U (see the module). Users are independent: ``spans`` of them run
    on the threads (users t, t + spans, ...: long histories spread over them), each with one
    set of buffers, so the rows are the same on any number of threads."""
    n_users, rank = len(indptr) - 1, V.shape[1]
    U = np.zeros((n_users, rank))
    for t in prange(min(spans, n_users)):
        _newton_span(t, spans, V, bias, winners, losers, indptr, reg, starts, has_start,
                     max_iter, tol, U)
    return U


@njit(cache=True, nogil=True)
def _newton_span(t, spans, V, bias, winners, losers, indptr, reg, starts, has_start, max_iter,
                 tol, U):
    """The rows of users t, t + spans, ... of U."""
    n_users, rank = len(indptr) - 1, V.shape[1]
    longest = _longest(t, spans, indptr)
    # one set of buffers for the span's users: a user's problem is a few µs of arithmetic, and
    # allocating its D, residuals and active rows each step cost more than the arithmetic
    D = np.empty((longest, rank))
    offset = np.empty(longest)
    residual = np.empty(longest)
    trial_residual = np.empty(longest)
    active = np.empty((longest, rank))
    g = np.empty(rank)
    for n in range(t, n_users, spans):
        lo, m = indptr[n], indptr[n + 1] - indptr[n]
        if m == 0:
            continue
        _gather(V, bias, winners, losers, lo, m, D, offset)
        u = starts[n].copy() if has_start[n] else np.zeros(rank)
        value = _objective(D, offset, m, u, reg, residual)
        for _ in range(max_iter):
            # gradient reg u − 2 Σ_active r_c d_c and Hessian reg I + 2 Σ_active d_c d_cᵀ
            for k in range(rank):
                g[k] = reg * u[k]
            for c in range(m):
                if residual[c] > 0.0:
                    r2 = 2.0 * residual[c]
                    for k in range(rank):
                        g[k] -= r2 * D[c, k]
            if np.dot(g, g) <= tol * max(1.0, reg):
                break
            na = 0
            for c in range(m):
                if residual[c] > 0.0:
                    active[na] = D[c]
                    na += 1
            A = active[:na]
            H = 2.0 * (A.T @ A)       # a BLAS call: the one O(m rank²) part
            for k in range(rank):
                H[k, k] += reg
            step = np.linalg.solve(H, -g)
            slope = np.dot(g, step)
            t = 1.0
            while True:     # the generalized Hessian can overshoot past a kink: backtrack
                trial = u + t * step
                new_value = _objective(D, offset, m, trial, reg, trial_residual)
                if new_value <= value + 1e-4 * t * slope or t < 1e-10:
                    break
                t *= 0.5
            u, value = trial, new_value
            residual, trial_residual = trial_residual, residual
        U[n] = u


@njit(cache=True, nogil=True, parallel=True)
def dual_cd_many(V, bias, winners, losers, indptr, reg, loss, max_epochs, gap_tol, spans):
    """``(U, alpha)``: each user's row of U and their comparisons' duals, by dual coordinate
    descent on the user's problem (AltSVM's problem 5, ``loss`` one of
    :mod:`solvers._altsvm_kernels`' codes) from alpha = 0, in rounds of :data:`GAP_EVERY`
    passes (the pass's order drawn from stream 0 of seed ``epoch``, the round's first pass), until
    the user's duality gap is at most ``gap_tol · max(1, P)`` or ``max_epochs`` passes ran:
    pass for pass :func:`solvers._altsvm_solver.solve_users` on one user, its reference. Each
    user's ``d_c = V[w] − V[l]`` is gathered once into a contiguous buffer (the passes read
    it in a random order: from V, each read was a cache miss); users are spread over the
    threads as in :func:`squared_hinge_newton_many`, so the rows are the same on any number."""
    n_users, rank = len(indptr) - 1, V.shape[1]
    U = np.zeros((n_users, rank))
    alpha = np.zeros(indptr[-1])
    for t in prange(min(spans, n_users)):
        _dual_span(t, spans, V, bias, winners, losers, indptr, reg, loss, max_epochs, gap_tol,
                   U, alpha)
    return U, alpha


@njit(cache=True, nogil=True)
def _dual_span(t, spans, V, bias, winners, losers, indptr, reg, loss, max_epochs, gap_tol, U,
               alpha):
    """The rows (and duals) of users t, t + spans, ... ."""
    n_users, rank = len(indptr) - 1, V.shape[1]
    longest = _longest(t, spans, indptr)
    D = np.empty((longest, rank))
    offset = np.empty(longest)
    dd = np.empty(longest)
    for n in range(t, n_users, spans):
        lo, m = indptr[n], indptr[n + 1] - indptr[n]
        _gather(V, bias, winners, losers, lo, m, D, offset)
        for c in range(m):
            s = 0.0
            for k in range(rank):
                s += D[c, k] * D[c, k]
            dd[c] = s
        u, a = U[n], alpha[lo:lo + m]
        for epoch in range(0, max_epochs, GAP_EVERY):
            state = _stream_seed(np.uint64(epoch), np.uint64(0))
            for _ in range(GAP_EVERY):
                state = _dual_pass(D, offset, dd, m, a, u, reg, loss, state)
            gap, primal = _dual_gap(D, offset, m, a, u, reg, loss)
            if gap <= gap_tol * max(1.0, primal):
                break


@njit(cache=True, fastmath=_FAST)
def _dual_pass(D, offset, dd, m, a, u, reg, loss, state):
    """One pass of dual CD steps (eq. 8) over a user's comparisons in a random affine order:
    :func:`solvers._altsvm_kernels._user_cd` on the gathered ``d_c``."""
    state, pos, stride = _affine_order(m, state)
    for _ in range(m):
        c = pos
        pos += stride
        if pos >= m:
            pos -= m
        g = offset[c]
        for f in range(u.shape[0]):
            g += u[f] * D[c, f]
        old = a[c]
        new = dual_step(loss, old, g, dd[c] / reg)
        if new != old:
            a[c] = new
            step = (new - old) / reg
            for f in range(u.shape[0]):
                u[f] += step * D[c, f]
    return state


@njit(cache=True)
def _dual_gap(D, offset, m, a, u, reg, loss):
    """``(P(u) + D(a), P(u))`` of one user's problem, as
    :func:`solvers._altsvm_solver.user_duality_gap` computes it for every user."""
    uu = np.dot(u, u)
    loss_sum, conj_sum = 0.0, 0.0
    for c in range(m):
        z = offset[c]
        for k in range(u.shape[0]):
            z += D[c, k] * u[k]
        if loss == SQUARED_HINGE:
            r = max(0.0, 1.0 - z)
            loss_sum += r * r
            conj = -a[c] + 0.25 * a[c] * a[c]
        elif loss == HINGE:
            loss_sum += max(0.0, 1.0 - z)
            conj = -a[c]
        else:
            loss_sum += max(-z, 0.0) + np.log1p(np.exp(-abs(z)))
            conj = 0.0
            if a[c] > 0.0:
                conj += a[c] * np.log(a[c])
            if a[c] < 1.0:
                conj += (1.0 - a[c]) * np.log1p(-a[c])
        conj_sum += conj + a[c] * offset[c]
    primal = loss_sum + 0.5 * reg * uu
    return primal + 0.5 * reg * uu + conj_sum, primal


@njit(cache=True)
def implicit_pairs_many(met, met_indptr, seen, seen_indptr, seeds, per_item, n_items, cum):
    """:func:`solvers.fold_in.implicit_pairs` of many users (``met[met_indptr[n]:...]`` win,
    ``seen[seen_indptr[n]:...]`` are never drawn, each sorted and unique; ``seeds[n]``: the
    CRC-32 of the winners' int64 bytes, shifted left 32; ``per_item[n]``; ``cum``: the
    weights losers are drawn by, empty for uniform draws), draw for draw, before any cap:
    ``(winners, losers, indptr)``."""
    n_users = len(met_indptr) - 1
    indptr = np.zeros(n_users + 1, np.int64)
    for n in range(n_users):
        m = met_indptr[n + 1] - met_indptr[n]
        n_others = n_items - (seen_indptr[n + 1] - seen_indptr[n])
        count = m * per_item[n] if m > 0 and n_others > 0 and per_item[n] >= 1 else 0
        indptr[n + 1] = indptr[n] + count
    winners = np.empty(indptr[-1], np.int64)
    losers = np.empty(indptr[-1], np.int64)
    others = np.empty(n_items, np.int64)
    span = 1                      # the next power of two >= the weights' total
    while cum.shape[0] and span < cum[-1]:
        span *= 2
    for n in range(n_users):
        items = met[met_indptr[n]:met_indptr[n + 1]]
        excluded = seen[seen_indptr[n]:seen_indptr[n + 1]]
        n_others = n_items - len(excluded)
        out, count = indptr[n], indptr[n + 1] - indptr[n]
        # the r-th item not seen: read from a list of them when the draws outnumber the
        # items (one pass over the items), else r + #{s_j − j ≤ r} by a binary search
        listed = 4 * count >= n_items
        if listed:
            j, at = 0, 0
            for i in range(n_items):
                if j < len(excluded) and excluded[j] == i:
                    j += 1
                else:
                    others[at] = i
                    at += 1
        gaps = excluded - np.arange(len(excluded))
        for k in range(count):
            winners[out + k] = items[k // per_item[n]]
            j = _weighted_loser(cum, span, excluded, seeds[n], k, count)
            if j < 0:
                _, bits = next_u64(seeds[n] + np.uint64(k))
                r = np.int64(bits % np.uint64(n_others))
                j = others[r] if listed else r + np.searchsorted(gaps, r, side="right")
            losers[out + k] = j
    return winners, losers, indptr


@njit(cache=True)
def _weighted_loser(cum, span, excluded, seed, k, count):
    """Draw ``k``'s loser by the weights ``cum``, as :func:`solvers.fold_in._weighted_losers`
    draws it; -1 where ``cum`` is empty or every try failed."""
    if cum.shape[0] == 0:
        return -1
    for t in range(MAX_TRIES):
        _, bits = next_u64(seed + np.uint64(k + t * count))
        v = np.int64(bits & np.uint64(span - 1))
        if v >= cum[-1]:
            continue
        j = np.searchsorted(cum, v, side="right")
        p = np.searchsorted(excluded, j)
        if p < excluded.shape[0] and excluded[p] == j:
            continue
        return j
    return -1
