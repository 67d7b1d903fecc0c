"""AltSVM's driver (Park et al., ICML 2015, Algorithm 1): state in, result out.

Problem (paper eq. 3, with an optional item bias regularized like V)::

    P(U, V, b) = Σ_c L(u_iᵀ(v_j − v_k) + b_j − b_k) + reg/2 (‖U‖² + ‖V‖² + ‖b‖²)

over comparisons c = (user i, winner j, loser k). Each outer iteration is a V-step (a linear
SVM in (V, b) with U fixed, eq. 6) then a U-step (one small rankSVM per user with V fixed,
eq. 5), each one epoch of stochastic dual coordinate descent; the kernels and the exact
coordinate steps are in :mod:`solvers._altsvm_kernels`.

Dual variables. Each comparison has one dual for the V-step (``beta``, eq. 9) and one for the
U-step (``alpha``, eq. 7), kept across outer iterations (§4.2) and across fits (warm start).
They are loss slopes (a = −L'(z) at the optimum), independent of ``reg``: w = (1/reg) Σ a x.
Before each half-step the primal is rebuilt exactly from its duals with the current other
factor (Algorithm 1 lines 3 and 13). Rebuilds and objective values go through the distinct
(user, item) pairs ("entries") of the comparisons, so they cost O(|E| r + |Ω|), not O(|Ω| r).

Monotone objective. A rebuilt primal can be worse than the point the previous half-step left
(the duals were fitted against the old other factor), most of all at small ``reg``. So
P(U_old, V_new) is computed in the same pass that rebuilds U; while it exceeds the previous
objective up to 2 more V epochs run, and if it still does, V and b go back to their previous
values (beta keeps its progress and starts the next V-step), except when those are the cold
start's V = 0, b = 0: U = V = 0 is a fixed point of the alternation (each half-step rebuilds
its factor from the other), so going back there ends the fit at no model; instead the first
V-step gets up to 20 extra epochs and keeps its result. Per user, the U-step likewise runs
up to 50 more epochs while the user's share of the objective is above its value at the old
u_i, and else keeps the old u_i. ``objective`` is non-increasing by construction; an outer
iteration whose V-step was reverted never counts as converged.

Parallel schedule. Everything a fit does in O(|Ω|) or O(|E| r) runs on ``n_threads``
threads: the checks, the counting sorts (by user, :func:`layout`; by V-step task,
:func:`strata`) and the entries, the warm start's dual join and U rebuild, and per outer
iteration the V rebuild, the V-step and the U-step; what stays serial is O(n_users r +
n_items r) (the random U, copies of U and V, prefix sums). By default (``hogwild=False``) a
fit gives the same numbers, bit for bit, on any thread count, for a given seed:

* the passes over users (U-step fused with the rebuild of U and the objective, warm-start
  rebuild, layout) go by blocks of whole users: a user owns its comparisons, entries and row
  of U, and draws from its own random stream;
* the V rebuild sums v_j per contiguous range of users into one accumulator per range, then
  adds the ranges in order; the ranges are set by the data, not the thread count
  (:func:`accumulator_parts`);
* the V-step is stratified (:func:`_altsvm_kernels.vstep_strata`): items in B blocks, the
  comparisons grouped into tasks by the pair of blocks of their two items, the tasks into
  the rounds of a round-robin tournament (within a round no two tasks share a block, so they
  run in parallel without races), rounds in a seeded order. The schedule is a function of the
  data and the seed only.

``hogwild=True`` (``AltSVM(deterministic=False)``) runs the paper's lock-free V-step instead
(§4.1): comparisons grouped by user are cut into blocks of 256, visited in a fresh random
block order every epoch, each block sequentially, blocks dealt to threads dynamically; its
result depends on timing. The tests hold both to the serial quality (2e-3 of the objective).

Stopping rule: the decrease of the objective in an outer iteration, measured against the
whole decrease from the point w = 0 (U = V = 0, b = 0, where P(0) = n L(0))::

    f_{t−1} − f_t  <=  tol · (P(0) − f_t),

f_0 being the objective at the starting point (random U, V = 0; or, warm, after its first
U-step). P(0) is the same for a cold and a warm fit, so a good warm start neither stops before
it has taken in the new comparisons nor keeps running. While f_t >= P(0) (a cold start begins
at P(0) + reg/2 ‖U_random‖²) the rule does not hold, except that a decrease below round-off
(1e-12 P(0)) stops the fit. A warm start begins with one U-step against the stored V: it
brings the new comparisons' alpha in before the first V-step. (Measurements behind these
choices: docs/solver-notes.md.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numba
import numpy as np
from scipy.optimize import minimize
from scipy.sparse.linalg import LinearOperator, svds

from solvers import _altsvm_kernels as K
from solvers import _altsvm_layout as L

LOSSES = {"squared_hinge": K.SQUARED_HINGE, "hinge": K.HINGE, "logistic": K.LOGISTIC}
MAX_EXTRA_V_EPOCHS = 2  # see "Monotone objective" above
MAX_FIRST_V_EPOCHS = 20  # extra epochs of a V-step that starts from V = 0, b = 0
MAX_EXTRA_U_EPOCHS = 50
BLOCK = 256  # comparisons per block of the Hogwild V-step's block-shuffled order
CHUNK = 4  # blocks a thread takes at a time in the U-step and the Hogwild V-step
BLOCK_COMPARISONS = 4096  # comparisons per block of users in the parallel passes over users
V_PARTS = 32  # user ranges of the V rebuild (each with its own V), at most
V_PARTS_MIN_BYTES = 64 * 2**20  # their memory may reach max(this, 8 bytes per entry)
MAX_ITEM_BLOCKS = 64  # item blocks B of the stratified V-step: B/2 tasks per round
TASK_COMPARISONS = 512  # B is at most sqrt(2 n / this): tasks of this many comparisons or more
DUAL_SPANS = 64  # spans of the parallel dual gathers between layout and task order


# ---------------------------------------------------------------------- layout

def id_dtype(n_users: int, n_items: int):
    """int32 ids whenever they fit (half the memory and bandwidth of int64)."""
    return np.int32 if max(n_users, n_items) <= np.iinfo(np.int32).max else np.int64


def user_blocks(user_ptr: np.ndarray, target: int = BLOCK_COMPARISONS) -> np.ndarray:
    """Boundaries of blocks of whole users with about ``target`` comparisons each (block q:
    users out[q]..out[q + 1] − 1; a user with more stays whole)."""
    return user_parts(user_ptr, int(user_ptr[-1]) // max(target, 1))


def user_parts(cost_ptr: np.ndarray, n_parts: int) -> np.ndarray:
    """Boundaries of at most ``n_parts`` contiguous user ranges of about equal cost
    (``cost_ptr``: a cumulative cost over users, like ``user_ptr``)."""
    n_users = cost_ptr.shape[0] - 1
    k = max(1, min(n_users, n_parts))
    cuts = np.searchsorted(cost_ptr, np.arange(1, k) * (float(cost_ptr[-1]) / k))
    return np.unique(np.r_[0, cuts, n_users]).astype(np.int64)


def by_user(c, n_users: int, n_items: int) -> np.ndarray:
    """The comparisons (as :func:`layout` takes them) as a (3, n) array of user, winner and
    loser rows, stably sorted by user: :func:`layout`'s ``cols`` (a counting sort in
    parallel)."""
    users, winners, losers = (c[:, 0], c[:, 1], c[:, 2]) if isinstance(c, np.ndarray) else c
    n = users.shape[0]
    spans = max(1, min(numba.get_num_threads(), n))
    counts, _ = L.count_users(users, n_users, spans)
    user_ptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(L.user_totals(counts), out=user_ptr[1:])
    cols = np.empty((3, n), dtype=id_dtype(n_users, n_items))
    L.scatter_by_user(users, winners, losers, counts, user_ptr, cols[0], cols[1], cols[2])
    return cols


def layout(c, n_users: int, n_items: int) -> dict:
    """Index arrays for the kernels (:mod:`solvers._altsvm_layout`, all passes parallel).

    ``c``: validated comparisons, an (n, 3) array of (user, winner, loser) rows or a tuple of
    the three columns, in any order. Returns the columns stably sorted by user (``cols``, a
    (3, n) array whose rows are ``cu``, ``cw``, ``cl``), ``user_ptr``, the distinct (user,
    item) entries (``entry_ptr``, ``entry_item``) with each comparison's winner and loser
    entries (``pos_w``, ``pos_l``), and ``blocks`` of users for the parallel passes.
    """
    cols = by_user(c, n_users, n_items)
    n = cols.shape[1]
    user_ptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(cols[0], minlength=n_users), out=user_ptr[1:])
    blocks = user_blocks(user_ptr)
    pos = np.empty((2, n), dtype=np.int32 if 2 * n <= np.iinfo(np.int32).max else np.int64)
    n_entries = np.empty(n_users, dtype=np.int64)
    L.count_entries(blocks, user_ptr, cols[1], cols[2], n_items, pos[0], pos[1], n_entries)
    entry_ptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(n_entries, out=entry_ptr[1:])
    entry_item = np.empty(int(entry_ptr[-1]), dtype=cols.dtype)
    L.fill_entries(blocks, user_ptr, cols[1], cols[2], entry_ptr, pos[0], pos[1], entry_item)
    return {"cols": cols, "cu": cols[0], "cw": cols[1], "cl": cols[2], "user_ptr": user_ptr,
            "pos_w": pos[0], "pos_l": pos[1], "entry_ptr": entry_ptr, "entry_item": entry_item,
            "n_entries": entry_item.shape[0], "n_items": n_items, "blocks": blocks}


def join_duals(old_user, old_winner, old_loser, old_duals, lay, clip_to=np.nan
               ) -> tuple[list, int]:
    """Carry two dual vectors keyed by (user, winner, loser) onto the comparisons of layout
    ``lay`` (:func:`solvers._altsvm_kernels.join_duals`), clipped into [0, clip_to] unless
    ``clip_to`` is NaN. Returns ([alpha, beta], matched)."""
    old_duals = [np.ascontiguousarray(d, dtype=np.float64) for d in old_duals]
    n_users = lay["user_ptr"].shape[0] - 1
    spans = max(1, min(numba.get_num_threads(), old_user.shape[0]))
    counts, ordered = L.count_users(old_user, n_users, spans)
    if not ordered:  # warm_state() keeps them sorted by user; anything else is sorted here
        order = np.argsort(old_user, kind="stable")
        old_user, old_winner, old_loser = old_user[order], old_winner[order], old_loser[order]
        old_duals = [d[order] for d in old_duals]
    old_ptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(L.user_totals(counts), out=old_ptr[1:])
    n = lay["cw"].shape[0]
    out_a, out_b = np.empty(n), np.empty(n)
    parts = user_parts(lay["user_ptr"] + old_ptr, numba.get_num_threads())
    matched = K.join_duals(parts, old_ptr, np.ascontiguousarray(old_winner),
                           np.ascontiguousarray(old_loser), old_duals[0], old_duals[1],
                           lay["user_ptr"], lay["pos_w"], lay["pos_l"], lay["entry_ptr"],
                           lay["entry_item"], lay["n_items"], float(clip_to), out_a, out_b)
    return [out_a, out_b], int(matched)


def map_duals(old_triples, old_duals, new_triples) -> tuple[list, int]:
    """:func:`join_duals` for comparisons in any order: the two dual vectors in the order of
    ``new_triples``. A triple that occurs m times in both sets maps its occurrences in order;
    new triples get 0; vanished ones are dropped."""
    old_triples = np.asarray(old_triples, dtype=np.int64)
    new_triples = np.asarray(new_triples, dtype=np.int64)
    order = np.argsort(new_triples[:, 0], kind="stable")
    n_users = int(max(old_triples[:, 0].max(initial=-1), new_triples[:, 0].max(initial=-1))) + 1
    n_items = int(max(old_triples[:, 1:].max(initial=-1), new_triples[:, 1:].max(initial=-1))) + 1
    lay = layout(new_triples, n_users, n_items)
    (a, b), matched = join_duals(old_triples[:, 0], old_triples[:, 1], old_triples[:, 2],
                                 old_duals, lay)
    out_a, out_b = np.empty_like(a), np.empty_like(b)
    out_a[order] = a
    out_b[order] = b
    return [out_a, out_b], matched


# ---------------------------------------------------------------------- starting point

@dataclass
class Start:
    """The point a fit starts from (arrays are updated in place by :func:`solve`)."""

    U: np.ndarray
    V: np.ndarray
    b: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    warm: bool
    n_matched: int = 0


def cold_start(lay: dict, n_users: int, n_items: int, rank: int, rng) -> Start:
    """Random U (uniform, scaled by 1/sqrt(rank)), V = 0, b = 0, all duals 0."""
    n = lay["cu"].shape[0]
    U = rng.random((n_users, rank)) / np.sqrt(max(rank, 1))
    return Start(U, np.zeros((n_items, rank)), np.zeros(n_items), np.zeros(n), np.zeros(n),
                 warm=False)


def warm_start(lay: dict, state: dict, n_users: int, n_items: int, rank: int, loss: str,
               reg: float, fit_bias: bool) -> Start:
    """Duals joined by (user, winner, loser) and clipped into the feasible set of ``loss``; V
    and b from the state (zero rows for new items); U rebuilt exactly from alpha with that V,
    u_i = (1/reg) Σ alpha_c (v_j − v_k) (LIBLINEAR's setup loop); new users start at 0."""
    (alpha, beta), matched = join_duals(state["user"], state["winner"], state["loser"],
                                        (state["alpha"], state["beta"]), lay,
                                        clip_to=np.inf if loss == "squared_hinge" else 1.0)
    U = np.zeros((n_users, rank))
    V = np.zeros((n_items, rank))
    b = np.zeros(n_items)
    V[: state["V"].shape[0]] = state["V"]
    if fit_bias:
        b[: state["b"].shape[0]] = state["b"]
    K.users_from_duals(lay["blocks"], lay["user_ptr"], lay["pos_w"], lay["pos_l"],
                       lay["entry_ptr"], lay["entry_item"], alpha, V, reg, U)
    return Start(U, V, b, alpha, beta, warm=True, n_matched=matched)


# ---------------------------------------------------------------------- the alternating loop

@dataclass
class Result:
    """What :func:`solve` returns (U, V, b, alpha, beta are the start's arrays, updated)."""

    U: np.ndarray
    V: np.ndarray
    b: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    objective: np.ndarray
    objective_init: float
    n_iter: int
    converged: bool
    last_ratio: float
    n_extra_v_epochs: int
    n_v_reverts: int


def accumulator_parts(cost_ptr: np.ndarray, n_entries: int, part_bytes: int) -> np.ndarray:
    """User ranges for a pass that sums per item with one accumulator (``part_bytes``) per
    range: up to ``V_PARTS``, as many as fit in max(``V_PARTS_MIN_BYTES``, 8 bytes per entry),
    balanced by ``cost_ptr`` (a cumulative cost over users). Set by the data alone, never by
    the thread count, so the sums round the same way on any number of threads."""
    budget = max(V_PARTS_MIN_BYTES, 8 * n_entries)
    n_parts = min(V_PARTS, budget // max(1, part_bytes))
    return user_parts(cost_ptr, max(1, n_parts))


def v_accumulators(lay: dict, V: np.ndarray, b: np.ndarray) -> tuple:
    """User ranges and accumulators for the V rebuild (:func:`_altsvm_kernels.items_from_duals`).

    Up to ``V_PARTS`` ranges (balanced by comparisons + rank x entries), as many as fit in
    max(``V_PARTS_MIN_BYTES``, 8 bytes per entry) of accumulators, each a copy of (V, b):
    their sum costs parts x items x (rank + 1), small beside the rebuild's entries x rank
    when the memory bound holds. A single range adds straight into V and b.
    """
    n_items, r = V.shape
    parts = accumulator_parts(lay["user_ptr"] + max(r, 1) * lay["entry_ptr"], lay["n_entries"],
                              8 * n_items * (r + 1))
    if parts.shape[0] == 2:
        return parts, V[None], b[None]
    return parts, np.empty((parts.shape[0] - 1, n_items, r)), np.empty((parts.shape[0] - 1,
                                                                         n_items))


def n_item_blocks(n: int, n_items: int) -> int:
    """B for the stratified V-step: even, at most ``MAX_ITEM_BLOCKS`` (B/2 tasks per round are
    enough for 16 threads to share), at most sqrt(2 n / ``TASK_COMPARISONS``) (so a task
    holds enough comparisons to outweigh a barrier) and the number of items; at least 2."""
    b = min(MAX_ITEM_BLOCKS, int(np.sqrt(2.0 * n / TASK_COMPARISONS)), n_items)
    return max(2, b - b % 2)


def tournament(n_blocks: int) -> list:
    """Rounds of block sets: the B − 1 rounds of a round-robin tournament on B (even) blocks
    by the circle method (round ρ: {B − 1, ρ} and {(ρ + s) mod (B − 1), (ρ − s) mod (B − 1)},
    s = 1 .. B/2 − 1: a perfect matching), then the round of the B diagonal tasks {p}."""
    m = n_blocks - 1
    rounds = [[(m, rho)] + [((rho + s) % m, (rho - s) % m) for s in range(1, n_blocks // 2)]
              for rho in range(m)]
    return rounds + [[(p, p) for p in range(n_blocks)]]


def item_blocks(degree: np.ndarray, n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """``(item_block, item_order)``: items by decreasing ``degree`` (comparisons; ties by id)
    dealt to the blocks in serpentine order (0..B−1, B−1..0, ...), and the items block by
    block (by id within one: new label -> item)."""
    n_items = degree.shape[0]
    by_degree = np.argsort(-degree, kind="stable")
    rank = np.arange(n_items)
    lap, seat = rank // n_blocks, rank % n_blocks
    item_block = np.empty(n_items, dtype=np.int32)
    item_block[by_degree] = np.where(lap % 2 == 0, seat, n_blocks - 1 - seat)
    return item_block, np.argsort(item_block, kind="stable")


def task_order(sizes: np.ndarray, n_blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(key_of_task, round_ptr, task_of_key)``: the :func:`tournament`'s block pairs (key
    min(p, q)·B + max(p, q); ``sizes``: comparisons per key) numbered round by round, within a
    round by decreasing size (ties by key)."""
    key_of_task, round_ptr = [], [0]
    for pairs in tournament(n_blocks):
        keys = [min(p, q) * n_blocks + max(p, q) for p, q in pairs]
        key_of_task += sorted(keys, key=lambda k: (-sizes[k], k))
        round_ptr.append(len(key_of_task))
    key_of_task = np.asarray(key_of_task, dtype=np.int64)
    task_of_key = np.full(n_blocks * n_blocks, -1, dtype=np.int64)
    task_of_key[key_of_task] = np.arange(key_of_task.shape[0])
    return key_of_task, np.asarray(round_ptr, dtype=np.int64), task_of_key


def strata(lay: dict) -> dict:
    """The stratified V-step's schedule (:func:`_altsvm_kernels.vstep_strata`), from the
    comparisons alone (never the thread count).

    Item blocks: items by decreasing number of comparisons (ties by id) dealt to the B blocks
    in serpentine order (0..B−1, B−1..0, ...), so the blocks, and the tasks, carry similar
    loads. Tasks: the :func:`tournament`'s block pairs, numbered round by round, within a
    round by decreasing size (dealt to threads largest first). The comparisons are stably
    counting-sorted by task (within a task they stay in user order). Items are relabelled so
    that each block is a contiguous range of rows (``item_order``: new label -> item): threads
    working on different blocks then never write to the same cache line of V or b (with the
    blocks interleaved, false sharing made 2 threads 1.36x one). Returns ``round_ptr``,
    ``task_ptr``, ``perm`` (task position -> layout position), the users ``tu`` and
    relabelled items ``tw``, ``tl`` in task order, ``item_order`` and ``n_blocks``; 24 bytes
    per comparison while int32 ids fit.
    """
    cu, cw, cl, n_items = lay["cu"], lay["cw"], lay["cl"], lay["n_items"]
    n = cu.shape[0]
    n_blocks = n_item_blocks(n, n_items)
    degree = np.bincount(cw, minlength=n_items) + np.bincount(cl, minlength=n_items)
    item_block, item_order = item_blocks(degree, n_blocks)
    item_new = np.empty(n_items, dtype=cw.dtype)
    item_new[item_order] = np.arange(n_items)
    spans = max(1, min(numba.get_num_threads(), n))  # who counts what; the sort is stable
    counts = L.count_pairs(cw, cl, item_block, n_blocks, spans)
    sizes = counts.sum(axis=0)
    key_of_task, round_ptr, task_of_key = task_order(sizes, n_blocks)
    task_ptr = np.zeros(key_of_task.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes[key_of_task], out=task_ptr[1:])
    per_span = counts[:, key_of_task]  # span t's rows of task k start after earlier spans'
    starts = task_ptr[:-1] + np.cumsum(per_span, axis=0) - per_span
    perm = np.empty(n, dtype=lay["pos_w"].dtype)
    tu, tw, tl = (np.empty(n, dtype=cu.dtype) for _ in range(3))
    L.scatter_by_task(cu, cw, cl, item_block, n_blocks, task_of_key, item_new, starts, perm, tu,
                      tw, tl)
    return {"round_ptr": round_ptr, "task_ptr": task_ptr,
            "perm": perm, "tu": tu, "tw": tw, "tl": tl, "item_order": item_order,
            "n_blocks": n_blocks}


def _seed(rng) -> np.uint64:
    """The next kernel seed (drawn as a 1-element array: the stream fits keep reproducing)."""
    return rng.integers(0, 2**63, size=1, dtype=np.int64).astype(np.uint64)[0]


class LocalWork:
    """What one alternation does to the users' side, in this process: the U-step, the V
    rebuild and the V-step over the comparisons of layout ``lay`` (the Ray engine's
    :class:`solvers.altsvm_ray.RayWork` does the same, bit for bit, on workers). Holds U, the
    U of the last U-step (``U_old``: the V-step's features) and the duals; V and b are the
    caller's, passed in and updated in place."""

    def __init__(self, lay: dict, start: Start, *, reg: float, loss_code: int, fit_bias: bool,
                 parallel: bool, hogwild: bool):
        self.lay, self.reg, self.loss, self.fit_bias = lay, reg, loss_code, fit_bias
        self.U, self.alpha, self.beta = start.U, start.alpha, start.beta
        self.n_comparisons = lay["cu"].shape[0]
        self.U_old = self.U.copy()
        self.rank = self.U.shape[1]
        self.ustep = K.ustep_parallel if parallel else K.ustep_serial
        self.shares = np.empty((self.U.shape[0], 2))
        self.parts, self.acc_V, self.acc_b = v_accumulators(lay, start.V, start.b)
        self.hogwild, self.parallel = hogwild, parallel
        if not hogwild:   # stratified: beta_t is beta in task order, V_t, b_t relabelled
            st = lay.get("strata") or lay.setdefault("strata", strata(lay))  # once per layout
            self.strata = st
            self.round_order = np.empty(st["round_ptr"].shape[0] - 1, dtype=np.int64)
            self.task_ids = np.arange(st["task_ptr"].shape[0] - 1, dtype=np.int64)
            self.beta_t = np.empty(lay["cu"].shape[0])
            K.take_duals(self.beta, st["perm"], self.beta_t, DUAL_SPANS)
            self.V_t, self.b_t = np.empty_like(start.V), np.empty_like(start.b)

    def swap(self) -> None:
        """U_old takes U's buffer, no copy: every U-step rewrites every row of U from alpha
        (_user_update), and nothing reads U between here and that U-step."""
        self.U, self.U_old = self.U_old, self.U

    def undo_u_step(self) -> None:
        self.U[:] = self.U_old

    def rebuild(self, V: np.ndarray, b: np.ndarray) -> None:
        """V, b from beta with U_old (Algorithm 1 line 3)."""
        lay = self.lay
        K.items_from_duals(self.parts, lay["user_ptr"], lay["pos_w"], lay["pos_l"],
                           lay["entry_ptr"], lay["entry_item"], self.beta, self.U_old,
                           self.reg, self.fit_bias, self.acc_V, self.acc_b, V, b)

    def v_step(self, V: np.ndarray, b: np.ndarray, seed) -> None:
        """One V-step epoch with U_old's features; beta follows (rebuilds, the result)."""
        lay = self.lay
        if self.hogwild:   # the paper's lock-free V-step over blocks of comparisons
            n = lay["cu"].shape[0]
            block_start = np.r_[np.arange(0, n, BLOCK), n].astype(np.int64)
            blocks = np.arange(block_start.shape[0] - 1, dtype=np.int64)
            hog = K.vstep_hogwild if self.parallel else K.vstep_serial
            hog(blocks, block_start, lay["cu"], lay["cw"], lay["cl"], self.beta, self.U_old, V,
                b, self.fit_bias, self.reg, self.loss, seed)
            return
        st, item_order = self.strata, self.strata["item_order"]
        np.take(V, item_order, axis=0, out=self.V_t)
        np.take(b, item_order, out=self.b_t)
        K.epoch_rounds(self.round_order, seed)
        chunk = numba.set_parallel_chunksize(1)  # a round has few tasks: one at a time
        try:
            K.vstep_strata(self.round_order, st["round_ptr"], st["task_ptr"], self.task_ids,
                           st["tu"], st["tw"], st["tl"], self.beta_t, self.U_old, self.V_t,
                           self.b_t, self.fit_bias, self.reg, self.loss, seed)
        finally:
            numba.set_parallel_chunksize(chunk)
        V[item_order] = self.V_t
        b[item_order] = self.b_t
        K.put_duals(self.beta_t, st["perm"], self.beta, DUAL_SPANS)

    def users_objective(self, V: np.ndarray, b: np.ndarray) -> float:
        """Σ_i user i's share of P at U (the rest of P is reg/2 (‖V‖² + ‖b‖²))."""
        lay = self.lay
        K.user_shares(lay["blocks"], lay["user_ptr"], lay["pos_w"], lay["pos_l"],
                      lay["entry_ptr"], lay["entry_item"], self.U, V, b, self.reg, self.loss,
                      self.shares[:, 0])
        return float(self.shares[:, 0].sum())

    def u_step(self, V: np.ndarray, b: np.ndarray, seed) -> tuple[float, float]:
        """The U-step from U_old; the users' shares of P before and after it."""
        lay = self.lay
        self.ustep(lay["blocks"], lay["user_ptr"], lay["cw"], lay["cl"], lay["pos_w"],
                   lay["pos_l"], lay["entry_ptr"], lay["entry_item"], self.alpha, self.U_old, V,
                   b, self.reg, self.loss, MAX_EXTRA_U_EPOCHS, seed, 0, self.U, self.shares)
        return float(self.shares[:, 0].sum()), float(self.shares[:, 1].sum())

    def result(self) -> tuple:
        """(U, alpha, beta) at the end of the fit."""
        return self.U, self.alpha, self.beta


def solve(lay: dict, start: Start, *, reg: float, loss: str, fit_bias: bool, max_iter: int,
          tol: float, rng, parallel: bool, hogwild: bool = False,
          verbose: bool = False, work=None) -> Result:
    """Algorithm 1 with the monotone safeguards and the stopping rule of the module docstring.
    ``rng`` (a numpy Generator) seeds every epoch's coordinate order. ``work``: who does the
    users' side (default :class:`LocalWork` over ``lay``; ``lay`` is then only read by it)."""
    loss_code = LOSSES[loss]
    if work is None:
        work = LocalWork(lay, start, reg=reg, loss_code=loss_code, fit_bias=fit_bias,
                         parallel=parallel, hogwild=hogwild)
    V, b = start.V, start.b
    n = work.n_comparisons
    r = V.shape[1]

    def objective_of_u() -> float:
        return work.users_objective(V, b) + 0.5 * reg * K.sum_squares(V, b)

    def u_step() -> tuple[float, float]:
        """U-step from U_old (the V-step's features); P before and after it."""
        if r == 0:
            f = objective_of_u()
            return f, f
        before, after = work.u_step(V, b, _seed(rng))
        vb = 0.5 * reg * K.sum_squares(V, b)
        return before + vb, after + vb

    f_prev = objective_init = objective_of_u()
    f_zero = n * K.loss_value(loss_code, 0.0)  # P(0, 0, 0): the stopping rule's reference
    if start.warm and r > 0:
        _, f_prev = u_step()  # brings the new comparisons' alpha in against the stored V
    objective: list[float] = []
    converged = False
    extra_v = reverts = 0
    ratio = np.inf
    t0 = time.perf_counter()
    it = 0
    for it in range(1, max_iter + 1):
        work.swap()
        V_old, b_old = V.copy(), b.copy()
        from_zero = not (V_old.any() or b_old.any())   # never revert to this fixed point
        extra = MAX_FIRST_V_EPOCHS if from_zero else MAX_EXTRA_V_EPOCHS
        reverted = False
        # V-step: V, b rebuilt from beta with the current U (Alg. 1 line 3), then CD
        work.rebuild(V, b)
        for attempt in range(extra + 2):
            if attempt <= extra:
                work.v_step(V, b, _seed(rng))
            else:  # still above the previous objective: keep the old V, b
                V[:] = V_old
                b[:] = b_old
                reverts += 1
                reverted = True
            # U-step (Alg. 1 lines 13-20); the same pass gives P(U_old, V_new)
            f_v, f = u_step()
            if f_v <= f_prev or attempt > extra or (from_zero and attempt == extra):
                break
            work.undo_u_step()  # the V-step went up: undo the U-step (alpha keeps its progress)
            extra_v += attempt < extra
        objective.append(f)
        progress = f_zero - f
        stalled = f_prev - f <= 1e-12 * f_zero
        ratio = (f_prev - f) / progress if progress > 0 else (0.0 if stalled else np.inf)
        if verbose:
            print(f"AltSVM iter {it:3d}  objective {f:.6e}  decrease / (P(0) - P) "
                  f"{ratio:.2e}  {time.perf_counter() - t0:.3f} s")
        if tol > 0 and (0.0 <= ratio <= tol or stalled) and not reverted:
            converged = True
            break
        f_prev = f
    if verbose:
        print(f"AltSVM: {n} comparisons, rank {r}, {it} outer iterations, objective "
              f"{objective[-1]:.6e}, {'converged' if converged else 'NOT converged'} "
              f"in {time.perf_counter() - t0:.3f} s")
    U, alpha, beta = work.result()
    return Result(U, V, b, alpha, beta, np.asarray(objective), objective_init, it, converged,
                  float(ratio), extra_v, reverts)


# ---------------------------------------------------------------------- reg_max

def loss_slope(loss: str, z: np.ndarray) -> np.ndarray:
    """L'(z) (≤ 0) of each loss; the hinge's subgradient −1 for z < 1, 0 above."""
    if loss == "squared_hinge":
        return -2.0 * np.maximum(0.0, 1.0 - z)
    if loss == "hinge":
        return -(z < 1.0).astype(np.float64)
    return -1.0 / (1.0 + np.exp(np.minimum(z, 700.0)))


# reg_max's relative accuracy (the test of λ >= reg_max allows it). It only places
# λ = reg_ratio · reg_max, whose grid steps are 1.6x
REG_MAX_TOL = 1e-3
# ARPACK's tolerance: on the residual of the Ritz pair (G's top singular vector), not on σ_max.
# The Ritz value is a Rayleigh quotient, whose error goes as the residual squared: on
# synthetic-1m, whose top four σ lie within 0.5% (so the vector converges slowly), σ_max at
# 3e-2 agreed with 1e-3's to 5e-6 relative, in 83 products instead of 235 from a warm start
# (186 instead of 306 cold); at 0.3 it was 1.3% low
SIGMA_RESIDUAL_TOL = 3e-2
# the secant's stop on λ = σ_max(G_a*(λ)), relative: each step is a bias-only fit and a σ_max
# (1.6 s on 7M comparisons), and a 1% error in reg_max is a 1% error in λ, a sixth of a step
SECANT_TOL = 1e-2
SIGMA_NCV = 8


class Threshold:
    """reg_max of a set of comparisons: the λ at and above which U = V = 0 is optimal.

    With G_a the users x items matrix of the comparisons' loss slopes a_c = −L'(z_c) at
    U = V = 0 (for each comparison (i, j, k), +a_c at (i, j) and −a_c at (i, k)),
    reg_max = σ_max(G_a) (see ``AltSVM.reg_max`` for the argument). Without a bias z = 0.
    With an item bias the slopes are those of the bias-only optimum b*(λ) at the same λ, so
    reg_max solves λ = σ_max(G_{a*(λ)}): a secant iteration from λ_0 = σ_max(G_{a(0)}), each
    σ_max by ARPACK warm-started from the last singular vector, each bias-only fit warm-started
    from the last. For a smooth loss that fit is L-BFGS on the distinct (winner, loser) pairs
    weighted by their counts (far fewer than the comparisons) and a = −L'(b_j − b_k). The
    hinge has a kink where many margins sit at the optimum, so there the fit is AltSVM at rank
    0 by the same dual coordinate descent, whose duals are the slopes (a subgradient; the
    hinge's dual optimum need not be unique, and σ_max follows the one the solver reaches).
    G's sparsity pattern is the layout's entries (CSR rows in order of first appearance).
    """

    def __init__(self, c, n_users: int, n_items: int, loss: str, lay: dict | None = None):
        """``c``: comparisons as :func:`layout` takes them, or None with a ready ``lay``."""
        self.loss = loss
        self.lay = lay = layout(c, n_users, n_items) if lay is None else lay
        self.shape = (lay["user_ptr"].shape[0] - 1, lay["n_items"])
        self.data = np.empty(lay["n_entries"])  # G's values, one per entry
        self.parts = accumulator_parts(lay["entry_ptr"], lay["n_entries"], 8 * lay["n_items"])
        self.acc = np.empty((self.parts.shape[0] - 1, lay["n_items"]))
        self.v0 = None
        self._pairs = None

    def operator(self) -> LinearOperator:
        """G as a linear operator with parallel products (:func:`_altsvm_kernels.entries_matvec`
        and ``entries_rmatvec``; scipy's sparse products run on one core)."""
        lay, data, acc, parts = self.lay, self.data, self.acc, self.parts

        def matvec(x):
            out = np.empty(self.shape[0])
            K.entries_matvec(lay["blocks"], lay["entry_ptr"], lay["entry_item"], data,
                             np.ascontiguousarray(x, dtype=np.float64).ravel(), out)
            return out

        def rmatvec(y):
            out = np.empty(self.shape[1])
            K.entries_rmatvec(parts, lay["entry_ptr"], lay["entry_item"], data,
                              np.ascontiguousarray(y, dtype=np.float64).ravel(), acc, out)
            return out

        return LinearOperator(self.shape, matvec=matvec, rmatvec=rmatvec, dtype=np.float64)

    def sigma(self, slopes: np.ndarray) -> float:
        """σ_max(G_a) for the slopes a of the comparisons in the layout's order (by user, then
        as given)."""
        lay, data = self.lay, self.data
        K.scatter_duals(lay["blocks"], lay["user_ptr"], lay["pos_w"], lay["pos_l"],
                        lay["entry_ptr"], np.ascontiguousarray(slopes, dtype=np.float64), data)
        if not data.any():
            return 0.0
        if min(self.shape) == 1:
            return float(np.sqrt((data ** 2).sum()))
        # 8 Lanczos vectors, not svds' 20: the secant's calls start from the last singular
        # vector, and a restart of 20 matvecs was most of each (on 8.5M comparisons the six
        # σ_max of a reg_max took 11.3 s, with 8 6.9 s, with 5 11.3 s again)
        ncv = SIGMA_NCV if min(self.shape) > SIGMA_NCV else None   # svds: k < ncv < min
        u, sv, vt = svds(self.operator(), k=1, ncv=ncv, tol=SIGMA_RESIDUAL_TOL, v0=self.v0,
                         random_state=0)
        # ARPACK iterates on the Gram matrix of the shorter side: start it from the last
        # singular vector of that side (G moves little between the secant steps)
        self.v0 = u[:, 0] if self.shape[0] <= self.shape[1] else vt[0]
        return float(sv[0])

    def bias_slopes(self, reg: float, start: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The slopes at the bias-only optimum at ``reg`` and the state to warm-start the next
        call from (``start`` is None the first time): b for a smooth loss, the duals for the
        hinge."""
        lay, loss = self.lay, self.loss
        n_users, n_items = lay["user_ptr"].shape[0] - 1, lay["n_items"]
        if loss == "hinge":
            beta = np.zeros(lay["cu"].shape[0]) if start is None else start.copy()
            start = Start(np.zeros((n_users, 0)), np.zeros((n_items, 0)), np.zeros(n_items),
                          np.zeros_like(beta), beta, warm=True)
            beta = solve(lay, start, reg=reg, loss=loss, fit_bias=True, max_iter=200,
                         tol=1e-7, rng=np.random.default_rng(0), parallel=False).beta
            return beta, beta
        if self._pairs is None:  # the distinct (winner, loser) pairs and their counts
            self._pairs = K.distinct_pairs(lay["cw"], lay["cl"], n_items)
        w, lo, count = self._pairs
        code = LOSSES[loss]

        def objective(b):
            grad = np.empty(n_items)
            return K.bias_objective(b, w, lo, count, code, reg, grad), grad

        b = minimize(objective, np.zeros(n_items) if start is None else start, jac=True,
                     method="L-BFGS-B", options={"maxiter": 1000, "gtol": 1e-9}).x
        slopes = np.empty(lay["cw"].shape[0])
        K.pair_slopes(b, lay["cw"], lay["cl"], code, slopes)
        return slopes, b

    def _bias_start(self, bias) -> np.ndarray | None:
        """Where a smooth loss's bias-only fit starts: a fit's item bias (near the bias-only
        optimum when the factors are small), else zero; the hinge's starts from its duals."""
        return None if bias is None or self.loss == "hinge" else np.asarray(bias, np.float64)

    def zero_is_optimal(self, reg: float, item_bias: bool, bias=None) -> bool:
        """Whether U = V = 0 (with the bias-only optimum b*(λ)) is optimal at λ = ``reg``:
        σ_max(G_a) <= λ for the slopes a there, the condition whose root in λ is reg_max,
        tested at one λ (one bias-only fit and one σ_max instead of the secant's several;
        on 7M comparisons 2-3 s instead of 17). ``bias``: a fit's item bias, where the
        bias-only fit of a smooth loss starts (near it when the factors are small: on 7.6M
        comparisons 26 L-BFGS iterations instead of 50)."""
        if item_bias:
            slopes, _ = self.bias_slopes(reg, self._bias_start(bias))
        else:
            slopes = np.full(self.lay["cu"].shape[0], -loss_slope(self.loss, np.zeros(1))[0])
        return self.sigma(slopes) <= reg * (1.0 + REG_MAX_TOL)

    def reg_max(self, item_bias: bool, bias=None, known=None) -> float:
        """The λ where U = V = 0 becomes optimal: the root of σ_max(G_a*(λ)) = λ by a secant
        over bias-only fits (``bias``: a warm start's item bias, where the first starts, as in
        :meth:`zero_is_optimal`). ``known``: ``(reg_max, singular vector)`` of comparisons
        close to these (a warm start's: the last run's, or the evaluated fit's for the refit
        on every row), where the secant starts instead of at σ_max(G_a(0)), ARPACK from that
        vector (zeros for new rows): on 8.5M comparisons 1.5 s instead of 5.7 (reg_max moved
        0.7% from the 6.9M of their evaluated fit)."""
        if item_bias and known is not None and known[0] > 0:
            self.v0 = _resized(known[1], min(self.shape))
            return self._secant(float(known[0]), self._bias_start(bias))
        n = self.lay["cu"].shape[0]
        reg = self.sigma(np.full(n, -loss_slope(self.loss, np.zeros(1))[0]))
        if not item_bias or reg == 0.0:
            return reg
        return self._secant(reg, self._bias_start(bias))

    def _secant(self, reg: float, start) -> float:
        """The root of σ_max(G_a*(λ)) = λ from λ = ``reg`` (``start``: where the first
        bias-only fit starts)."""
        slopes, state = self.bias_slopes(reg, start)
        previous, gap_prev = reg, self.sigma(slopes) - reg
        if abs(gap_prev) <= SECANT_TOL * reg:
            return reg + gap_prev
        reg = reg + gap_prev                       # a plain fixed-point step first
        for _ in range(20):
            slopes, state = self.bias_slopes(reg, state)
            gap = self.sigma(slopes) - reg
            if abs(gap) <= SECANT_TOL * reg:
                return reg + gap
            step = gap * (reg - previous) / (gap - gap_prev) if gap != gap_prev else gap
            previous, gap_prev = reg, gap
            reg = max(reg - step, 0.5 * reg)       # secant, kept positive
        return reg


def _resized(v, n: int) -> np.ndarray | None:
    """ARPACK's start vector of length ``n`` from ``v`` (a singular vector of the shorter side
    of other comparisons: ids only grow, so new rows start at 0), or None where nothing is
    left of it."""
    v = None if v is None else np.asarray(v, np.float64).ravel()
    if v is None or not v.size:
        return None
    out = np.zeros(n)
    out[:min(n, v.size)] = v[:n]
    return out if out.any() else None


# ---------------------------------------------------------------------- one user (fold-in)

def solve_users(c: np.ndarray, n_users: int, V, b, reg: float, loss: str, max_epochs: int,
                gap_tol: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """Solve the U-subproblem (4) with V and b fixed to a duality gap below
    ``gap_tol * max(1, P)``; returns (U, alpha in the order of ``c``, gap)."""
    o = np.argsort(c[:, 0], kind="stable")
    c = c[o]
    user_ptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(c[:, 0], minlength=n_users), out=user_ptr[1:])
    cw = np.ascontiguousarray(c[:, 1], dtype=np.int32)
    cl = np.ascontiguousarray(c[:, 2], dtype=np.int32)
    U = np.zeros((n_users, V.shape[1]))  # = w(alpha) for alpha = 0
    alpha = np.zeros(c.shape[0])
    gap = np.inf
    for epoch in range(0, max_epochs, 10):
        K.solve_users(user_ptr, cw, cl, alpha, U, V, b, reg, LOSSES[loss], 10,
                      np.uint64(seed + epoch))
        gap, primal = user_duality_gap(c[:, 0], cw, cl, alpha, U, V, b, reg, loss)
        if gap <= gap_tol * max(1.0, primal):
            break
    out = np.empty_like(alpha)
    out[o] = alpha
    return U, out, gap


def user_duality_gap(users, cw, cl, alpha, U, V, b, reg, loss) -> tuple[float, float]:
    """Duality gap P(U) + D(alpha) of the U-subproblem (4) in the rescaled dual, and P(U).

    With the bias offset o_c = b_j − b_k the margin is z_c = u_iᵀx_c + o_c, whose loss has
    conjugate L*(−a) + a o_c, so D(a) = reg/2 ‖U(a)‖² + Σ_c [L*(−a_c) + a_c o_c] (U(a) is
    maintained by the kernel) and P(U) + D(alpha) >= 0 with equality at the optimum.
    """
    offset = b[cw] - b[cl]
    z = np.einsum("ij,ij->i", U[users], V[cw] - V[cl]) + offset
    if loss == "squared_hinge":
        primal_loss = np.maximum(0.0, 1.0 - z) ** 2
        conj = -alpha + 0.25 * alpha**2
    elif loss == "hinge":
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
