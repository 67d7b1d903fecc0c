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
