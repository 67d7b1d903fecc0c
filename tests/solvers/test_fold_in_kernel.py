"""The jitted many-user pairwise fold-in against its numpy reference, one user at a time: the
same optimum (cold and from a start), to the Newton stopping rule's precision; the same rows on
any number of threads."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.fold_in import _squared_hinge_newton, implicit_pairs, pairwise_fold_in_many
from solvers.pairs import popularity_cum


@pytest.mark.parametrize("seed", range(4))
def test_many_users_equal_the_reference_one_by_one(seed):
    rng = np.random.default_rng(seed)
    n_items, rank, reg = 60, 5, float(rng.uniform(0.1, 5.0))
    V = rng.normal(size=(n_items, rank))
    b = rng.normal(size=n_items) if seed % 2 else None
    users = [implicit_pairs(rng.choice(n_items, size=int(rng.integers(1, 12)), replace=False),
                            n_items, int(rng.integers(1, 30))) for _ in range(7)]
    users.append(np.zeros((0, 2), np.int64))            # nothing to fold in: a zero factor
    starts = [None if n % 3 == 0 else rng.normal(size=rank) for n in range(len(users))]
    for given in (None, starts):
        got = pairwise_fold_in_many(V, b, users, reg=reg, loss="squared_hinge", starts=given)
        bias = np.zeros(n_items) if b is None else b
        for n, c in enumerate(users):
            if not len(c):
                assert not got[n].any()
                continue
            want = _squared_hinge_newton(V[c[:, 0]] - V[c[:, 1]], bias[c[:, 0]] - bias[c[:, 1]],
                                         reg)
            np.testing.assert_allclose(got[n], want, rtol=1e-6, atol=1e-7)


def test_the_rows_are_the_same_on_any_number_of_threads():
    import numba

    rng = np.random.default_rng(9)
    n_items, rank = 200, 8
    V, b = rng.normal(size=(n_items, rank)), rng.normal(size=n_items)
    users = [implicit_pairs(rng.choice(n_items, size=int(rng.integers(0, 30)), replace=False),
                            n_items, int(rng.integers(1, 20))) for _ in range(41)]
    starts = [None if n % 2 else rng.normal(size=rank) for n in range(len(users))]
    runs = []
    previous = numba.get_num_threads()
    try:
        for threads in sorted({1, previous}):
            numba.set_num_threads(threads)
            runs.append(pairwise_fold_in_many(V, b, users, reg=0.7, loss="squared_hinge",
                                              starts=starts))
    finally:
        numba.set_num_threads(previous)
    assert all(np.array_equal(runs[0], r) for r in runs) and runs[0].any()


def test_the_hinge_and_bad_indices():
    V = np.eye(3)
    got = pairwise_fold_in_many(V, None, [[[0, 2]], [[1, 0]]], reg=1.0, loss="hinge")
    assert got[0] @ V[0] > got[0] @ V[2] and got[1] @ V[1] > got[1] @ V[0]
    with pytest.raises(ValueError, match="name item 5, the factors have 3"):
        pairwise_fold_in_many(V, None, [[[0, 5]]], reg=1.0, loss="squared_hinge")


def test_the_batched_draw_is_the_one_by_one_draw():
    from solvers.fold_in import implicit_pairs_many

    rng = np.random.default_rng(5)
    # 40 items: most users' draws outnumber the items (read from the list of items not met);
    # 1,000: few draws (found by a binary search)
    for n_items in (40, 1000):
        users = [rng.choice(n_items, size=int(rng.integers(0, 15)), replace=False)
                 for _ in range(25)]
        users += [np.arange(n_items), np.array([3, 3, 1])]   # every item met; repeated items
        per = [int(rng.integers(0, 6)) for _ in users]
        for n, got in enumerate(implicit_pairs_many(users, n_items, per)):
            want = implicit_pairs(users[n], n_items, per[n])
            assert (got == want).all() and got.shape[1] == 2
        # with items met that do not win (never drawn) and caps (the smallest hashes kept)
        seen = [np.concatenate([u, rng.choice(n_items, size=int(rng.integers(0, 9)))])
                for u in users]
        caps = [None if n % 3 == 0 else int(rng.integers(1, 30)) for n in range(len(users))]
        got = implicit_pairs_many(users, n_items, per, seen=seen, caps=caps)
        for n in range(len(users)):
            want = implicit_pairs(users[n], n_items, per[n], seen=seen[n], cap=caps[n])
            assert np.array_equal(got[n], want.reshape(-1, 2))
            assert not np.isin(want[:, 1], seen[n]).any()
            assert caps[n] is None or len(want) == min(caps[n], len(set(users[n])) * per[n]) \
                or len(np.setdiff1d(np.arange(n_items), seen[n])) == 0
        # losers by popularity weights (a few items hold most of them: many tries rejected)
        cum = popularity_cum(rng.zipf(1.5, n_items) - 1, n_items)
        got = implicit_pairs_many(users, n_items, per, seen=seen, caps=caps, cum=cum)
        for n in range(len(users)):
            want = implicit_pairs(users[n], n_items, per[n], seen=seen[n], cap=caps[n], cum=cum)
            assert np.array_equal(got[n], want.reshape(-1, 2))
            assert not np.isin(want[:, 1], seen[n]).any()
