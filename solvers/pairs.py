"""Pairwise comparisons from ratings, and the per-user train/test split of Park et al. (2015).

Pairs are enumerated by the numba kernels of ``solvers._pairs_kernels`` (no Python loop
over users or pairs, and no list of all pairs when a cap subsamples them).
"""

from __future__ import annotations

import numpy as np

from solvers._base import check_choice, check_finite

__all__ = ["implicit_comparisons", "pairs_from_ratings", "split_ratings_per_user"]

_STRATEGIES = ("random", "largest_gap")


def as_ids(name: str, a, *, ndim: int = 1) -> np.ndarray:
    """``a`` as an int64 array of non-negative ids, or ``ValueError`` naming value and position.

    Integer-valued floats are accepted; NaN/inf, fractions and negative values are not.
    """
    a = np.asarray(a)
    if a.ndim != ndim:
        raise ValueError(f"{name} has {a.ndim} dimension(s) (shape {a.shape}), expected {ndim}")
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.integer)
                               or np.issubdtype(a.dtype, np.floating)):
        raise ValueError(f"{name} has dtype {a.dtype}, expected integer ids")
    if np.issubdtype(a.dtype, np.floating):
        check_finite(name, a)
        frac = a != np.floor(a)
        if frac.any():
            pos = _position(frac)
            raise ValueError(f"{name} contains {a[pos].item()!r} at position {pos}; ids must be "
                             "integers")
    neg = a < 0
    if neg.any():
        pos = _position(neg)
        raise ValueError(f"{name} contains {a[pos].item()!r} at position {pos}; ids must be >= 0")
    return a.astype(np.int64, copy=False)


def _position(mask: np.ndarray):
    pos = np.unravel_index(int(np.flatnonzero(mask.ravel())[0]), mask.shape)
    return int(pos[0]) if len(pos) == 1 else tuple(int(p) for p in pos)


def _check_ratings(users, items, ratings):
    users = as_ids("users", users)
    items = as_ids("items", items)
    ratings = np.asarray(ratings, dtype=np.float64)
    if ratings.ndim != 1:
        raise ValueError(f"ratings has shape {ratings.shape}, expected a 1-D array")
    if not (users.shape[0] == items.shape[0] == ratings.shape[0]):
        raise ValueError(f"users, items and ratings have lengths {users.shape[0]}, "
                         f"{items.shape[0]} and {ratings.shape[0]}; expected equal lengths")
    check_finite("ratings", ratings)
    return users, items, ratings


