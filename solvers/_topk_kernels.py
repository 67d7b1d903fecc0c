"""Jitted exact top-K selection over rows of scores. Plain arrays in, plain arrays out.

Nothing but the kernels lives here; ``solvers/topk.py`` validates inputs and calls them.

Order: descending score; equal scores rank the lower column index first (the order of
``np.argsort(-scores, kind="stable")``). Entries equal to -inf or NaN never rank: -inf marks an
excluded column.

Method (per row of n scores):

1. One pass takes the maximum of every chunk of ``CHUNK`` entries (a branch-free reduction);
   the k-th largest of those maxima is a threshold at least k entries reach (one in each of
   those chunks), so every entry of the top k reaches it too.
2. Only the chunks whose maximum reaches it are read again, for the columns that do (on
   random rows about k chunks of the row's n / CHUNK, and about 1.3k columns).
3. Those candidates are ranked exactly by sortable 64-bit keys (score bits << 32 | ~index).

If more than ``8k`` entries reach the threshold (ties), or fewer than k chunks hold a score,
the row is redone exactly by a buffered selection over all entries. The result is exact in
every case; the threshold only decides how much work is done.
"""

from __future__ import annotations

import numba as nb
import numpy as np

_LOW = np.uint64(0xFFFFFFFF)
_SIGN = np.uint32(0x80000000)
_SHIFT = np.uint64(32)
CHUNK = 32      # entries per chunk of a row (step 1 of the method)
# a sparse score row touching more than 1/DENSE_SHARE of the columns is ranked as a dense row
# (one pass of chunk maxima) instead of from its touched columns: on synthetic-1m an item-kNN's
# rows touched up to 38k of 38k items, and sorting them was 2 ms a user
DENSE_SHARE = 8


@nb.njit(cache=True, nogil=True, inline="always")
def chunks(n):
    """The chunks of a row of ``n`` entries: the length of a row's ``maxima`` scratch."""
    return (n + CHUNK - 1) // CHUNK


@nb.njit(cache=True, nogil=True, inline="always")
def _key(bits, t):
    b = bits[t]
    b = ~b if b & _SIGN else b | _SIGN
    return (np.uint64(b) << _SHIFT) | (_LOW - np.uint64(t))


@nb.njit(cache=True, nogil=True, inline="always")
def _index(key):
    return np.int64(_LOW - (key & _LOW))


@nb.njit(cache=True, nogil=True)
def _chunk_threshold(scores, k, maxima):
    """The k-th largest of the row's chunk maxima, which fill ``maxima`` (float32 scratch of
    at least ``chunks(n)``); -inf when the row is short or fewer than k chunks hold a score
    above -inf. NaN never counts."""
    n = scores.shape[0]
    if n <= 8 * k:
        return -np.inf
    full = n // CHUNK
    live = 0
    for c in range(full):
        m = np.float32(-np.inf)
        for t in range(c * CHUNK, c * CHUNK + CHUNK):
            s = scores[t]
            m = s if s > m else m
        maxima[c] = m
        live += m > -np.inf
    nc = chunks(n)
    if nc > full:
        m = np.float32(-np.inf)
        for t in range(full * CHUNK, n):
            s = scores[t]
            m = s if s > m else m
        maxima[full] = m
        live += m > -np.inf
    if live < k:
        return -np.inf
    return np.partition(maxima[:nc], nc - k)[nc - k]


@nb.njit(cache=True, nogil=True)
def _select_all(scores, bits, k, keys):
    """Exact fallback: keys of the best ``k`` entries of the whole row, unsorted, in
    ``keys[:count]``, by a buffer compacted to its best ``k`` whenever it fills."""
    n = scores.shape[0]
    cap = keys.shape[0]
    cnt = 0
    thr = -np.inf
    thr_key = np.uint64(0)
    for t in range(n):
        s = scores[t]
        if s >= thr and s > -np.inf:
            key = _key(bits, t)
            if key > thr_key:
                keys[cnt] = key
                cnt += 1
                if cnt == cap:  # keep the best k, raise the threshold to the k-th
                    keys[:] = np.partition(keys, cap - k)
                    keys[:k] = keys[cap - k:]
                    cnt = k
                    thr_key = keys[:k].min()
                    thr = scores[_index(thr_key)]
    return cnt


