"""Reference: a plain numpy port of the authors' TopPush code (``topPush.m`` + ``epne.c``).

Li, Jin, Zhou, "Top Rank Optimization in Linear Time" (NIPS 2014), Algorithm 1 (Nesterov's
method with a line search on the dual, eq. 7) and the projection of Proposition 2 / Algorithm 2.
This follows the authors' MATLAB implementation statement by statement (the official package,
as mirrored at github.com/baowj-678/toppush-python, ``official/topPush.m``), truncated quadratic
loss only. Where that code differs from the paper's pseudo-code, the code is followed:

* initial L = 1/m (Algorithm 1 says 1/(m + n)); L only ever doubles (step 13), never shrinks;
* line-search test g(x') ≤ g(s) + ∇g(s)ᵀ(x' − s) + L/2 ‖x' − s‖² (the standard form);
* stopping rule: after iteration k ≥ 10, stop when |g_k − g_{k−1}| ≤ tol·|g_{k−1}| (the paper's
  step 16 in relative form, with the code's "at least 10 iterations" guard; the code stores
  g/m, which cancels in the ratio), or as soon as an accepted trial point lies within
  ‖x' − s‖ ≤ 1e-6 of the search point (the code's ``delta``);
* no momentum restart, no shrinking; w = (αᵀX⁺ − βᵀX⁻)/(λm) (eq. 9) at the last iterate.

The projection onto Ξ = {α ≥ 0, β ≥ 0, 1ᵀα = 1ᵀβ} is exact, like the authors' ``epne.c``, but
sort-based (O((m+n) log(m+n))) instead of their linear-time selection; both return the same
point up to round-off. Speed is not the point of this module: it is the yardstick for
``solvers.TopPush`` in ``bench/toppush_binary.py`` (same splits, same run).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp


def project_equal_sums(a0, b0):
    """Euclidean projection of (a0, b0) onto {α ≥ 0, β ≥ 0, 1ᵀα = 1ᵀβ} (Proposition 2).

    α = [a0 − γ]₊, β = [b0 + γ]₊ with γ the root of the decreasing piecewise-linear
    ρ(γ) = Σ [a0_i − γ]₊ − Σ [b0_j + γ]₊ (eq. 12). ρ is evaluated at every breakpoint
    (a0_i and c_j = −b0_j) from sorted cumulative sums; the root is then solved exactly on the
    segment where ρ changes sign (eq. 14).
    """
    a0 = np.asarray(a0, dtype=np.float64)
    b0 = np.asarray(b0, dtype=np.float64)
    a_s = np.sort(a0)
    c_s = np.sort(-b0)
    a_suffix = np.r_[np.cumsum(a_s[::-1])[::-1], 0.0]  # a_suffix[k] = Σ a_s[k:]
    c_prefix = np.r_[0.0, np.cumsum(c_s)]  # c_prefix[k] = Σ c_s[:k]
    u = np.unique(np.r_[a_s, c_s])
    ia = np.searchsorted(a_s, u, side="right")  # a_s[ia:] > u
    ic = np.searchsorted(c_s, u, side="left")  # c_s[:ic] < u
    rho = (a_suffix[ia] - (a_s.size - ia) * u) - (ic * u - c_prefix[ic])
    pos = np.flatnonzero(rho > 0.0)
    if pos.size == 0:
        # root at or below the smallest breakpoint: every a0 active, no c active
        gamma = a_s.sum() / a_s.size if a_s.size else 0.0
    else:
        k = pos[-1]  # last breakpoint with ρ > 0; ρ ≤ 0 at u[k+1] (ρ(max u) ≤ 0)
        lo = u[k]
        # between u[k] and the next breakpoint: active a are those > u[k], active c those ≤ u[k]
        ja = np.searchsorted(a_s, lo, side="right")
        jc = np.searchsorted(c_s, lo, side="right")
        n_act = (a_s.size - ja) + jc
        gamma = (a_suffix[ja] + c_prefix[jc]) / n_act
    return np.maximum(a0 - gamma, 0.0), np.maximum(b0 + gamma, 0.0)


def toppush_authors(X, y, lam=1.0, max_iter=10000, tol=1e-4, delta=1e-6, min_iter=10,
                    l_init="code"):
    """The authors' TopPush (``topPush.m``) in numpy; returns (w, info).

    Parameters
    ----------
    X : ndarray or scipy.sparse matrix of shape (N, d)
    y : array-like of shape (N,)
        1 marks a positive, anything else a negative ({0, 1} or {−1, +1}).
    lam, max_iter, tol : the code's ``opt.lambda``, ``opt.maxIter``, ``opt.tol`` (defaults too).
    delta : the code's bound on ‖x' − s‖ below which it stops (1e-6).
    min_iter : the code's guard ``iter >= 10`` before the relative-change test.
    l_init : "code" (L = 1/m, as ``topPush.m``) or "paper" (L = 1/(m + n), Algorithm 1, step 1).
        Only for the benchmark's sensitivity check; everything else is the code either way.

    Returns
    -------
    w : ndarray of shape (d,)
    info : dict with ``n_iter``, ``dual_objective`` (g of eq. 7 at the last iterate),
        ``L`` (final step-size constant), ``stop`` ("tol", "delta" or "max_iter"),
        ``alpha``, ``beta``.
    """
    y = np.asarray(y).ravel()
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64)
    else:
        X = np.asarray(X, dtype=np.float64)
    xpos = X[y == 1]
    xneg = X[y != 1]
    m, n = xpos.shape[0], xneg.shape[0]
    lm = lam * m

    if l_init not in ("code", "paper"):
        raise ValueError(f"l_init is {l_init!r}, expected 'code' or 'paper'")
    big_l = 1.0 / m if l_init == "code" else 1.0 / (m + n)
    a, ap, aap = np.zeros(m), np.zeros(m), np.zeros(m)
    q, qp, qqp = np.zeros(n), np.zeros(n), np.zeros(n)
    t, tp = 1.0, 0.0
    stop = "max_iter"
    fun_prev = np.nan
    v = np.zeros(X.shape[1])
    f_new = 0.0
    n_iter = 0
    for it in range(1, max_iter + 1):
        n_iter = it
        # step 1: search point
        beta = (tp - 1.0) / t
        sa = a + beta * aap
        sq = q + beta * qqp
        # step 2: gradient and value at s, then the line search
        v = xpos.T @ sa - xneg.T @ sq
        gd_a = xpos @ v / lm + sa / 2.0 - 1.0
        gd_q = -(xneg @ v) / lm
        f_s = v @ v / (2.0 * lm) - sa.sum() + sa @ sa / 4.0
        ap, qp = a, q
        hit_delta = False
        while True:
            a, q = project_equal_sums(sa - gd_a / big_l, sq - gd_q / big_l)
            v = xpos.T @ a - xneg.T @ q
            f_new = v @ v / (2.0 * lm) - a.sum() + a @ a / 4.0
            df_a = a - sa
            df_q = q - sq
            r_sum = df_a @ df_a + df_q @ df_q
            if np.sqrt(r_sum) <= delta:
                hit_delta = True
                break
            l_sum = f_new - f_s - gd_a @ df_a - gd_q @ df_q
            if l_sum <= r_sum * big_l * 0.5:
                break
            big_l *= 2.0
        # step 3: momentum and the stopping test
        tp, t = t, (1.0 + np.sqrt(4.0 * t * t + 1.0)) / 2.0
        aap = a - ap
        qqp = q - qp
        fun = f_new / m
        if it >= min_iter and abs(fun - fun_prev) <= abs(fun_prev) * tol:
            stop = "tol"
            break
        if hit_delta:
            stop = "delta"
            break
        fun_prev = fun
    w = v / lm
    info = {"n_iter": n_iter, "dual_objective": float(f_new), "L": float(big_l),
            "stop": stop, "alpha": a, "beta": q}
    return w, info


def primal_objective(X, y, w, lam=1.0):
    """P(w) of eq. 6, truncated quadratic loss: λ/2 ‖w‖² + 1/m Σ_i [1 + max_j s⁻_j − s⁺_i]₊²."""
    y = np.asarray(y).ravel()
    scores = np.asarray(X @ w).ravel()
    top_neg = scores[y != 1].max()
    hinge = np.maximum(1.0 + top_neg - scores[y == 1], 0.0)
    return float(0.5 * lam * (w @ w) + np.mean(hinge * hinge))


class AuthorsTopPush:
    """Estimator wrapper (fit / decision_function / n_iter_) for the benchmark tables."""

    def __init__(self, *, reg=1.0, tol=1e-4, max_iter=10000, l_init="code"):
        self.reg = reg
        self.tol = tol
        self.max_iter = max_iter
        self.l_init = l_init

    def fit(self, X, y):
        self.coef_, self.info_ = toppush_authors(X, y, lam=self.reg, max_iter=self.max_iter,
                                                 tol=self.tol, l_init=self.l_init)
        self.n_iter_ = self.info_["n_iter"]
        self.dual_objective_ = self.info_["dual_objective"]
        return self

    def decision_function(self, X):
        return np.asarray(X @ self.coef_).ravel()
