"""Frank-Wolfe (conditional gradient) on the pairwise RankSVM dual, state in, result out.

E. Bach, "ROSVM package - mathematical background" (2020), eqs. (2)-(5), Algorithm 1 with the
exact line search, and Jaggi (ICML 2013) for the duality gap.

Problem: the dual of the L1-loss RankSVM (1.2) over one variable per preference pair,

    max_α  g(α) = 1ᵀα − ½ αᵀ A Q Aᵀ α     s.t.  0 ≤ α_ij ≤ C  for (i, j) ∈ P          (2)

with A the p × l matrix whose row (i, j) is (e_i − e_j)ᵀ. The primal solution is
w = Σ_P α_ij (φ(x_i) − φ(x_j)), i.e. β = Aᵀα in the l-variable form.

Algorithm (Algorithm 1). At α with scores f = Q Aᵀα, the gradient is d = 1 − A f,
d_ij = 1 − f_i + f_j = z_ij, the margin; the linear sub-problem (3) is solved by the vertex
s_ij = C if z_ij > 0 else 0; the exact line search (5) is

    γ = ⟨∇g(α), s − α⟩ / ((s − α)ᵀ A Q Aᵀ (s − α)),  clipped to [0, 1]

and α ← α + γ (s − α). None of this needs the p pairs: with β = Aᵀα (the iterate in
l-space), Aᵀs = C (l⁻ − l⁺) at f (the pair counts of :mod:`solvers._ranksvm_kernels`),
1ᵀs = C |{z > 0}|, and with δ = Aᵀs − β

    ⟨∇g(α), s − α⟩ = 1ᵀs − 1ᵀα − δᵀ f,       (s − α)ᵀ A Q Aᵀ (s − α) = δᵀ Q δ

so an iteration is one sort per query, one product Q δ and O(l) work; β, f and the scalar 1ᵀα
are updated (f is recomputed as Qβ every 50 iterations against float32 drift). The same code
runs in a Nyström feature space (w ∈ R^m, Φ = Z), through the space object of
:mod:`solvers._gram`.

Stopping rule: the duality gap h(α) = ⟨∇g(α), s − α⟩ = P(w) − g(α) (an upper bound on the
sub-optimality of both the primal and the dual) relative to its value at α = 0,
h(0) = C|P| = P(0): stop when h(α) ≤ tol · C|P| (ROSVM's relative gap h(α_k)/h(α_0) with α_0
fixed at 0, so that a warm start is held to the same rule as a cold one).

Warm start: α₀_ij = C · clip(z_ij/μ, 0, 1) at the scores f of the previous solution (μ = 0.1),
a feasible dual whose β₀ = Aᵀα₀ and 1ᵀα₀ are pair sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers._ranksvm_tron import PairLoss

WARM_RAMP = 0.1        # μ of the warm-start ramp
REFRESH_EVERY = 50     # recompute f = Φθ this often


@dataclass
class FrankWolfeResult:
    """What :func:`frank_wolfe` returns."""

    theta: np.ndarray     # β = Aᵀα (or w = Zᵀ Aᵀα in a FeatureSpace)
    f: np.ndarray         # scores at the training rows
    dual_objective: float
    gap: float            # duality gap h(α) at the last iterate
    gap0: float           # C |P|
    n_iter: int
    converged: bool


def frank_wolfe(space, pairs: PairLoss, C: float, n_pairs: int, f_warm=None, *, tol=1e-3,
                max_iter=1000, verbose=False) -> FrankWolfeResult:
    """Maximise the dual (2), g(α) = 1ᵀα − ½ αᵀAQAᵀα over 0 ≤ α ≤ C, by conditional
    gradient with the exact line search (5), in l-space (module docstring).

    Stopping rule: duality gap h(α) = P(w) − g(α) ≤ ``tol`` · C|P| (= tol · h(0)), or
    ``max_iter`` iterations.

    ``pairs`` gives the pair counts (any :class:`PairLoss` on the training layout);
    ``f_warm`` the scores of a previous solution at the training rows (``None``: α₀ = 0).
    """
    n = space.dim
    gap0 = C * float(n_pairs)
    if f_warm is None or not np.any(f_warm):
        theta = np.zeros(n)
        Rtheta = np.zeros(n)
        f = np.zeros(pairs.n)
        sum_alpha = 0.0
    else:
        ramp = PairLoss(pairs.qptr, pairs.level, mu=WARM_RAMP, n_threads=pairs.n_threads)
        _, grad, state = ramp.evaluate(np.asarray(f_warm, dtype=np.float64))
        # α₀ = C ℓ'_μ(z): Aᵀα₀ = −C ∇L_μ(f), 1ᵀα₀ = C Σ ℓ'_μ(z)
        theta = space.adjoint(-C * grad)
        Rtheta = space.riesz(theta)
        f = space.forward(theta, Rtheta)
        sum_alpha = C * state["dsum"]
    gap = np.inf
    converged = False
    it = 0
    while True:
        u, n_sv = pairs.violations(f)
        delta = space.adjoint(C * u) - theta
        gap = C * n_sv - sum_alpha - float(delta @ Rtheta)
        if verbose and (it % 50 == 0):
            dual = sum_alpha - 0.5 * float(theta @ Rtheta)
            print(f"frank_wolfe: iter {it:5d} dual {dual:.6e} gap/C|P| {gap / gap0:.3e}")
        if gap <= tol * gap0:
            converged = True
            break
        if it >= max_iter:
            break
        it += 1
        Rdelta = space.riesz(delta)
        curvature = float(delta @ Rdelta)
        gamma = 1.0 if curvature <= 0 else min(max(gap / curvature, 0.0), 1.0)
        theta = theta + gamma * delta
        Rtheta = Rtheta + gamma * Rdelta
        sum_alpha = (1.0 - gamma) * sum_alpha + gamma * C * n_sv
        if it % REFRESH_EVERY == 0:
            Rtheta = space.riesz(theta)
            f = space.forward(theta, Rtheta)
        else:
            f = f + gamma * space.forward(delta, Rdelta)
    dual = sum_alpha - 0.5 * float(theta @ Rtheta)
    return FrankWolfeResult(theta, f, dual, float(gap), gap0, it, converged)