@nb.njit(cache=True, nogil=True)
def row_topk(scores, k, out_i, out_s, keys, maxima):
    """Top ``k`` of one float32 row into ``out_i``/``out_s``; returns the count found.

    ``keys`` (uint64, length >= 8k) and ``maxima`` (float32, length >= ``chunks(n)``) are
    scratch.
    """
    if k == 0:
        return 0
    bits = scores.view(np.uint32)
    thr = _chunk_threshold(scores, k, maxima)
    cnt = 0
    cap = keys.shape[0]
    if thr > -np.inf:
        n = scores.shape[0]
        for c in range(chunks(n)):
            if maxima[c] >= thr:
                for t in range(c * CHUNK, min(n, c * CHUNK + CHUNK)):
                    if scores[t] >= thr:
                        if cnt < cap:
                            keys[cnt] = _key(bits, t)
                        cnt += 1
    if cnt < k or cnt > cap:
        cnt = _select_all(scores, bits, k, keys)
    m = min(cnt, k)
    top = np.sort(keys[:cnt])
    for p in range(m):
        i = _index(top[cnt - 1 - p])
        out_i[p] = i
        out_s[p] = scores[i]
    return m


@nb.njit(cache=True, nogil=True)
def block_topk(scores, seen_indptr, seen_indices, row_offset, k, out_i, out_s, counts):
    """Top ``k`` columns of every row of ``scores`` (B x n float32, overwritten), excluding the
    columns listed for row ``row_offset + r`` in the CSR pair (``seen_indptr``,
    ``seen_indices``).

    Writes ``out_i`` (B x k int32), ``out_s`` (B x k float32) in descending score order and
    ``counts`` (B,) with the number of entries per row (fewer than ``k`` when a row has fewer
    than ``k`` eligible columns). Single-threaded and GIL-free: callers run blocks in threads.
    """
    n_rows = scores.shape[0]
    keys = np.empty(max(8 * k, 16), dtype=np.uint64)
    maxima = np.empty(chunks(scores.shape[1]), dtype=np.float32)
    for r in range(n_rows):
        row = scores[r]
        u = row_offset + r
        for p in range(seen_indptr[u], seen_indptr[u + 1]):
            row[seen_indices[p]] = -np.inf
        counts[r] = row_topk(row, k, out_i[r], out_s[r], keys, maxima)


@nb.njit(cache=True, nogil=True)
def mixed_block_topk(first, second, weights, seen_indptr, seen_indices, row_offset, k, out_i,
                     out_s, counts):
    """:func:`block_topk` of ``w · first + (1 − w) · second`` (B x n float32 each, kept) for
    every ``w`` of ``weights`` (float32): ``out_i``/``out_s`` are W x B x k, ``counts`` W x B.
    Each row of the mix is made in a buffer the size of one row and ranked there, so a row of
    the two is read from memory once for all the weights (one mixed matrix per weight was four
    passes over memory per weight). The mix rounds as numpy's ``w·a`` then ``+= (1−w)·b`` does.
    """
    n_rows, n = first.shape
    keys = np.empty(max(8 * k, 16), dtype=np.uint64)
    maxima = np.empty(chunks(n), dtype=np.float32)
    row = np.empty(n, dtype=np.float32)
    for r in range(n_rows):
        a, b, u = first[r], second[r], row_offset + r
        for x in range(weights.shape[0]):
            w = weights[x]
            v = np.float32(1.0) - w
            for j in range(n):
                row[j] = w * a[j] + v * b[j]
            for p in range(seen_indptr[u], seen_indptr[u + 1]):
                row[seen_indices[p]] = -np.inf
            counts[x, r] = row_topk(row, k, out_i[x, r], out_s[x, r], keys, maxima)


