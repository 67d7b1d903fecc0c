"""Numba kernels that lay AltSVM's comparisons out for the solver, every pass in parallel.

Input: comparisons c = (user i, winner j, loser k) as three id columns, in any order. Output
(see :func:`solvers._altsvm_solver.layout`):

* the columns sorted by user, stably (a counting sort), and ``user_ptr``, the CSR pointer
  over users;
* the entries E, the distinct (user, item) pairs, grouped by user (``entry_ptr``), numbered
  within a user in order of first appearance, with ``entry_item`` per entry and, per
  comparison, the entries of its winner and loser (``pos_w``, ``pos_l``).

Every result is independent of the number of threads: a stable sort has one answer, and the
entries are found per user. Work is split into *spans* of rows (the sort) or *blocks* of
whole users of about equal size (the entries); both only decide who does what. The few
O(n_users) steps between the kernels (prefix sums) are numpy calls in the caller.

Each ``prange`` body only calls a plain ``@njit`` helper: numba compiles a loop written
inline in a ``prange`` body into code about 3x slower on one thread (a histogram over 30M
ids: 0.18 s as a helper, 0.55 s inline).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from solvers._random import GOLDEN

_S32 = np.uint64(32)


@njit(cache=True)
def _span(n, n_spans, t):
    """Rows [lo, hi) of span t when 0..n-1 is cut into n_spans near-equal spans."""
    return n * t // n_spans, n * (t + 1) // n_spans


@njit(cache=True)
def _check_span(users, winners, losers, lo, hi):
    """(smallest id, first row with winner == loser or −1, largest user, largest item) of
    rows lo..hi-1."""
    m = np.int64(0)
    s = np.int64(-1)
    mu = np.int64(-1)
    mi = np.int64(-1)
    for r in range(lo, hi):
        u = np.int64(users[r])
        w = np.int64(winners[r])
        k = np.int64(losers[r])
        m = min(m, min(u, min(w, k)))
        mu = max(mu, u)
        mi = max(mi, max(w, k))
        if w == k and s < 0:
            s = r
    return m, s, mu, mi


@njit(parallel=True, cache=True)
def check_ids(users, winners, losers, n_spans):
    """One pass over the comparisons for the checks of ``AltSVM.fit``.

    Returns (smallest id of all three columns, first row whose winner equals its loser or −1,
    largest user id, largest item id); the caller raises, naming the row, when an id is
    negative or a row compares an item with itself.
    """
    n = users.shape[0]
    out = np.empty((n_spans, 4), np.int64)
    for t in prange(n_spans):
        lo, hi = _span(n, n_spans, t)
        out[t, 0], out[t, 1], out[t, 2], out[t, 3] = _check_span(users, winners, losers, lo, hi)
    first_same = -1
    for t in range(n_spans):
        if out[t, 1] >= 0:
            first_same = out[t, 1]
            break
    return out[:, 0].min(), first_same, out[:, 2].max(), out[:, 3].max()


@njit(cache=True)
def _count_span(users, lo, hi, n_users, row):
    """row[i] = rows of user i < n_users among rows lo..hi-1; returns whether they are in
    user order (the first compared with the row before it)."""
    ordered = True
    prev = users[lo - 1] if lo > 0 else users[lo]
    for r in range(lo, hi):
        u = users[r]
        if u < n_users:  # (warm-start keys may name users beyond n_users)
            row[u] += 1
        if u < prev:
            ordered = False
        prev = u
    return ordered


@njit(parallel=True, cache=True)
def count_users(users, n_users, n_spans):
    """counts[t, i] = rows of user i < n_users in span t; and whether the rows are sorted by
    user."""
    n = users.shape[0]
    counts = np.zeros((n_spans, n_users), np.int64)
    ordered = np.ones(n_spans, np.bool_)
    for t in prange(n_spans):
        lo, hi = _span(n, n_spans, t)
        if hi > lo:
            ordered[t] = _count_span(users, lo, hi, n_users, counts[t])
    return counts, ordered.all()


@njit(cache=True)
def _add_rows(counts, lo, hi, out):
    for i in range(lo, hi):
        out[i] = 0
    for t in range(counts.shape[0]):
        for i in range(lo, hi):
            out[i] += counts[t, i]


@njit(parallel=True, cache=True)
def user_totals(counts):
    """Rows per user, Σ_t counts[t, i] (the caller's prefix sum gives ``user_ptr``)."""
    n_spans, n_users = counts.shape
    out = np.empty(n_users, np.int64)
    for t in prange(n_spans):
        lo, hi = _span(n_users, n_spans, t)
        _add_rows(counts, lo, hi, out)
    return out


@njit(cache=True)
def _first_positions(counts, user_ptr, lo, hi):
    """counts[:, lo:hi] -> where each span writes its first row of each user lo..hi-1."""
    for i in range(lo, hi):
        at = user_ptr[i]
        for t in range(counts.shape[0]):
            m = counts[t, i]
            counts[t, i] = at
            at += m


@njit(cache=True)
def _scatter_span(users, winners, losers, lo, hi, row, cu, cw, cl):
    for r in range(lo, hi):
        u = users[r]
        p = row[u]
        row[u] = p + 1
        cu[p] = u
        cw[p] = winners[r]
        cl[p] = losers[r]


@njit(parallel=True, cache=True)
def scatter_by_user(users, winners, losers, counts, user_ptr, cu, cw, cl):
    """Stable counting sort by user into ``cu, cw, cl``, given ``count_users``'s counts and
    ``user_ptr``. Span t's rows of user i go to user_ptr[i] + Σ_{t' < t} counts[t', i]
    onwards, in their order; ``counts`` is overwritten with those write positions."""
    n_spans, n_users = counts.shape
    n = users.shape[0]
    for t in prange(n_spans):
        lo, hi = _span(n_users, n_spans, t)
        _first_positions(counts, user_ptr, lo, hi)
    for t in prange(n_spans):
        lo, hi = _span(n, n_spans, t)
        _scatter_span(users, winners, losers, lo, hi, counts[t], cu, cw, cl)


@njit(cache=True)
def _capacity(m, n_items):
    """Hash table size for a user with m comparisons: a power of two >= 2 x their distinct
    items (at most min(2m, n_items)), so probes stay short."""
    distinct = min(2 * m, n_items)
    cap = 2
    while cap < 2 * distinct:
        cap *= 2
    return cap


@njit(cache=True)
def _slot(item, mask):
    """Home slot of ``item`` in a table of mask + 1 slots (Fibonacci hashing)."""
    return np.int64(((np.uint64(item) * GOLDEN) >> _S32) & np.uint64(mask))


@njit(cache=True)
def _number_entries(lo_user, hi_user, user_ptr, cw, cl, n_items, pos_w, pos_l, n_entries):
    """:func:`count_entries` for users lo_user..hi_user-1, with one table for them all."""
    biggest = 0
    for i in range(lo_user, hi_user):
        biggest = max(biggest, user_ptr[i + 1] - user_ptr[i])
    size = _capacity(biggest, n_items)
    keys = np.empty(size, np.int64)
    ids = np.empty(size, np.int64)
    for i in range(lo_user, hi_user):
        cap = _capacity(user_ptr[i + 1] - user_ptr[i], n_items)
        mask = cap - 1
        for h in range(cap):
            keys[h] = -1
        k = 0
        for c in range(user_ptr[i], user_ptr[i + 1]):
            for side in range(2):
                item = np.int64(cw[c] if side == 0 else cl[c])
                h = _slot(item, mask)
                while keys[h] >= 0 and keys[h] != item:
                    h = (h + 1) & mask
                if keys[h] < 0:
                    keys[h] = item
                    ids[h] = k
                    k += 1
                if side == 0:
                    pos_w[c] = ids[h]
                else:
                    pos_l[c] = ids[h]
        n_entries[i] = k


@njit(parallel=True, cache=True)
def count_entries(blocks, user_ptr, cw, cl, n_items, pos_w, pos_l, n_entries):
    """Per user, number the distinct items of its comparisons by first appearance (winner
    before loser, comparisons in order): pos_w[c], pos_l[c] get the numbers of c's winner and
    loser within the user (an open-addressing table per user), n_entries[i] their count.

    Users are taken in ``blocks`` (block q: users blocks[q]..blocks[q + 1] − 1), each with a
    table sized to its largest user, so scratch is O(comparisons of one user), not O(items).
    """
    for q in prange(blocks.shape[0] - 1):
        _number_entries(blocks[q], blocks[q + 1], user_ptr, cw, cl, n_items, pos_w, pos_l,
                        n_entries)


@njit(cache=True)
def _place_entries(lo_user, hi_user, user_ptr, cw, cl, entry_ptr, pos_w, pos_l, entry_item):
    for i in range(lo_user, hi_user):
        base = entry_ptr[i]
        for c in range(user_ptr[i], user_ptr[i + 1]):
            pw = pos_w[c] + base
            pl = pos_l[c] + base
            pos_w[c] = pw
            pos_l[c] = pl
            entry_item[pw] = cw[c]
            entry_item[pl] = cl[c]


@njit(parallel=True, cache=True)
def fill_entries(blocks, user_ptr, cw, cl, entry_ptr, pos_w, pos_l, entry_item):
    """Turn :func:`count_entries`' per-user numbers into entry indices (+ entry_ptr[i]) and
    write each entry's item."""
    for q in prange(blocks.shape[0] - 1):
        _place_entries(blocks[q], blocks[q + 1], user_ptr, cw, cl, entry_ptr, pos_w, pos_l,
                       entry_item)


# --------------------------------------------------------------------------------------------
# the V-step's strata (see :func:`solvers._altsvm_kernels.vstep_strata` for the schedule)
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def _pair_key(w, lo, item_block, n_blocks):
    """Key of the unordered item-block pair {b(w), b(lo)}: min · n_blocks + max."""
    bw = item_block[w]
    bl = item_block[lo]
    return min(bw, bl) * n_blocks + max(bw, bl)


@njit(cache=True)
def _count_pairs_span(winners, losers, item_block, n_blocks, lo, hi, row):
    for r in range(lo, hi):
        row[_pair_key(winners[r], losers[r], item_block, n_blocks)] += 1


@njit(parallel=True, cache=True)
def count_pairs(winners, losers, item_block, n_blocks, n_spans):
    """counts[t, key] = comparisons of span t whose items fall in the block pair ``key``
    (:func:`_pair_key`)."""
    n = winners.shape[0]
    counts = np.zeros((n_spans, n_blocks * n_blocks), np.int64)
    for t in prange(n_spans):
        lo, hi = _span(n, n_spans, t)
        _count_pairs_span(winners, losers, item_block, n_blocks, lo, hi, counts[t])
    return counts


@njit(cache=True)
def _scatter_tasks_span(users, winners, losers, item_block, n_blocks, task_of_key, item_new, lo,
                        hi, row, perm, tu, tw, tl):
    for r in range(lo, hi):
        t = task_of_key[_pair_key(winners[r], losers[r], item_block, n_blocks)]
        p = row[t]
        row[t] = p + 1
        perm[p] = r
        tu[p] = users[r]
        tw[p] = item_new[winners[r]]
        tl[p] = item_new[losers[r]]


@njit(parallel=True, cache=True)
def scatter_by_task(users, winners, losers, item_block, n_blocks, task_of_key, item_new, starts,
                    perm, tu, tw, tl):
    """Stable counting sort of the comparisons by task (``task_of_key`` of their block pair):
    span t writes its rows of task k from ``starts[t, k]`` on, in their order. perm[p] is the
    row that lands at position p; ``tu`` gets its user, ``tw, tl`` its items relabelled by
    ``item_new``. ``starts`` is overwritten."""
    n = winners.shape[0]
    n_spans = starts.shape[0]
    for t in prange(n_spans):
        lo, hi = _span(n, n_spans, t)
        _scatter_tasks_span(users, winners, losers, item_block, n_blocks, task_of_key, item_new,
                            lo, hi, starts[t], perm, tu, tw, tl)
