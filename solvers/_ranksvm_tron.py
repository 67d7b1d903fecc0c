"""Trust-region Newton (TRON) for the l-variable kernel RankSVM problem, state in, result out.

Kuo, Lee, Lin, "Large-scale Kernel RankSVM" (SDM 2014), section 3 and Appendix B; TRON as in
LIBLINEAR (Lin, Weng, Keerthi, JMLR 2008; Lin and Moré 1999), section 4.1 of the paper.

Problem. With f = Qβ the scores of the l training rows (Q_ij = K(x_i, x_j)), P the preference
pairs and z_ij = 1 − f_i + f_j their margins (see :mod:`solvers._ranksvm_kernels`):

    min_β  F(β) = ½ βᵀQβ + C Σ_{(i,j)∈P} ℓ(z_ij)

    ℓ(z) = max(0, z)²                                 loss="squared_hinge": the paper's (3.13)
    ℓ(z) = 0, z²/(2μ), z − μ/2  for z ≤ 0, 0 < z ≤ μ, z > μ
                                                      loss="hinge": (3.12) smoothed (Huber)

The smoothed hinge differs from max(0, z) by at most μ/2 per pair, so its optimum is within
C·|P|·μ/2 of (3.12)'s; it is solved for μ = 1, 0.1, 0.01 in turn, each stage started from the
last (a smoothing continuation; no sub-gradient method is used).

Gradient (B.2) and generalized Hessian (B.3). With ∇L(f) the gradient of Σ_P ℓ(z_ij) in f,

    ∇L(f)_k = −Σ_{j:(k,j)∈P} ℓ'(z_kj) + Σ_{i:(i,k)∈P} ℓ'(z_ik)
    ∇F(β)   = Q ρ,   ρ = β + C ∇L(Qβ)
    ∇²F(β)  = Q + C Q A_Bᵀ W A_B Q

where A_B holds the rows (e_i − e_j)ᵀ of the pairs in the curved band of ℓ (z > 0 for the
squared hinge, W = 2; 0 < z ≤ μ for the smoothed hinge, W = 1/μ). (A_BᵀA_B u)_k = (l⁺_k + l⁻_k)
u_k − (γ⁺_k + γ⁻_k): counts and sums over pairs from one sort per query, never a loop over P
(:func:`solvers._ranksvm_kernels.pair_sums`). Every quantity above is a pair sum of this kind.

TRON with the preconditioner M = Q. The trust region is ‖s‖_Q = sqrt(sᵀQs) ≤ Δ and the
conjugate-gradient (CG) steps are preconditioned by M = Q: the residual of the Newton system
∇²F s = −∇F is always Q t for a known t (t = −ρ − (I + C W A_BᵀA_B Q) s), so M⁻¹ applied to it
is free. This is TRON applied to the problem in w = Σ β_i φ(x_i) (the primal (3.11) in the
kernel's feature space, where ½‖w‖² has identity Hessian), and it needs one product with Q per
CG step and one per accepted step (the paper's form needs two per CG step, plus one for each
function value). The same code runs in an explicit feature space (f = Z w, Nyström), see
:mod:`solvers._gram`.

    Δ₀ = ‖∇F(β₀)‖_{Q⁻¹} = sqrt(ρᵀQρ)
    repeat: s ≈ argmin_{‖s‖_Q ≤ Δ} ∇Fᵀs + ½ sᵀ∇²F s by CG (Steihaug), stopped when the
            preconditioned residual is below eps_cg = 0.1 times its start or at the boundary;
            accept β + s if F drops by more than η₀ = 1e-4 of the predicted drop; update Δ
            with LIBLINEAR's rules (σ = 0.25, 0.5, 4; η = 1e-4, 0.25, 0.75)

Stopping rule (LIBLINEAR's): ‖∇F(β)‖_{Q⁻¹} ≤ tol · ‖∇F(0)‖_{Q⁻¹}, i.e. the norm of the gradient
of the primal in w, sqrt(ρᵀQρ), relative to its value at β = 0 (w = 0). The reference is at
β = 0 whatever the starting point, so a warm start stops at the same accuracy as a cold one
(and at once when it already meets it). Also stops, unconverged, after ``max_iter``
trust-region iterations, or when the predicted and actual decreases fall below 1e-12·|F|
(float32 round-off of Q).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers import _ranksvm_kernels as _k

SQUARED_HINGE = "squared_hinge"
HINGE = "hinge"
HINGE_SMOOTHING = (1.0, 0.1, 0.01)  # μ of the continuation for loss="hinge"

# LIBLINEAR's TRON constants
_ETA0, _ETA1, _ETA2 = 1e-4, 0.25, 0.75
_SIGMA1, _SIGMA2, _SIGMA3 = 0.25, 0.5, 4.0
_EPS_CG = 0.1


class PairLoss:
    """Σ_{(i,j)∈P} ℓ(z_ij) as a function of the scores f, from pair sums.

    ``mu=None``: the squared hinge max(0, z)²; otherwise the smoothed hinge of width ``mu``.
    ``qptr``/``level``: the layout of :mod:`solvers._ranksvm_kernels`. The sums run on
    ``n_threads`` threads from ``PARALLEL_ROWS`` rows on (below, one thread is faster).
    """

    PARALLEL_ROWS = 100_000

    def __init__(self, qptr, level, mu=None, n_threads=1):
        self.qptr = np.ascontiguousarray(qptr, dtype=np.int64)
        self.level = np.ascontiguousarray(level, dtype=np.int64)
        self.n = self.level.shape[0]
        self.mu = mu
        self.n_threads = n_threads
        self.n_chunks = 0
        if n_threads > 1 and self.n >= self.PARALLEL_ROWS:
            self.n_chunks = min(4 * n_threads, self.qptr.shape[0] - 1)

    def _sort(self, f):
        order = np.empty(self.n, dtype=np.int64)
        if self.n_chunks:
            _k.argsort_segments_parallel(f, self.qptr, order, self.n_chunks)
        else:
            _k.argsort_segments(f, self.qptr, order)
        return order

    def _sums(self, f, order, tau_lo, tau_hi, U):
        U = np.ascontiguousarray(U, dtype=np.float64)
        n, m = U.shape
        cnt_lo, cnt_hi = np.empty(n), np.empty(n)
        sum_lo, sum_hi = np.empty((n, m)), np.empty((n, m))
        args = (f, order, self.qptr, self.level, float(tau_lo), float(tau_hi), U, cnt_lo,
                sum_lo, cnt_hi, sum_hi)
        if self.n_chunks:
            _k.pair_sums_parallel(*args, self.n_chunks)
        else:
            _k.pair_sums(*args)
        return cnt_lo, sum_lo, cnt_hi, sum_hi

    def evaluate(self, f):
        """``(value, grad, state)``: Σ_P ℓ(z), its gradient in f and what :meth:`hess_apply`
        needs at f. ``state["dsum"]`` is Σ_P ℓ'(z)."""
        order = self._sort(f)
        a = 1.0 - f
        if self.mu is None:
            U = np.column_stack([f, f * f])
            n_lo, s_lo, n_hi, s_hi = self._sums(f, order, 0.0, np.inf, U)
            value = float(np.sum(n_lo * a * a + 2.0 * a * s_lo[:, 0] + s_lo[:, 1]))
            lo_d = n_lo * a + s_lo[:, 0]              # Σ over (k, j) of z_kj
            hi_d = n_hi * (1.0 + f) - s_hi[:, 0]      # Σ over (i, k) of z_ik
            grad = 2.0 * (hi_d - lo_d)
            state = {"order": order, "band": (0.0, np.inf), "weight": 2.0,
                     "count": n_lo + n_hi, "dsum": 2.0 * float(lo_d.sum()),
                     "n_active": float(n_lo.sum())}
            return value, grad, state
        mu = self.mu
        U = np.column_stack([f, f * f])
        nb_lo, sb_lo, nb_hi, sb_hi = self._sums(f, order, 0.0, mu, U)
        nB_lo, sB_lo, nB_hi, sB_hi = self._sums(f, order, mu, np.inf, U[:, :1])
        band_sq = nb_lo * a * a + 2.0 * a * sb_lo[:, 0] + sb_lo[:, 1]
        beyond = nB_lo * a + sB_lo[:, 0]
        value = float(np.sum(band_sq) / (2.0 * mu) + np.sum(beyond) - 0.5 * mu * nB_lo.sum())
        lo_d = (nb_lo * a + sb_lo[:, 0]) / mu + nB_lo
        hi_d = (nb_hi * (1.0 + f) - sb_hi[:, 0]) / mu + nB_hi
        grad = hi_d - lo_d
        state = {"order": order, "band": (0.0, mu), "weight": 1.0 / mu,
                 "count": nb_lo + nb_hi, "dsum": float(lo_d.sum()),
                 "n_active": float((nb_lo + nB_lo).sum())}
        return value, grad, state

    def hess_apply(self, state, f, u):
        """W (A_Bᵀ A_B u) at the point of ``state`` (the generalized Hessian of Σ_P ℓ in f)."""
        tau_lo, tau_hi = state["band"]
        _, s_lo, _, s_hi = self._sums(f, state["order"], tau_lo, tau_hi, u[:, None])
        return state["weight"] * (state["count"] * u - s_lo[:, 0] - s_hi[:, 0])

    def violations(self, f):
        """``(u, n_sv)``: u = A_SVᵀ e, i.e. u_k = l⁻_k − l⁺_k (pairs with z > 0 where k is the
        preferred / the other end), and n_sv = |{(i, j) ∈ P : z_ij > 0}|."""
        order = self._sort(f)
        n_lo, _, n_hi, _ = self._sums(f, order, 0.0, np.inf, np.zeros((self.n, 0)))
        return n_lo - n_hi, float(n_lo.sum())


