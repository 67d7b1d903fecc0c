"""Tests of solvers.pairs against brute-force references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solvers import pairs_from_ratings
from solvers.pairs import implicit_comparisons, split_ratings_per_user


def random_ratings(seed=0, n_users=12, n_items=30, per_user=(0, 15)):
    rng = np.random.default_rng(seed)
    users, items, ratings = [], [], []
    for u in rng.permutation(n_users):
        m = rng.integers(*per_user)
        chosen = rng.choice(n_items, size=m, replace=False)
        users += [u] * m
        items += list(chosen)
        ratings += list(rng.integers(1, 6, m))
    return np.array(users, dtype=np.int64), np.array(items, dtype=np.int64), np.array(ratings)


def brute_force_pairs(users, items, ratings):
    out = set()
    for a, b in itertools.combinations(range(len(users)), 2):
        if users[a] == users[b] and ratings[a] != ratings[b]:
            w, lo = (a, b) if ratings[a] > ratings[b] else (b, a)
            out.add((users[a], items[w], items[lo]))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_all_pairs_match_brute_force(seed):
    users, items, ratings = random_ratings(seed)
    c = pairs_from_ratings(users, items, ratings)
    assert c.dtype == np.int64 and c.shape[1] == 3
    assert set(map(tuple, c.tolist())) == brute_force_pairs(users, items, ratings)
    assert len(c) == len(brute_force_pairs(users, items, ratings))  # no duplicates
    assert (np.diff(c[:, 0]) >= 0).all()  # sorted by user


@pytest.mark.parametrize("strategy", ["random", "largest_gap"])
def test_subsampling_keeps_at_most_max_pairs_per_user(strategy):
    users, items, ratings = random_ratings(5, per_user=(5, 20))
    full = brute_force_pairs(users, items, ratings)
    r = {(u, i): x for u, i, x in zip(users, items, ratings)}
    c = pairs_from_ratings(users, items, ratings, max_pairs_per_user=7, strategy=strategy,
                           random_state=3)
    got = set(map(tuple, c.tolist()))
    assert got <= full and len(got) == len(c)
    for u in np.unique(users):
        all_u = [p for p in full if p[0] == u]
        got_u = [p for p in got if p[0] == u]
        assert len(got_u) == min(7, len(all_u))
        if strategy == "largest_gap" and len(all_u) > 7:
            gap = lambda p: r[(p[0], p[1])] - r[(p[0], p[2])]  # noqa: E731
            left_out = [p for p in all_u if p not in got_u]
            assert min(map(gap, got_u)) >= max(map(gap, left_out))
    again = pairs_from_ratings(users, items, ratings, max_pairs_per_user=7, strategy=strategy,
                               random_state=3)
    np.testing.assert_array_equal(c, again)


def test_ties_only_give_no_pairs():
    c = pairs_from_ratings([0, 0, 1], [1, 2, 1], [4, 4, 5])
    assert c.shape == (0, 3)
    assert pairs_from_ratings([], [], []).shape == (0, 3)


@pytest.mark.parametrize("args, match", [
    (([0, 0], [1, 1], [3, 4]), r"\(user 0, item 1\) is rated twice, at positions 0 and 1"),
    (([0, 0], [1, 2], [3, np.nan]), r"ratings contains .*nan.* at position 1"),
    (([0, -1], [1, 2], [3, 4]), r"users contains -1 at position 1"),
    (([0, 1], [1, 2.5], [3, 4]), r"items contains 2.5 at position 1"),
    (([0, 1], [1, 2], [3]), "lengths 2, 2 and 1"),
])
def test_bad_ratings_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        pairs_from_ratings(*args)


def test_bad_subsampling_arguments():
    with pytest.raises(ValueError, match="strategy is 'best'"):
        pairs_from_ratings([0, 0], [1, 2], [1, 2], strategy="best")
    with pytest.raises(ValueError, match="max_pairs_per_user is 0"):
        pairs_from_ratings([0, 0], [1, 2], [1, 2], max_pairs_per_user=0)


def test_split_per_user_follows_the_paper_protocol():
    users, _, _ = random_ratings(7, n_users=30, per_user=(3, 25))
    train, test = split_ratings_per_user(users, n_train=8, min_test=4, random_state=0)
    assert len(np.intersect1d(train, test)) == 0
    counts = np.bincount(users)
    for u in range(len(counts)):
        tr, te = (users[train] == u).sum(), (users[test] == u).sum()
        if counts[u] >= 12:
            assert tr == 8 and te == counts[u] - 8
        else:
            assert tr == te == 0
    t2, _ = split_ratings_per_user(users, n_train=8, min_test=4, random_state=0)
    np.testing.assert_array_equal(train, t2)
    t3, _ = split_ratings_per_user(users, n_train=8, min_test=4, random_state=1)
    assert not np.array_equal(train, t3)


@pytest.mark.parametrize("strategy", ["random", "largest_gap"])
def test_subsample_does_not_depend_on_the_thread_count(strategy):
    import numba

    rng = np.random.default_rng(5)
    users = np.repeat(np.arange(60), 30)
    items = np.tile(np.arange(30), 60)
    ratings = rng.integers(1, 6, users.size).astype(float)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = pairs_from_ratings(users, items, ratings, max_pairs_per_user=40,
                                 strategy=strategy, random_state=2)
        numba.set_num_threads(before)
        many = pairs_from_ratings(users, items, ratings, max_pairs_per_user=40,
                                  strategy=strategy, random_state=2)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(one, many)
    assert np.bincount(one[:, 0]).max() <= 40


def test_capped_subsample_keeps_old_choices_when_the_data_grows():
    """Stable subsampling: a pair kept among more competitors was kept among fewer, and most
    of yesterday's kept pairs are kept today (their duals survive a warm start)."""
    rng = np.random.default_rng(11)
    users = np.repeat(np.arange(30), 40)
    items = np.tile(np.arange(40), 30)
    ratings = rng.integers(1, 6, users.size).astype(float)
    grown = rng.random(users.size) < 0.95          # yesterday: 95% of the ratings
    old = pairs_from_ratings(users[grown], items[grown], ratings[grown], max_pairs_per_user=60,
                             random_state=4)
    new = pairs_from_ratings(users, items, ratings, max_pairs_per_user=60, random_state=4)
    old_set, new_set = set(map(tuple, old.tolist())), set(map(tuple, new.tolist()))
    full_old = set(map(tuple, pairs_from_ratings(users[grown], items[grown],
                                                 ratings[grown]).tolist()))
    assert (new_set & full_old) <= old_set        # kept now and possible then: kept then
    assert len(new_set & old_set) >= 0.8 * len(old_set)
    # the previous (per-user seeded) draw kept about 1/3 of its choices
    assert np.bincount(new[:, 0]).max() <= 60


