"""Kernel matrices for kernel RankSVM: blocks computed with BLAS, the training matrix Q kept as
a float32 packed triangle under a memory limit, and the two "spaces" the solvers work in.

Kernels (``KernelSpec``), for rows a, b:

    rbf      K(a, b) = exp(−γ ‖a − b‖²)            from ‖a‖², ‖b‖² and the block A Bᵀ
    linear   K(a, b) = aᵀb
    poly     K(a, b) = (γ aᵀb + coef0)^degree

Q = K(X, X) (:class:`GramMatrix`). Row i of its lower triangle (entries 0..i) is stored
row-major packed in float32, for the first ``n_cached`` rows that fit in ``cache_bytes``
(n(n+1)/2 · 4 bytes for n rows, half of the full matrix). A product Q v is then one pass
over the cached triangle (:func:`solvers._ranksvm_kernels.packed_symv`: it reads each stored
entry once, uses it for both Q_ij v_j and Q_ji v_i, splits the rows among the numba threads and
serves several vectors in the same pass) plus, for the rows that did not fit, their
lower-triangle blocks recomputed by ``sgemm`` and the in-place kernel transform, each block used
once as it is and once transposed. So with a cache of c rows a product recomputes (l² − c²)/2
kernel entries and a full cache recomputes none. For ``kernel="linear"`` with fewer features
than rows, Q v = X (Xᵀ v) and Q is never formed.

Spaces (what the TRON and Frank-Wolfe drivers need from the problem's geometry). The solvers
minimise over a function w in a Hilbert space H with scores f = Φ w at the l training rows:

    KernelSpace   w = Σ β_i φ(x_i), coordinates β ∈ R^l:  f = Qβ, ⟨a, b⟩_H = aᵀQb, Φ*u = u
    FeatureSpace  w ∈ R^m with explicit features Z (l × m):  f = Z w, ⟨a, b⟩ = aᵀb, Φ*u = Zᵀu

``riesz(x)`` is the vector R x with ⟨x, y⟩_H = (R x)ᵀ y (Q x, or x), ``known_riesz(x)`` the same
where it costs no full product (else None), ``forward(x, Rx)`` the scores Φ x (for KernelSpace
they are R x, already known) and ``adjoint(u)`` Φ* u.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numba
import numpy as np
from threadpoolctl import ThreadpoolController

from solvers import _ranksvm_kernels as _k
from solvers._base import positions_by_id

KERNELS = ("rbf", "linear", "poly")

# rows per block of Q: about this many bytes of float32 block, at least _MIN_BLOCK_ROWS rows
_BLOCK_BYTES = 32 * 2**20
_MIN_BLOCK_ROWS = 256


# GramMatrix.grown builds afresh past this many appended blocks, or when more than this share
# of the slots belongs to rows no longer in the data (their products are wasted work)
_MAX_GROWN_BLOCKS = 8
_MAX_DEAD_SHARE = 0.1

_CONTROLLER = None


def blas_limit(n_threads: int):
    """Context in which BLAS uses at most ``n_threads`` threads (about 20 µs to enter).

    BLAS products with blocks of Q or with Z (level 2) run on one thread: they are bound by
    memory bandwidth, and OpenBLAS's threaded gemv is 10-20x slower than one thread when the
    machine's cores are busy with other processes. Blocks of Q (level 3, ``sgemm``) use
    ``n_threads``."""
    global _CONTROLLER
    if _CONTROLLER is None:
        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=max(1, int(n_threads)), user_api="blas")


@dataclass(frozen=True)
class KernelSpec:
    """A kernel function: ``kernel`` in {"rbf", "linear", "poly"} and its parameters."""

    kernel: str
    gamma: float
    degree: int
    coef0: float


def row_norms(X: np.ndarray) -> np.ndarray:
    """‖x_i‖² in float64, returned in X's dtype."""
    X64 = np.asarray(X, dtype=np.float64)
    return np.einsum("ij,ij->i", X64, X64).astype(X.dtype)