@dataclass
class TronResult:
    """What :func:`tron` returns: the solution and how it got there."""

    theta: np.ndarray     # coordinates of w (β, or w itself in a FeatureSpace)
    f: np.ndarray         # scores Φ w at the training rows
    objective: float      # F at theta
    n_iter: int           # trust-region iterations (accepted or not)
    n_cg: int             # CG steps in all
    converged: bool       # the stopping rule held
    grad_norm: float      # ‖∇F‖ in the space's norm at theta
    grad_norm0: float     # the same at theta = 0
    message: str          # why it stopped


def tron(space, loss: PairLoss, C: float, theta0=None, *, tol=1e-3, max_iter=100,
         eps_cg=_EPS_CG, max_cg=None, verbose=False) -> TronResult:
    """Minimise F(θ) = ½‖w(θ)‖² + C Σ_P ℓ(1 − f_i + f_j), f = Φθ, from ``theta0``.

    In a KernelSpace this is (3.13) (or the smoothed (3.12)) over β: F(β) = ½βᵀQβ +
    C Σ_P ℓ(1 − (Qβ)_i + (Qβ)_j), gradient Qρ with ρ = β + C ∇L(Qβ), generalized Hessian
    Q + C Q A_BᵀW A_B Q (B.3); in a FeatureSpace the same over w ∈ R^m with f = Z w. TRON
    (LIBLINEAR's rules, preconditioner M = Q) as in the module docstring.

    Stopping rule: ‖∇F(θ)‖ ≤ ``tol`` · ‖∇F(0)‖ in the space's dual norm (sqrt(ρᵀQρ) for β),
    the reference taken at θ = 0 whatever ``theta0`` is; or ``max_iter`` trust-region
    iterations; or round-off (predicted and actual decrease below 1e-12·|F|).

    ``space`` is a :class:`solvers._gram.KernelSpace` or ``FeatureSpace``; ``loss`` a
    :class:`PairLoss`. ``theta0=None`` starts at 0. The norm at 0 costs one product with Q,
    shared with the first gradient when cold and with Qθ₀ or Qρ₀ when warm.
    """
    n = space.dim
    l_rows = loss.n
    max_cg = max(n, 5) if max_cg is None else max_cg

    zero_f = np.zeros(l_rows)
    L0, dL0, state0 = loss.evaluate(zero_f)
    g0 = space.adjoint(C * dL0)
    Rg0 = None

    cold = theta0 is None or not np.any(theta0)
    if cold:
        Rg0 = space.riesz(g0)
        theta = np.zeros(n)
        Rtheta = np.zeros(n)
        f = zero_f
        L, dL, state = L0, dL0, state0
        gr, Rgr = g0, Rg0
    else:
        # Qθ₀, Qρ₀ and Q∇F(0) in one pass over Q when Qθ₀ is known (a refit of the same model),
        # else in two
        theta = np.array(theta0, dtype=np.float64)
        Rtheta = space.known_riesz(theta)
        if Rtheta is None:
            Rg0, Rtheta = space.riesz(np.stack([g0, theta]))
        f = space.forward(theta, Rtheta)
        L, dL, state = loss.evaluate(f)
        gr = theta + space.adjoint(C * dL)
        if Rg0 is None:
            Rg0, Rgr = space.riesz(np.stack([g0, gr]))
        else:
            Rgr = space.riesz(gr)
    F = 0.5 * float(theta @ Rtheta) + C * L
    gnorm0 = float(np.sqrt(max(g0 @ Rg0, 0.0)))
    gnorm = float(np.sqrt(max(gr @ Rgr, 0.0)))
    if verbose:
        print(f"tron: |g0| {gnorm0:.4e}  start F {F:.6e} |g| {gnorm:.4e}")
    if gnorm <= tol * gnorm0:
        return TronResult(theta, f, F, 0, 0, True, gnorm, gnorm0, "gradient norm below tol")

    delta = gnorm
    it = 0
    n_cg = 0
    converged = False
    message = f"reached max_iter={max_iter}"
    delta_adjusted = False
    while it < max_iter:
        it += 1
        s, Rs, Fs, r, Rr, cg_iter, boundary = _trcg(space, loss, state, f, C, gr, Rgr, delta,
                                                    eps_cg, max_cg)
        n_cg += cg_iter
        theta_new = theta + s
        Rtheta_new = Rtheta + Rs
        f_new = f + Fs
        L_new, dL_new, state_new = loss.evaluate(f_new)
        F_new = 0.5 * float(theta_new @ Rtheta_new) + C * L_new
        gs = float(gr @ Rs)
        prered = -0.5 * (gs - float(r @ Rs))
        actred = F - F_new
        snorm = float(np.sqrt(max(s @ Rs, 0.0)))
        if not delta_adjusted:
            delta = min(delta, snorm)
            delta_adjusted = True
        if F_new - F - gs <= 0:
            alpha = _SIGMA3
        else:
            alpha = max(_SIGMA1, -0.5 * (gs / (F_new - F - gs)))
        if actred < _ETA0 * prered:
            delta = min(alpha * snorm, _SIGMA2 * delta)
        elif actred < _ETA1 * prered:
            delta = max(_SIGMA1 * delta, min(alpha * snorm, _SIGMA2 * delta))
        elif actred < _ETA2 * prered:
            delta = max(_SIGMA1 * delta, min(alpha * snorm, _SIGMA3 * delta))
        elif boundary:
            delta = _SIGMA3 * delta
        else:
            delta = max(delta, min(alpha * snorm, _SIGMA3 * delta))
        if verbose:
            print(f"tron: iter {it:3d} act {actred:.3e} pre {prered:.3e} delta {delta:.3e} "
                  f"F {F:.6e} |g| {gnorm:.3e} CG {cg_iter:3d}")
        if actred > _ETA0 * prered:
            gr = theta_new + space.adjoint(C * dL_new)
            gnorm = _gradient_norm_from_residual(space, loss, state, f, Fs, dL, dL_new, r, Rr, C)
            if gnorm is None or gnorm > tol * gnorm0:
                Rgr = space.riesz(gr)
                gnorm = float(np.sqrt(max(gr @ Rgr, 0.0)))
            theta, Rtheta, f, F = theta_new, Rtheta_new, f_new, F_new
            state, dL = state_new, dL_new
            if gnorm <= tol * gnorm0:
                converged = True
                message = "gradient norm below tol"
                break
        if prered <= 0:
            message = "predicted decrease <= 0 (float32 round-off of Q)"
            break
        if abs(actred) <= 1e-12 * abs(F) and abs(prered) <= 1e-12 * abs(F):
            message = "actual and predicted decrease below 1e-12 |F| (round-off)"
            break
    return TronResult(theta, f, F, it, n_cg, converged, gnorm, gnorm0, message)