def test_implicit_comparisons_sample_unmet_items_stably():
    rng = np.random.default_rng(3)
    users = rng.integers(0, 40, 600)
    items = rng.integers(0, 120, 600)
    c = implicit_comparisons(users, items, 120, per_interaction=5, random_state=7)
    met = set(zip(users.tolist(), items.tolist()))
    n_pairs = len(met)
    assert len(c) == 5 * n_pairs
    assert all((u, w) in met for u, w, _ in c.tolist())
    assert not any((u, j) in met for u, _, j in c.tolist())
    assert (np.diff(c[:, 0]) >= 0).all()
    again = implicit_comparisons(users, items, 120, per_interaction=5, random_state=7)
    np.testing.assert_array_equal(c, again)
    # grown data: each old interaction keeps its samples unless one became an interaction
    more = np.r_[users, rng.integers(0, 40, 60)], np.r_[items, rng.integers(0, 120, 60)]
    grown = implicit_comparisons(*more, 120, per_interaction=5, random_state=7)
    met_now = set(zip(more[0].tolist(), more[1].tolist()))
    old_rows = set(map(tuple, c.tolist()))
    still_valid = {r for r in old_rows if (r[0], r[2]) not in met_now}
    assert still_valid <= set(map(tuple, grown.tolist()))
    # a grown catalog (120 -> 123 items, within the same power of two) keeps most samples
    wider = implicit_comparisons(users, items, 123, per_interaction=5, random_state=7)
    kept = len(old_rows & set(map(tuple, wider.tolist()))) / len(old_rows)
    assert kept >= 0.9, f"only {kept:.0%} of the samples survived 3 new items"
    capped = implicit_comparisons(users, items, 120, per_interaction=5, max_per_user=7,
                                  random_state=7)
    assert np.bincount(capped[:, 0]).max() <= 7
    assert set(map(tuple, capped.tolist())) <= set(map(tuple, c.tolist()))