def _group_starts(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a sorted key array: start offset of each run, and each element's run start."""
    n = sorted_keys.shape[0]
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = sorted_keys[1:] != sorted_keys[:-1]
    starts = np.flatnonzero(new_run)
    run_of = np.cumsum(new_run) - 1
    return starts, starts[run_of]


def _run_bounds(sorted_keys: np.ndarray) -> np.ndarray:
    """Boundaries of the runs of equal values in a sorted array: run g is
    ``bounds[g]:bounds[g + 1]`` (int64, ending with the length)."""
    n = sorted_keys.shape[0]
    return np.r_[0, np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1, n].astype(np.int64)


def pairs_from_ratings(users, items, ratings, max_pairs_per_user=None, strategy="random",
                       random_state=None, user_salts=None) -> np.ndarray:
    """Within-user comparisons (user, winner, loser) from explicit ratings.

    Every pair of items rated by the same user with different ratings gives one comparison,
    the higher-rated item winning; ties are dropped (Park et al. 2015, §5.1-5.2).

    Parameters
    ----------
    users, items : array-like of int, shape (n,)
        0-based ids of the rating events. A (user, item) pair may occur only once.
    ratings : array-like of float, shape (n,)
        The ratings; finite.
    max_pairs_per_user : int or None
        Keep at most this many comparisons per user (None: all).
    strategy : {"random", "largest_gap"}
        How to subsample when ``max_pairs_per_user`` is set: uniformly at random, or the pairs
        with the largest rating gaps (the paper's "AltSVM-sub"; ties broken at random). Either
        way the choice is stable: it ranks each pair by a hash of (seed, user, its two items),
        so a pair kept today stays kept when the user rates more items unless new pairs hash
        below it, and a warm start finds most of its duals again.
    random_state : int, numpy.random.Generator or None
        Seed for the subsampling (an integer gives the same choice in every process).
    user_salts : array-like of uint64, indexed by user id, optional
        What the hash takes for each user instead of their id: a caller that numbers a user
        differently elsewhere (the refresher folds one user in as user 0) names them by a
        salt of their own, and the same ratings keep the same pairs in both.

    Returns
    -------
    comparisons : ndarray of int64, shape (m, 3)
        Columns user, winner, loser; sorted by user, then by the positions of the two ratings
        in the input.

    Examples
    --------
    >>> from solvers import pairs_from_ratings
    >>> pairs_from_ratings([0, 0, 0, 1, 1], [3, 4, 5, 3, 4], [5, 1, 5, 2, 4])
    array([[0, 3, 4],
           [0, 5, 4],
           [1, 4, 3]])
    """
    users, items, ratings = _check_ratings(users, items, ratings)
    check_choice("strategy", strategy, _STRATEGIES)
    if max_pairs_per_user is not None:
        if int(max_pairs_per_user) != max_pairs_per_user or max_pairs_per_user < 1:
            raise ValueError(f"max_pairs_per_user is {max_pairs_per_user!r}, expected an "
                             "integer >= 1 or None")
        max_pairs_per_user = int(max_pairs_per_user)
    n = users.shape[0]
    if user_salts is not None and n and len(user_salts) <= int(users.max()):
        raise ValueError(f"user_salts has {len(user_salts)} entries, but users holds "
                         f"{int(users.max())}; expected one salt per user id")
    if n == 0:
        return np.empty((0, 3), dtype=np.int64)

    key = users * (int(items.max()) + 1) + items   # one int64 sort finds repeated pairs
    key_sorted = np.sort(key)
    if (key_sorted[1:] == key_sorted[:-1]).any():
        dup = key_sorted[1:][key_sorted[1:] == key_sorted[:-1]][0]
        a, b = (int(x) for x in np.flatnonzero(key == dup)[:2])
        raise ValueError(f"(user {users[a]}, item {items[a]}) is rated twice, at positions {a} "
                         f"and {b}; expected one rating per (user, item)")

    from solvers._pairs_kernels import count_pairs, fill_pairs

    order = np.argsort(users, kind="stable")  # by user, then input position
    u_s, i_s, r_s = users[order], items[order], ratings[order]
    starts = _run_bounds(u_s)
    counts = count_pairs(starts, r_s)
    cap = -1 if max_pairs_per_user is None else max_pairs_per_user
    size = int(counts.sum() if cap < 0 else np.minimum(counts, cap).sum())
    out = np.empty((size, 3), np.int64)
    salt = (u_s.astype(np.uint64) if user_salts is None
            else np.asarray(user_salts, np.uint64)[u_s])
    fill_pairs(starts, r_s, u_s, salt, i_s, counts, cap, strategy == "largest_gap",
               _seed(random_state), out)
    return out


def _seed(random_state) -> int:
    return int(np.random.default_rng(random_state).integers(2**62))


def popularity_cum(counts, n_items: int) -> np.ndarray:
    """The cumulative integer weights popularity-sampled losers are drawn by, one per item of
    ``n_items`` (``counts`` past its end are 0): 64 per unit of (count + 1)^0.75, + 1 so that
    every item can lose. Computed as √c · √√c (sqrt is correctly rounded: the same draws on
    every machine, where pow may differ in its last bit). Training's draws and a fold-in's
    (:func:`solvers.fold_in.implicit_pairs`) are made by these.

    >>> popularity_cum(np.array([0, 15]), 3).tolist()   # weights 64, 512, 64
    [64, 576, 640]
    """
    c = np.ones(n_items, np.int64)
    counts = np.asarray(counts, np.int64)
    known = min(counts.size, n_items)
    c[:known] += counts[:known]
    root = np.sqrt(c)
    return np.cumsum(np.rint(64.0 * root * np.sqrt(root)).astype(np.int64))


def implicit_comparisons(users, items, n_items, per_interaction=10, sampling="uniform",
                         max_per_user=None, random_state=None, *, positive=None,
                         per_user=None, max_per_positive=None, popularity=None) -> np.ndarray:
    """Comparisons "the user met item i, so i beats an item j the user never met".

    For every interaction (u, i) that is ``positive``, ``per_interaction`` items j are sampled
    among the items u did not meet (uniformly, or ``"popularity"``: in proportion to
    (1 + how many users met them)^0.75, which makes popular items the harder negatives,
    tempered as word2vec tempers its negatives; validation NDCG@10 of one AltSVM setting with
    exponent 1 / 0.75 / 0.5: amazon-beauty 0.0196 / 0.0201 / 0.0181, ml-1m-implicit 0.165 /
    0.174 / 0.180). Each sample depends only
    on (seed, u, i, k) and u's items, so the comparisons are stable as data grows (a warm start
    keeps their duals).

    Parameters
    ----------
    users, items : array-like of int, shape (n,)
        The interactions, 0-based; repeated (user, item) pairs count once.
    n_items : int
        Size of the item id space to sample from.
    per_interaction : int
        Comparisons per positive interaction (unless ``per_user`` is given).
    sampling : {"uniform", "popularity"}
    max_per_user : int or None
        Keep at most this many comparisons per user (those of smallest hash: stable too).
    random_state : int, numpy.random.Generator or None
    positive : array-like of bool, shape (n,), optional
        Which interactions are winners (e.g. ratings >= 4); the others are met, so never
        sampled as losers, but win nothing. Default: all. A repeated pair is positive when
        any of its rows is.
    per_user : int or None
        Give every user with a positive interaction ``per_user`` comparisons in all, spread
        evenly over their positives (ceil(per_user / positives) samples each, then the
        ``per_user`` of smallest hash), instead of ``per_interaction`` per positive: each user
        weighs the same in the loss, as each weighs the same in a per-user metric. Stable as
        data grows: a user's new positive moves only the samples whose hash crosses the cut.
    max_per_positive : int or None
        With ``per_user``: at most this many samples per positive, so a user with p positives
        gets ``min(per_user, p * max_per_positive)`` comparisons. The comparisons then grow
        with the positives, not with the users times ``per_user``: on a sparse catalogue
        (amazon-beauty: 6 positives per user) ``per_user = 1000`` alone draws 170 losers per
        positive, nearly all easy, and 50M comparisons for 52k users.
    popularity : array-like of int, optional
        With ``sampling="popularity"``: the counts losers are drawn by (0 past its end).
        Default: how many of the given users met each item. A loser depends on the weights
        of all items, so counts that move with the data move most losers (2% more events on
        a Zipf-popular set kept 19% of the comparisons); the counts of an earlier run keep
        the draws where they were (95% kept: the rest are the new events' own).

    Returns
    -------
    comparisons : ndarray of int64, shape (m, 3)
        (user, winner, loser) rows, sorted by user. A user who met (nearly) every item gets
        fewer than asked.

    Examples
    --------
    >>> from solvers.pairs import implicit_comparisons
    >>> c = implicit_comparisons([0, 0, 1], [0, 1, 2], n_items=5, per_interaction=2,
    ...                          random_state=0)
    >>> c.shape, bool((c[:, 1] != c[:, 2]).all())
    ((6, 3), True)
    >>> c = implicit_comparisons([0, 0, 1], [0, 1, 2], n_items=5, per_user=3,
    ...                          positive=[True, False, True], random_state=0)
    >>> c[:, :2].tolist()
    [[0, 0], [0, 0], [0, 0], [1, 2], [1, 2], [1, 2]]
    """
    users, items = as_ids("users", users), as_ids("items", items)
    if users.shape != items.shape:
        raise ValueError(f"users and items have lengths {users.shape[0]} and "
                         f"{items.shape[0]}; expected equal lengths")
    n_items = int(n_items)
    if items.size and items.max() >= n_items:
        raise ValueError(f"items holds {int(items.max())}, but n_items is {n_items}")
    for name, value in (("per_interaction", per_interaction), ("per_user", per_user),
                        ("max_per_positive", max_per_positive)):
        if value is not None and (int(value) != value or value < 1):
            raise ValueError(f"{name} is {value!r}, expected an integer >= 1")
    check_choice("sampling", sampling, ("uniform", "popularity"))
    if popularity is not None:
        popularity = np.asarray(popularity)
        if popularity.ndim != 1 or popularity.dtype.kind not in "iu" or (popularity.size and (
                popularity.min() < 0 or popularity.max() >= 2**40)):   # Σ weights < 2⁶³
            raise ValueError(f"popularity has shape {popularity.shape} and dtype "
                             f"{popularity.dtype}; expected counts in [0, 2**40) of one item "
                             "each")
        popularity = popularity.astype(np.int64)
    if positive is not None:
        positive = np.asarray(positive)
        if positive.shape != users.shape or positive.dtype != np.bool_:
            raise ValueError(f"positive has shape {positive.shape} and dtype {positive.dtype}; "
                             f"expected booleans of shape {users.shape}")
    if users.size == 0:
        return np.empty((0, 3), dtype=np.int64)
    from solvers._pairs_kernels import fill_implicit, keep_smallest_rows

    # distinct (user, item) pairs by user, then item, as one int64 key (items < n_items);
    # sort + mask: np.unique of rows, or numpy 2.4's hashing np.unique, take 10-15x longer
    key = users.astype(np.int64) * n_items + items
    order = np.argsort(key, kind="stable")
    key = key[order]
    first = _run_bounds(key)[:-1]
    wins = (np.ones(first.size, dtype=bool) if positive is None
            else np.logical_or.reduceat(positive[order], first))
    key = key[first]
    u, i = key // n_items, key % n_items                 # met pairs, by user then item
    met_starts = _run_bounds(u)
    met_users = u[met_starts[:-1]]
    wu, wi = u[wins], i[wins]                             # winners, by user
    if wu.size == 0:
        return np.empty((0, 3), dtype=np.int64)
    starts = _run_bounds(wu)
    group = np.searchsorted(met_users, wu[starts[:-1]])   # each winner group's met range
    n_pos = np.diff(starts)
    if per_user is None:
        per = np.full(n_pos.size, int(per_interaction), dtype=np.int64)
    else:
        per = -(-int(per_user) // n_pos)                  # ceil(per_user / positives)
        if max_per_positive is not None:
            per = np.minimum(per, int(max_per_positive))
    offsets = np.r_[0, np.cumsum(np.repeat(per, n_pos))].astype(np.int64)
    cum = np.zeros(0, np.int64)
    if sampling == "popularity":
        cum = popularity_cum(np.bincount(i, minlength=n_items) if popularity is None
                             else popularity, n_items)
    out = np.empty((int(offsets[-1]), 3), np.int64)
    ok = np.empty(int(offsets[-1]), np.bool_)
    seed = _seed(random_state)
    fill_implicit(starts, wu, wi, i, met_starts[group], met_starts[group + 1], per, offsets,
                  n_items, cum, seed, out, ok)
    out = _kept(out, ok)
    caps = [c for c in (per_user, max_per_user) if c is not None]
    if caps:   # the rows are grouped by user: keep each user's smallest hashes
        keep = np.empty(len(out), np.bool_)
        keep_smallest_rows(_run_bounds(out[:, 0]), out, seed ^ 1, int(min(caps)), keep)
        out = _kept(out, keep)
    return out


def _kept(rows: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``rows[keep]``, or ``rows`` itself when every row is kept: most draws find a loser and
    most users stay under their caps, and a copy of 7.6M comparisons is 180 MB of fresh pages
    (0.2-1.7 s here, most of making them)."""
    return rows if keep.all() else rows[keep]


def split_ratings_per_user(users, n_train, min_test=10, random_state=None):
    """Per-user holdout of Park et al. (2015, §5.2) and CofiRank (Weimer et al. 2007).

    Users with fewer than ``n_train + min_test`` ratings are dropped; for every other user,
    ``n_train`` of their ratings chosen at random go to training and the rest to test.

    Parameters
    ----------
    users : array-like of int, shape (n,)
        User id of each rating event.
    n_train : int
        Training ratings per user (the paper's N).
    min_test : int
        Users need at least this many ratings beyond ``n_train``.
    random_state : int, numpy.random.Generator or None
        Seed.

    Returns
    -------
    train_idx, test_idx : ndarray of int64
        Positions (into ``users``) of the training and test ratings, each sorted.

    Examples
    --------
    >>> from solvers.pairs import split_ratings_per_user
    >>> tr, te = split_ratings_per_user([0, 0, 0, 1], n_train=2, min_test=1, random_state=0)
    >>> len(tr), len(te)
    (2, 1)
    """
    users = as_ids("users", users)
    if int(n_train) != n_train or n_train < 1:
        raise ValueError(f"n_train is {n_train!r}, expected an integer >= 1")
    if int(min_test) != min_test or min_test < 0:
        raise ValueError(f"min_test is {min_test!r}, expected an integer >= 0")
    rng = np.random.default_rng(random_state)
    n = users.shape[0]
    order = np.lexsort((rng.random(n), users))  # by user, random within user
    u_s = users[order]
    _, start_of = _group_starts(u_s)
    pos = np.arange(n) - start_of
    size = np.bincount(u_s)[u_s]
    eligible = size >= n_train + min_test
    train = order[eligible & (pos < n_train)]
    test = order[eligible & (pos >= n_train)]
    return np.sort(train), np.sort(test)


def warm_up() -> float:
    """Compile, or load from numba's disk cache, the kernels of :func:`pairs_from_ratings`
    (every strategy, with and without a cap) and :func:`implicit_comparisons`; returns the
    seconds.

    >>> seconds = warm_up()
    """
    import time

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    ratings = rng.integers(1, 6, 40).astype(float)
    users, items = np.repeat(np.arange(4), 10), np.tile(np.arange(10), 4)
    for cap, strategy in ((None, "random"), (3, "random"), (3, "largest_gap")):
        pairs_from_ratings(users, items, ratings, max_pairs_per_user=cap, strategy=strategy,
                           random_state=0)
    implicit_comparisons(users, items, 12, per_user=5, positive=ratings >= 3, max_per_user=4,
                         random_state=0)
    return time.perf_counter() - t0