_MAX_CHANGED_ROWS = 2000


def _gradient_norm_from_residual(space, loss, state, f, Fs, dL, dL_new, r, Rr, C):
    """‖∇F‖ after an accepted step s without a product with Q, or None where it would cost more.

    Both losses are piecewise quadratic in f, so ∇L(f + Φs) = ∇L(f) + W A_BᵀA_B Φs + Δ, where
    Δ is nonzero only at the rows of pairs that crossed into or out of the band B. CG's residual
    is r = −(ρ + H s) with the Hessian at f, so the new ρ is −r + C Φ*Δ and (KernelSpace)

        ‖∇F‖² = rᵀQr − 2C Δᵀ(Q r) + C² Δᵀ Q Δ

    with Q r known from CG and ΔᵀQΔ from the |Δ|² kernel entries of the changed rows (a refit
    after a few new judgments ends with a step that moves few pairs). Used only to confirm
    convergence: when the test fails, the caller computes the norm with a product."""
    if not hasattr(space, "sparse_quadratic"):
        return None
    change = dL_new - dL - loss.hess_apply(state, f, Fs)
    scale = float(np.abs(dL_new).max(initial=0.0))
    idx = np.flatnonzero(np.abs(change) > 1e-12 * scale)
    if idx.size > _MAX_CHANGED_ROWS:
        return None
    u = C * change[idx]
    value = float(r @ Rr) - 2.0 * float(u @ Rr[idx]) + space.sparse_quadratic(idx, u)
    return float(np.sqrt(max(value, 0.0)))