def test_implicit_comparisons_per_user_budget_and_positives():
    rng = np.random.default_rng(4)
    users = np.r_[np.zeros(3, int), np.ones(40, int), np.full(8, 2)]
    items = np.r_[rng.choice(200, 3, replace=False), rng.choice(200, 40, replace=False),
                  rng.choice(200, 8, replace=False)]
    positive = np.ones(len(users), bool)
    positive[users == 2] = False            # user 2 met items but likes none
    positive[np.flatnonzero(users == 1)[:10]] = False
    c = implicit_comparisons(users, items, 200, per_user=30, positive=positive,
                             random_state=3)
    # every user with a positive gets the same budget, however many positives they have
    assert np.bincount(c[:, 0], minlength=3).tolist() == [30, 30, 0]
    met = set(zip(users.tolist(), items.tolist()))
    pos = set(zip(users[positive].tolist(), items[positive].tolist()))
    assert all((u, w) in pos for u, w, _ in c.tolist())           # winners: positives only
    assert not any((u, j) in met for u, _, j in c.tolist())       # losers: never met
    # user 0's 3 positives share its 30 evenly; user 1's 30 spread over its 30 positives
    assert np.bincount(np.unique(c[c[:, 0] == 0, 1], return_inverse=True)[1]).min() == 10
    assert len(np.unique(c[c[:, 0] == 1, 1])) >= 15
    # a new positive for user 1 keeps most of its comparisons (stable hashes)
    new_item = np.setdiff1d(np.arange(200), items)[0]
    grown = implicit_comparisons(np.r_[users, 1], np.r_[items, new_item], 200, per_user=30,
                                 positive=np.r_[positive, True], random_state=3)
    old1 = set(map(tuple, c[c[:, 0] == 1].tolist()))
    new1 = set(map(tuple, grown[grown[:, 0] == 1].tolist()))
    assert len(old1 & new1) >= 0.8 * len(old1)
    with pytest.raises(ValueError, match="positive has shape"):
        implicit_comparisons(users, items, 200, positive=positive[:-1])
    with pytest.raises(ValueError, match="per_user is 0"):
        implicit_comparisons(users, items, 200, per_user=0)


def test_popularity_sampling_prefers_popular_items():
    rng = np.random.default_rng(5)
    items = np.minimum(rng.zipf(1.6, 5000), 300) - 1
    users = rng.integers(0, 400, 5000)
    uni = implicit_comparisons(users, items, 300, per_interaction=4, random_state=1)
    pop = implicit_comparisons(users, items, 300, per_interaction=4, sampling="popularity",
                               random_state=1)
    head = np.bincount(items, minlength=300).argsort()[-10:]   # the 10 most met items
    assert np.isin(pop[:, 2], head).mean() > 3 * np.isin(uni[:, 2], head).mean()
    with pytest.raises(ValueError, match="sampling is 'zipf'"):
        implicit_comparisons(users, items, 300, sampling="zipf")
    with pytest.raises(ValueError, match="items holds 299, but n_items is 10"):
        implicit_comparisons(users, items, 10)