@nb.njit(cache=True, nogil=True)
def _ranked(scores, cols, take, out_i, out_s, r, m):
    """Write the best ``take`` of (score, column) pairs into row ``r`` of the outputs from
    position ``m``, ranked as :func:`_key` ranks (score descending, then the lower column);
    returns the next position."""
    if take <= 0:
        return m
    bits = scores.view(np.uint32)
    keys = np.empty(scores.shape[0], np.uint64)
    for j in range(scores.shape[0]):
        b = bits[j]
        b = ~b if b & _SIGN else b | _SIGN
        keys[j] = (np.uint64(b) << _SHIFT) | (_LOW - np.uint64(cols[j]))
    if take < keys.shape[0]:        # keys are distinct: the partition's top part is exact
        keys = np.partition(keys, keys.shape[0] - take)[keys.shape[0] - take:]
    keys = np.sort(keys)[::-1][:take]
    head = np.empty(keys.shape[0], np.uint32)
    for j in range(keys.shape[0]):
        b = np.uint32(keys[j] >> _SHIFT)
        head[j] = b ^ _SIGN if b & _SIGN else ~b
        out_i[r, m + j] = _index(keys[j])
    out_s[r, m:m + keys.shape[0]] = head.view(np.float32)
    return m + keys.shape[0]


@nb.njit(cache=True, nogil=True)
def _sparse_row_topk(cols, vals, n_items, seen, k, out_i, out_s, r, mark):
    """Row ``r`` of the outputs: the top ``k`` of a score row whose entries are ``vals`` at
    ``cols`` (distinct columns, any order) and 0 elsewhere: the positive entries, then zeros in
    column order (absent entries and stored zeros), then the negative entries, each group
    ranked as the dense order ranks it; ``seen`` columns and NaN never rank. ``mark``: int8
    scratch of ``n_items`` zeros, left zero. Returns the count."""
    for j in range(seen.shape[0]):
        mark[seen[j]] = 1
    n_pos = 0
    n_neg = 0
    for j in range(cols.shape[0]):
        c = cols[j]
        s = vals[j]
        if mark[c] == 1 or s == 0.0:
            continue
        if s != s:
            mark[c] = 1      # NaN: never ranks, not even among the zeros
            continue
        mark[c] = 2          # a nonzero entry: not among the zeros
        if s > 0.0:
            n_pos += 1
        else:
            n_neg += 1
    pos_s = np.empty(n_pos, np.float32)
    pos_c = np.empty(n_pos, np.int64)
    neg_s = np.empty(n_neg, np.float32)
    neg_c = np.empty(n_neg, np.int64)
    p = 0
    q = 0
    for j in range(cols.shape[0]):
        c = cols[j]
        if mark[c] == 2:
            if vals[j] > 0.0:
                pos_s[p] = vals[j]
                pos_c[p] = c
                p += 1
            else:
                neg_s[q] = vals[j]
                neg_c[q] = c
                q += 1
    m = _ranked(pos_s, pos_c, min(k, n_pos), out_i, out_s, r, 0)
    t = 0
    while m < k and t < n_items:
        if mark[t] == 0:
            out_i[r, m] = t
            out_s[r, m] = 0.0
            m += 1
        t += 1
    m = _ranked(neg_s[neg_s > -np.inf], neg_c[neg_s > -np.inf], k - m, out_i, out_s, r, m)
    for j in range(seen.shape[0]):
        mark[seen[j]] = 0
    for j in range(cols.shape[0]):
        mark[cols[j]] = 0
    return m