def _trcg(space, loss, state, f, C, gr, Rgr, delta, eps_cg, max_cg):
    """Steihaug CG for min_s ⟨g, s⟩ + ½⟨s, H s⟩ in H-norm ‖s‖ ≤ Δ (LIBLINEAR's trpcg with
    the preconditioner M = Q, written in the space's coordinates).

    H = I + Φ* C W A_BᵀA_B Φ. Vectors are kept with their Riesz images (x, R x) so that every
    inner product ⟨x, y⟩ = (R x)ᵀ y costs no product with Q; one product (R of H d) per step.
    Returns s, R s, Φ s, the residual r and R r, the number of steps, and whether the step
    ended on the boundary.
    """
    n = space.dim
    s = np.zeros(n)
    Rs = np.zeros(n)
    Fs = np.zeros(loss.n)
    r = -gr
    Rr = -Rgr
    d = r.copy()
    Rd = Rr.copy()
    Fd = space.forward(d, Rd)
    rr = float(r @ Rr)
    cgtol = eps_cg * np.sqrt(max(rr, 0.0))
    it = 0
    boundary = False
    while it < max_cg:
        if np.sqrt(max(rr, 0.0)) <= cgtol:
            break
        it += 1
        Hd = d + space.adjoint(C * loss.hess_apply(state, f, Fd))
        RHd = space.riesz(Hd)
        dHd = float(d @ RHd)
        if dHd <= 1e-300:
            break
        alpha = rr / dHd
        s_new = s + alpha * d
        Rs_new = Rs + alpha * Rd
        if float(s_new @ Rs_new) > delta * delta:
            boundary = True
            std = float(s @ Rd)
            sts = float(s @ Rs)
            dtd = float(d @ Rd)
            dsq = delta * delta
            rad = np.sqrt(max(std * std + dtd * (dsq - sts), 0.0))
            if std >= 0:
                alpha = (dsq - sts) / (std + rad) if std + rad > 0 else 0.0
            else:
                alpha = (rad - std) / dtd
            s += alpha * d
            Rs += alpha * Rd
            Fs += alpha * Fd
            r -= alpha * Hd
            Rr -= alpha * RHd
            break
        s, Rs = s_new, Rs_new
        Fs += alpha * Fd
        r -= alpha * Hd
        Rr -= alpha * RHd
        rr_new = float(r @ Rr)
        beta = rr_new / rr
        rr = rr_new
        d = r + beta * d
        Rd = Rr + beta * Rd
        Fd = space.forward(d, Rd)
    return s, Rs, Fs, r, Rr, it, boundary