def test_popularity_sampling_draws_by_the_given_counts_and_keeps_its_draws_as_data_grows():
    """Losers are drawn in proportion to (popularity + 1)^0.75; the default popularity is how many
    users met each item; counts handed from an earlier run keep nearly every draw of the
    grown data where it was, while counts taken afresh move most of them."""
    rng = np.random.default_rng(7)
    users, items = rng.integers(0, 3000, 40_000), np.minimum(rng.zipf(1.3, 40_000), 2000) - 1
    args = dict(per_user=50, max_per_positive=10, sampling="popularity", random_state=3)
    met = np.unique(users * 2000 + items) % 2000
    own = np.bincount(met, minlength=2000)
    first = implicit_comparisons(users, items, 2000, **args)
    assert np.array_equal(first, implicit_comparisons(users, items, 2000, popularity=own, **args))
    # the draws follow the weights: a flat popularity over the unpopular half of the catalogue
    flat = np.zeros(2000, np.int64)
    flat[1000:] = 99
    drawn = implicit_comparisons(users, items, 2000, popularity=flat, **args)[:, 2]
    assert 0.96 < (drawn >= 1000).mean() < 0.975           # 100^0.75 = 31.6: 31.6 / 32.6
    more = rng.integers(0, 3000, 800), np.minimum(rng.zipf(1.3, 800), 2000) - 1
    grown = np.r_[users, more[0]], np.r_[items, more[1]]
    rows = lambda c: set(map(tuple, c.tolist()))   # noqa: E731
    kept = len(rows(first) & rows(implicit_comparisons(*grown, 2000, popularity=own, **args)))
    moved = len(rows(first) & rows(implicit_comparisons(*grown, 2000, **args)))
    assert kept > 0.9 * len(first) and moved < 0.5 * len(first)
    # a popularity shorter than the catalogue: the items past it weigh 1
    padded = np.r_[own[:10], np.zeros(1990, np.int64)]
    assert np.array_equal(implicit_comparisons(users, items, 2000, popularity=own[:10], **args),
                          implicit_comparisons(users, items, 2000, popularity=padded, **args))
    with pytest.raises(ValueError, match="popularity has shape \\(2, 2\\) and dtype float64"):
        implicit_comparisons(users, items, 2000, popularity=np.ones((2, 2)), **args)
    with pytest.raises(ValueError, match="expected counts in \\[0, 2\\*\\*40\\)"):
        implicit_comparisons(users, items, 2000, popularity=np.array([2**63], np.uint64), **args)
    unsigned = implicit_comparisons(users, items, 2000, popularity=own.astype(np.uint16), **args)
    assert np.array_equal(unsigned, first)


def test_implicit_comparisons_per_user_capped_per_positive():
    """With ``max_per_positive`` a user's comparisons are min(per_user, positives x cap): they
    grow with the positives, and a user with many positives keeps the per-user budget."""
    rng = np.random.default_rng(5)
    counts = [1, 3, 60]
    users = np.repeat(np.arange(3), counts)
    items = np.concatenate([rng.choice(500, n, replace=False) for n in counts])
    capped = implicit_comparisons(users, items, 500, per_user=100, max_per_positive=10,
                                  random_state=2)
    assert np.bincount(capped[:, 0], minlength=3).tolist() == [10, 30, 100]
    # the capped rows of a user are the uncapped draws of the same (user, item, k): no new draws
    full = implicit_comparisons(users, items, 500, per_user=100, random_state=2)
    assert set(map(tuple, capped[capped[:, 0] < 2].tolist())) <= set(map(tuple, full.tolist()))
    with pytest.raises(ValueError, match="max_per_positive is 0"):
        implicit_comparisons(users, items, 500, per_user=100, max_per_positive=0)
