"""Jitted kernel of :mod:`solvers.fold_in`: the squared-hinge pairwise fold-in of many users in
one call (what the refresher recomputes every batch). Plain arrays in, plain arrays out.

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
from numba import njit

from solvers._random import next_u64


@njit(cache=True)
def _objective(D, offset, u, reg):
    residual = 1.0 - D @ u - offset
    value = 0.5 * reg * np.dot(u, u)
    for c in range(residual.shape[0]):
        if residual[c] > 0.0:
            value += residual[c] * residual[c]
    return value, residual


@njit(cache=True)
def squared_hinge_newton_many(V, bias, winners, losers, indptr, reg, starts, has_start,
                              max_iter, tol):
    n_users, rank = len(indptr) - 1, V.shape[1]
    U = np.zeros((n_users, rank))
    eye = reg * np.eye(rank)
    for n in range(n_users):
        lo, hi = indptr[n], indptr[n + 1]
        if hi == lo:
            continue
        w, x = winners[lo:hi], losers[lo:hi]
        D = np.ascontiguousarray(V[w] - V[x])
        offset = bias[w] - bias[x]
        u = starts[n].copy() if has_start[n] else np.zeros(rank)
        value, residual = _objective(D, offset, u, reg)
        for _ in range(max_iter):
            active = np.flatnonzero(residual > 0.0)
            A = np.ascontiguousarray(D[active])
            g = reg * u - 2.0 * (A.T @ residual[active])
            if np.dot(g, g) <= tol * max(1.0, reg):
                break
            step = np.linalg.solve(eye + 2.0 * (A.T @ A), -g)
            slope = np.dot(g, step)
            t = 1.0
            while True:     # the generalized Hessian can overshoot past a kink: backtrack
                trial = u + t * step
                new_value, new_residual = _objective(D, offset, trial, reg)
                if new_value <= value + 1e-4 * t * slope or t < 1e-10:
                    break
                t *= 0.5
            u, value, residual = trial, new_value, new_residual
        U[n] = u
    return U


@njit(cache=True)
def implicit_pairs_many(met, met_indptr, seeds, per_item, n_items):
    """:func:`solvers.fold_in.implicit_pairs` of many users (``met[met_indptr[n]:...]``, each
    sorted and unique; ``seeds[n]``: the CRC-32 of those items' int64 bytes, shifted left 32;
    ``per_item[n]``), draw for draw: ``(winners, losers, indptr)``."""
    n_users = len(met_indptr) - 1
    indptr = np.zeros(n_users + 1, np.int64)
    for n in range(n_users):
        m = met_indptr[n + 1] - met_indptr[n]
        count = m * per_item[n] if 0 < m < n_items and per_item[n] >= 1 else 0
        indptr[n + 1] = indptr[n] + count
    winners = np.empty(indptr[-1], np.int64)
    losers = np.empty(indptr[-1], np.int64)
    for n in range(n_users):
        items = met[met_indptr[n]:met_indptr[n + 1]]
        n_others = n_items - len(items)
        gaps = items - np.arange(len(items))     # the r-th item not met is r + #{gaps <= r}
        out = indptr[n]
        for k in range(indptr[n + 1] - indptr[n]):
            _, bits = next_u64(seeds[n] + np.uint64(k))
            r = np.int64(bits % np.uint64(n_others))
            winners[out + k] = items[k // per_item[n]]
            losers[out + k] = r + np.searchsorted(gaps, r, side="right")
    return winners, losers, indptr