def kernel_block(A, B, sq_a, sq_b, spec: KernelSpec) -> np.ndarray:
    """K(A, B) as a new array in A's dtype (float32: training blocks; float64: predictions).

    ``sq_a``, ``sq_b`` are the squared row norms (used by the RBF kernel only)."""
    G = A @ B.T
    if spec.kernel == "rbf":
        if G.dtype == np.float32:
            _k.rbf_from_dot_f32(G, sq_a, sq_b, np.float32(spec.gamma))
        else:
            _k.rbf_from_dot(G, sq_a, sq_b, float(spec.gamma))
    elif spec.kernel == "poly":
        _k.poly_from_dot(G, float(spec.gamma), float(spec.coef0), int(spec.degree))
    return G


_SERIAL_ENTRIES = 1 << 20
"""Kernel blocks up to this many entries (a request's 100 candidates x 2,000 support vectors)
are computed on one thread with numpy: starting and synchronising BLAS and numba threads costs
more than the work, 10-15x more when the machine's cores are busy."""


def _kernel_small(G, sq_a, sq_b, spec: KernelSpec) -> np.ndarray:
    """:func:`kernel_block`'s map from G = A Bᵀ to K(A, B), serial, in numpy."""
    if spec.kernel == "rbf":
        # in place: fresh temporaries of this size cost page faults
        G *= -2.0
        G += sq_a[:, None]
        G += sq_b
        np.maximum(G, 0.0, out=G)
        G *= -spec.gamma
        return np.exp(G, out=G)
    if spec.kernel == "poly":
        return (spec.gamma * G + spec.coef0) ** spec.degree
    return G


_RBF_FACTORED_EXPONENT = 600.0


def _rbf_dot_factored(X, S, coef, gamma, sq_x, sq_s) -> np.ndarray:
    """Σ_s c_s exp(−γ‖x − s‖²) = exp(−γ‖x‖²) Σ_s (c_s exp(−γ‖s‖²)) exp(2γ xᵀs): two passes
    over the |X| x |S| block (scale, exp) instead of :func:`_kernel_small`'s six, then a product.
    Exact in real arithmetic; in float64 every exponent stays within ±600 (no overflow, and a
    term that underflows is below 1e-260 in the direct form too) when γ(max‖x‖² + max‖s‖²) ≤
    600, since 2γ|xᵀs| ≤ γ(‖x‖² + ‖s‖²): the caller checks."""
    G = X @ S.T
    G *= 2.0 * gamma
    np.exp(G, out=G)
    return np.exp(-gamma * sq_x) * (G @ (coef * np.exp(-gamma * sq_s)))