@nb.njit(cache=True, nogil=True)
def sparse_product_topk(indptr, indices, data, b_indptr, b_indices, b_data, row_start,
                        n_items, seen_indptr, seen_indices, k, out_i, out_s, counts, mark):
    """:func:`block_topk` of the rows ``row_start:row_start + len(counts)`` of the product of
    two CSR matrices (an item-kNN's ``X Vᵀ``) without making its rows dense: each row summed
    as :func:`sparse_product_add` sums it (scipy's float32 sums, bit for bit) into a scratch
    row and ranked from the columns it touched (:func:`_sparse_row_topk`), or, past
    1/``DENSE_SHARE`` of the columns, as that dense row (:func:`row_topk`). No CSR product is
    built, and the GIL is free (scipy's product holds it, so the threads of an item-kNN's
    lists took turns). ``mark``: int8 scratch of ``n_items`` zeros, left zero. The same
    lists and scores as the dense rows."""
    sums = np.zeros(n_items, np.float32)
    touched = np.empty(n_items, np.int64)
    vals = np.empty(n_items, np.float32)
    keys = np.empty(max(8 * k, 16), dtype=np.uint64)
    maxima = np.empty(chunks(n_items), dtype=np.float32)
    for r in range(counts.shape[0]):
        u = row_start + r
        m = 0
        for p in range(indptr[u], indptr[u + 1]):
            i = indices[p]
            x = data[p]
            for q in range(b_indptr[i], b_indptr[i + 1]):
                c = b_indices[q]
                if mark[c] == 0:
                    mark[c] = 3
                    touched[m] = c
                    m += 1
                sums[c] += x * b_data[q]
        seen = seen_indices[seen_indptr[u]:seen_indptr[u + 1]]
        if m > n_items // DENSE_SHARE:    # a long row: ranked as the dense row it is
            for j in range(seen.shape[0]):
                sums[seen[j]] = -np.inf
            counts[r] = row_topk(sums, k, out_i[r], out_s[r], keys, maxima)
            for j in range(seen.shape[0]):
                sums[seen[j]] = 0
            for j in range(m):
                sums[touched[j]] = 0
                mark[touched[j]] = 0
            continue
        for j in range(m):
            c = touched[j]
            vals[j] = sums[c]
            sums[c] = 0
            mark[c] = 0
        counts[r] = _sparse_row_topk(touched[:m], vals[:m], n_items, seen, k, out_i, out_s, r,
                                     mark)


@nb.njit(cache=True, nogil=True)
def sparse_product_add(indptr, indices, data, b_indptr, b_indices, b_data, row_start, out):
    """``out[r] += `` row ``row_start + r`` of the product of the CSR matrices (``indptr``,
    ``indices``, ``data``) and (``b_indptr``, ``b_indices``, ``b_data``), every column of it
    (absent ones as 0). Each row is summed in float32 in scipy's order (the row's entries in
    turn, each over the other's row), so the sums are scipy's bit for bit, without its CSR
    result: on an item-kNN's Zipf-popular neighbours that was 5x the time."""
    scratch = np.zeros(out.shape[1], np.float32)
    for r in range(out.shape[0]):
        u = row_start + r
        for p in range(indptr[u], indptr[u + 1]):
            i = indices[p]
            x = data[p]
            for q in range(b_indptr[i], b_indptr[i + 1]):
                scratch[b_indices[q]] += x * b_data[q]
        row = out[r]
        for j in range(row.shape[0]):
            row[j] += scratch[j]
            scratch[j] = 0


@nb.njit(cache=True, nogil=True)
def sparse_dense_add(indptr, indices, data, VT, row_start, out):
    """``out[r] += `` row ``row_start + r`` of the product of the CSR matrix (``indptr``,
    ``indices``, ``data``) and the dense float32 ``VT``: each row summed in float32 in scipy's
    order (the row's entries in turn, each times its row of ``VT``), so the sums are scipy's bit
    for bit, with the GIL free (scipy's product holds it: the threads ranking EASE's or a
    blend's lists took turns)."""
    scratch = np.zeros(out.shape[1], np.float32)
    for r in range(out.shape[0]):
        u = row_start + r
        for p in range(indptr[u], indptr[u + 1]):
            x = data[p]
            v = VT[indices[p]]
            for j in range(scratch.shape[0]):
                scratch[j] += x * v[j]
        row = out[r]
        for j in range(row.shape[0]):
            row[j] += scratch[j]
            scratch[j] = 0


@nb.njit(cache=True, nogil=True)
def global_rows(order, seen_indptr, seen_indices, k, mark, out):
    """Row u of ``out`` (filled with -1 beforehand): the first ``k`` entries of ``order``
    that are not among user u's seen columns (``seen_indptr``/``seen_indices`` rows), each
    user's seen columns marked in ``mark`` (zeros, left clean) while their row is walked:
    O(k + seen) a user."""
    for u in range(seen_indptr.shape[0] - 1):
        lo, hi = seen_indptr[u], seen_indptr[u + 1]
        for p in range(lo, hi):
            mark[seen_indices[p]] = 1
        n = 0
        for t in range(order.shape[0]):
            if n == k:
                break
            if mark[order[t]] == 0:
                out[u, n] = order[t]
                n += 1
        for p in range(lo, hi):
            mark[seen_indices[p]] = 0