def kernel_dot(X, S, coef, spec: KernelSpec, sq_x=None, sq_s=None) -> np.ndarray:
    """Σ_s coef_s K(x, S_s) for every row x of X, in float64, by blocks of X's rows."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    S = np.ascontiguousarray(S, dtype=np.float64)
    coef = np.asarray(coef, dtype=np.float64)
    out = np.zeros(X.shape[0])
    if S.shape[0] == 0 or X.shape[0] == 0:
        return out
    if spec.kernel == "linear":
        with blas_limit(1):
            return X @ (S.T @ coef)
    sq_x = row_norms(X) if sq_x is None else sq_x
    sq_s = row_norms(S) if sq_s is None else sq_s
    if X.shape[0] * S.shape[0] <= _SERIAL_ENTRIES:
        with blas_limit(1):
            if spec.kernel == "rbf" and \
                    spec.gamma * (sq_x.max() + sq_s.max()) <= _RBF_FACTORED_EXPONENT:
                return _rbf_dot_factored(X, S, coef, spec.gamma, sq_x, sq_s)
            return _kernel_small(X @ S.T, sq_x, sq_s, spec) @ coef
    rows = max(64, _BLOCK_BYTES // (8 * max(1, S.shape[0])))
    for a in range(0, X.shape[0], rows):
        b = min(a + rows, X.shape[0])
        block = kernel_block(X[a:b], S, sq_x[a:b], sq_s, spec)
        with blas_limit(1):
            out[a:b] = block @ coef
    return out


def packed_rows_fitting(cache_bytes: float, n_rows: int) -> int:
    """Largest c ≤ n_rows whose packed float32 triangle, c(c+1)/2 · 4 bytes, fits."""
    c = int((np.sqrt(1.0 + 2.0 * max(cache_bytes, 0.0)) - 1.0) / 2.0)  # c(c+1)/2*4 <= bytes
    while c > 0 and c * (c + 1) * 2 > cache_bytes:
        c -= 1
    while c < n_rows and (c + 1) * (c + 2) * 2 <= cache_bytes:
        c += 1
    return min(c, n_rows)


class GramMatrix:
    """Q = K(X, X) as a symmetric operator (see the module docstring for the storage).

    Rows of the problem live in storage slots: a fresh matrix puts row r in slot r; one made
    by :meth:`grown` keeps the slots of the previous rows and appends new ones, so ``slot``
    maps rows to slots (vectors are scattered to slots and gathered back, O(l) per product).
    Slots past the packed triangle are row blocks ``(a, b, K(X[a:b], X[:b]) or None)``:
    stored, or recomputed at every product when the memory limit left no room.

    Parameters
    ----------
    X : ndarray (l, n)
        Training rows (any float dtype; kept as float32 for Q).
    spec : KernelSpec
    cache_bytes : float
        Memory allowed for the stored entries of Q.
    n_threads : int
        BLAS threads for the blocks of Q recomputed at each product (the stored triangle is
        built, and multiplied, with one).
    ids : ndarray (l,), optional
        Instance ids of the rows: what :meth:`grown` matches a later data set by.

    Attributes
    ----------
    n_cached : int
        Rows of Q whose entries are stored (l when all of Q fits).
    nbytes : int
        Bytes of the stored entries.
    n_products : int
        Products computed so far (:meth:`matvec` calls).
    n_reused : int
        Rows whose stored entries came from a previous matrix (0 for a fresh one).
    known : tuple or None
        A vector and its product (v, Q v) by slot, kept by :meth:`remember` so that a grown
        matrix can give Q v' for a v' that differs from v in few rows without a full product
        (:meth:`product_from_known`).
    """

    def __init__(self, X, spec: KernelSpec, cache_bytes: float, n_threads: int = 1, ids=None):
        self.spec = spec
        self.n_threads = n_threads
        self.cache_bytes = float(cache_bytes)
        self.n = X.shape[0]
        self.ids = None if ids is None else np.asarray(ids)
        self.slot = None
        self.n_products = 0
        self.n_reused = 0
        self.n_grown = 0  # blocks appended by grown()
        self.blocks = []
        self.known = None  # (v, Q v) by slot, from remember()
        self.cuts = {}  # thread count -> packed_row_cuts of the stored triangle
        self.factored = spec.kernel == "linear" and X.shape[1] < X.shape[0] // 2
        if self.factored:
            self.X = np.ascontiguousarray(X, dtype=np.float64)
            self.n_cached = self.n_packed = self.n
            self.packed = np.zeros(0, np.float32)
            self.nbytes = 0
            return
        self.X = np.ascontiguousarray(X, dtype=np.float32)
        self.sq = row_norms(self.X)
        self.n_packed = self.n_cached = packed_rows_fitting(cache_bytes, self.n)
        c = self.n_packed
        self.packed = np.empty(c * (c + 1) // 2, dtype=np.float32)
        self.nbytes = self.packed.nbytes
        # the stored rows: sgemm on one thread, then the parallel numba transform (on MQ2008,
        # l = 7,900, this pair took 0.17-0.21 s against 0.26-0.64 s with two BLAS threads,
        # whose idle spinning slows the numba threads that follow)
        rows = self._block_rows()
        for a in range(0, c, rows):
            b = min(a + rows, c)
            if spec.kernel == "rbf":  # transform and pack in one pass
                with blas_limit(1):
                    dots = self.X[a:b] @ self.X[:b].T
                _k.rbf_pack_lower_f32(dots, self.sq[a:b], self.sq[:b], np.float32(spec.gamma),
                                      a, self.packed)
            else:
                with blas_limit(1):
                    block = kernel_block(self.X[a:b], self.X[:b], self.sq[a:b], self.sq[:b],
                                         spec)
                _k.pack_lower_rows(block, a, self.packed)
        self.blocks = [(a, min(a + rows, self.n), None) for a in range(c, self.n, rows)]

    @property
    def n_slots(self) -> int:
        return self.X.shape[0]

    def _block_rows(self) -> int:
        return int(max(_MIN_BLOCK_ROWS, min(4096, _BLOCK_BYTES // (4 * max(1, self.n)))))

    def grown(self, X, ids, cache_bytes: float, n_threads: int = 1):
        """Q of the rows X (with instance ``ids``) that reuses this matrix's stored entries for
        every row whose id and features are unchanged; only the new rows' kernel values are
        computed (about 2% of a fresh build after 2% new judgments). None where reuse does not
        pay and a fresh matrix should be built: nothing in common, a factored linear kernel,
        more than ``_MAX_DEAD_SHARE`` of the slots held by rows no longer in the data, or
        ``_MAX_GROWN_BLOCKS`` appended blocks already (each refit appends one).

        The new matrix shares this one's storage: use one or the other afterwards."""
        ids = np.asarray(ids)
        if self.factored or self.ids is None or X.shape[1] != self.X.shape[1]:
            return None
        X32 = np.ascontiguousarray(X, dtype=np.float32)
        live = np.arange(self.n) if self.slot is None else self.slot  # slots of current rows
        slot = positions_by_id(self.ids[live], ids)  # dead slots may repeat a live id
        kept = slot >= 0
        slot[kept] = live[slot[kept]]
        kept[kept] = np.all(X32[kept] == self.X[slot[kept]], axis=1)  # changed features: new
        slot[~kept] = -1
        new_rows = np.flatnonzero(~kept)
        n_old, m = self.n_slots, new_rows.size
        n_dead = n_old - (X32.shape[0] - m)
        if m == X32.shape[0] or n_dead > _MAX_DEAD_SHARE * (n_old + m) \
                or self.n_grown >= _MAX_GROWN_BLOCKS:
            return None
        g = copy.copy(self)
        g.n, g.n_threads, g.n_products = X32.shape[0], n_threads, 0
        g.cache_bytes = float(cache_bytes)
        g.n_reused = X32.shape[0] - m
        g.n_grown = self.n_grown + 1
        g.X = np.concatenate([self.X, X32[new_rows]])
        g.sq = np.concatenate([self.sq, row_norms(X32[new_rows])])
        g.ids = np.concatenate([self.ids, ids[new_rows]])
        slot[new_rows] = n_old + np.arange(m)
        g.slot = slot
        g.blocks = list(self.blocks)
        if m:
            block = None
            block_bytes = 4 * m * (n_old + m)
            if self.nbytes + block_bytes <= cache_bytes:
                with blas_limit(1):
                    block = kernel_block(g.X[n_old:], g.X, g.sq[n_old:], g.sq, self.spec)
                g.nbytes = self.nbytes + block_bytes
                g.n_cached = self.n_cached + m
            g.blocks.append((n_old, n_old + m, block))
        return g

    def matvec(self, v: np.ndarray) -> np.ndarray:
        """Q v in float64 (float32 arithmetic inside, to about 1e-5 of max |Q v|). ``v`` may be
        one vector (l,) or k of them as rows (k, l): they share one pass over the stored
        entries, so k products cost about one (the pass is bound by memory bandwidth)."""
        self.n_products += 1
        V = np.atleast_2d(v)
        if self.factored:
            with blas_limit(1):
                return ((V @ self.X) @ self.X.T).reshape(np.shape(v))
        k = V.shape[0]
        if self.slot is None:
            V32 = np.ascontiguousarray(V, dtype=np.float32)
        else:  # rows to slots; slots of rows no longer present get 0
            V32 = np.zeros((k, self.n_slots), dtype=np.float32)
            V32[:, self.slot] = V
        Y = np.zeros((k, self.n_slots), dtype=np.float32)
        c = self.n_packed
        if c > 0:
            cuts = self._row_cuts(numba.get_num_threads())
            parts = np.empty((cuts.size - 1, k, c), dtype=np.float32)
            Yc = np.empty((k, c), dtype=np.float32)
            _k.packed_symv(self.packed, np.ascontiguousarray(V32[:, :c]), cuts, parts, Yc)
            Y[:, :c] = Yc
        self._block_products(V32, Y)
        if self.slot is not None:
            Y = Y[:, self.slot]
        return Y.astype(np.float64).reshape(np.shape(v))

    def _row_cuts(self, n_threads: int) -> np.ndarray:
        """The stored triangle's rows split among ``n_threads`` (once per thread count: a
        grown matrix shares the triangle, and these cuts, with the one it came from)."""
        if n_threads not in self.cuts:
            self.cuts[n_threads] = _k.packed_row_cuts(self.n_packed, n_threads)
        return self.cuts[n_threads]

    def remember(self, v: np.ndarray, qv: np.ndarray) -> None:
        """Keep v and Q v (by row) for :meth:`product_from_known` on a matrix grown from this one
        (a solver's final coefficients and scores: the next warm start begins there)."""
        vs, qs = np.zeros(self.n_slots), np.zeros(self.n_slots)
        slots = np.arange(self.n) if self.slot is None else self.slot
        vs[slots], qs[slots] = v, qv
        self.known = (vs, qs)

    def product_from_known(self, v: np.ndarray, max_changed: float = 0.02):
        """Q v from the remembered (u, Q u) without a pass over the stored triangle, or None
        where that does not pay. With k the slots Q u was known for (those past k were appended
        by :meth:`grown` since) and D the slots below k where v and u differ (changed
        coefficients, rows no longer present whose coefficient was not 0):

            (Q v)_i = (Q u)_i + Σ_{j∈D} Q_ij (v − u)_j + Σ_{j≥k} Q_ij v_j     i < k
            (Q v)_i = Σ_j Q_ij v_j                                           i ≥ k

        the appended row blocks plus one kernel block of |D| columns, used when
        |D| ≤ ``max_changed`` · l. A warm start after a few new judgments starts the new rows
        at 0 and keeps the others' coefficients, so D is empty: 2% new rows cost about 2% of a
        product."""
        if self.known is None or self.factored:
            return None
        u, qu = self.known
        k = u.shape[0]
        vs = np.zeros((1, self.n_slots))
        vs[0, np.arange(self.n) if self.slot is None else self.slot] = v
        diff = vs[0, :k] - u
        changed = np.flatnonzero(diff)
        if changed.size > max_changed * self.n:
            return None
        y = np.zeros((1, self.n_slots))
        y[0, :k] = qu
        self._block_products(vs.astype(np.float32), y, first_slot=k)
        if changed.size:
            Xc = self.X[changed]
            block = kernel_block(self.X[:k], Xc, self.sq[:k], self.sq[changed], self.spec)
            with blas_limit(1):
                y[0, :k] += block @ diff[changed].astype(np.float32)
        y = y[0]
        return y if self.slot is None else y[self.slot]

    def sparse_quadratic(self, rows, values) -> float:
        """xᵀQx for x zero outside ``rows`` (x_rows = ``values``), from K(X_rows, X_rows)."""
        if len(rows) == 0:
            return 0.0
        Xr = self.X[rows if self.slot is None else self.slot[rows]]
        if self.factored:
            a = Xr.T @ values
            return float(a @ a)
        sq = row_norms(Xr)
        block = kernel_block(Xr, Xr, sq, sq, self.spec).astype(np.float64)
        return float(values @ block @ values)

    def _block_products(self, V32, Y, first_slot=0):
        """Y += the products of the row blocks past the packed triangle (those starting at
        ``first_slot`` or later) with the rows of V32: each block K(X[a:b], X[:b]) once as it
        is (rows a..b) and once transposed (rows below a)."""
        for a, b, block in self.blocks:
            if a < first_slot:
                continue
            if block is None:
                with blas_limit(self.n_threads):
                    block = kernel_block(self.X[a:b], self.X[:b], self.sq[a:b], self.sq[:b],
                                         self.spec)
            with blas_limit(1):  # as gemv/gemm on the block's own layout (no copies)
                Y[:, a:b] += (block @ V32[:, :b].T).T
                if a > 0:
                    Y[:, :a] += (block[:, :a].T @ V32[:, a:b].T).T

    def dense(self) -> np.ndarray:
        """Q as a dense float64 array (tests and small problems only)."""
        return np.column_stack([self.matvec(e) for e in np.eye(self.n)])


class KernelSpace:
    """w = Σ β_i φ(x_i): coordinates β ∈ R^l, f = Qβ, ⟨a, b⟩_H = aᵀQb, Φ*u = u."""

    def __init__(self, gram: GramMatrix):
        self.gram = gram
        self.dim = gram.n

    @property
    def n_products(self) -> int:
        return self.gram.n_products

    def riesz(self, x):
        return self.gram.matvec(x)

    def known_riesz(self, x):
        """Q x without a full product when Q remembers a nearby vector's, else None."""
        return self.gram.product_from_known(x)

    def sparse_quadratic(self, idx, values) -> float:
        """xᵀQx for x zero outside the rows ``idx`` (|idx|² kernel entries)."""
        return self.gram.sparse_quadratic(idx, values)

    def forward(self, x, rx):
        return rx

    def adjoint(self, u):
        return u


class FeatureSpace:
    """w ∈ R^m with features Z (l × m, kept in float32 like Q): f = Z w, ⟨a, b⟩ = aᵀb,
    Φ*u = Zᵀu."""

    def __init__(self, Z: np.ndarray):
        self.Z = np.ascontiguousarray(Z, dtype=np.float32)
        self.dim = Z.shape[1]
        self.n_products = 0

    def riesz(self, x):
        return x

    def known_riesz(self, x):
        return x

    def forward(self, x, rx):
        self.n_products += 1
        with blas_limit(1):
            return (self.Z @ x.astype(np.float32)).astype(np.float64)

    def adjoint(self, u):
        self.n_products += 1
        with blas_limit(1):
            return (self.Z.T @ u.astype(np.float32)).astype(np.float64)


def nystroem_features(X, landmarks, spec: KernelSpec, eig_floor: float = 1e-10):
    """Nyström features Z = K(X, L) K(L, L)^(−1/2) (so Z Zᵀ ≈ K(X, X)) and the map
    T = K(L, L)^(−1/2) (Z = K(X, L) T). Eigenvalues below ``eig_floor`` · the largest are
    dropped (the pseudo-inverse square root), so Z may have fewer columns than landmarks."""
    L = np.ascontiguousarray(landmarks, dtype=np.float64)
    sq_l = row_norms(L)
    K_ll = kernel_block(L, L, sq_l, sq_l, spec)
    K_ll = 0.5 * (K_ll + K_ll.T)
    with blas_limit(1):  # threaded LAPACK stalls on a busy machine (10x and more)
        vals, vecs = np.linalg.eigh(K_ll)
    keep = vals > eig_floor * max(vals.max(), np.finfo(float).tiny)
    T = vecs[:, keep] / np.sqrt(vals[keep])
    X64 = np.ascontiguousarray(X, dtype=np.float64)
    sq_x = row_norms(X64)
    Z = np.empty((X64.shape[0], T.shape[1]))
    rows = max(64, _BLOCK_BYTES // (8 * max(1, L.shape[0])))
    for a in range(0, X64.shape[0], rows):
        b = min(a + rows, X64.shape[0])
        Z[a:b] = kernel_block(X64[a:b], L, sq_x[a:b], sq_l, spec) @ T
    return Z, T
