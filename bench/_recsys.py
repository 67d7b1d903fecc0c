"""Top-K evaluation of recommenders over the items a user has not rated (bench helper).

The protocol (what a user of the published lists gets): every user's candidates are all items
they have NOT rated in training; a model's top-``k`` list is taken over those candidates, and a
hit is an item in the user's held-out positives (e.g. held-out ratings >= 4). For a user u with
held-out positives P_u (|P_u| >= 1) and top-k list L_u = (l_1, ..., l_k):

* precision@k(u) = |L_u ∩ P_u| / k  (denominator k always),
* recall@k(u)    = |L_u ∩ P_u| / |P_u|  (plain recall, NOT min(k, |P_u|)),
* NDCG@k(u)      = DCG / IDCG, DCG = Σ_{p=1..k} [l_p ∈ P_u] / log2(p + 1) (binary gains),
  IDCG = Σ_{p=1..min(k, |P_u|)} 1 / log2(p + 1) (all positives ranked first).

Users with no held-out positive are skipped (they enter no mean); the reported value is the
mean over the remaining users (macro average). Top-k order: descending score, equal scores by
lower item index first (the order of ``solvers.topk``); items scored -inf never rank, and a
user with fewer than k candidates gets item -1 (a miss) in the empty places.

Everything is vectorized over users; :func:`self_check` compares it with a plain Python
reference on small random problems with many tied scores.

Examples
--------
>>> import numpy as np
>>> train = Ratings(np.array([0, 1]), np.array([0, 3]), np.array([5.0, 4.0]))
>>> test = Ratings(np.array([0, 0, 1]), np.array([1, 2, 0]), np.array([4.0, 2.0, 5.0]))
>>> scores = np.array([[9.0, 1.0, 8.0, 0.0], [1.0, 1.0, 1.0, 9.0]])
>>> top = topk_unseen(scores, train.matrix(2, 4), k=2)
>>> top                       # item 0 (user 0) and item 3 (user 1) were rated in training
array([[2, 1],
       [0, 1]])
>>> m = precision_recall_ndcg(top, test.positives(2, 4, min_rating=4))
>>> m["users"], m["precision"], m["recall"], np.round(m["ndcg"], 4)
(array([0, 1]), array([0.5, 0.5]), array([1., 1.]), array([0.6309, 1.    ]))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

__all__ = ["Ratings", "random_split", "topk_unseen", "precision_recall_ndcg",
           "evaluate_topk", "self_check"]


@dataclass(frozen=True)
class Ratings:
    """Rating events as three aligned arrays: 0-based ``users``, ``items`` and ``ratings``."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray

    def __len__(self) -> int:
        return self.users.shape[0]

    def __getitem__(self, index) -> Ratings:
        """The events at ``index`` (positions or a boolean mask)."""
        return Ratings(self.users[index], self.items[index], self.ratings[index])

    def matrix(self, n_users: int, n_items: int, *, min_rating=None, values="ones"):
        """CSR (n_users, n_items) of the events with rating >= ``min_rating`` (all if None);
        ``values`` is "ones" or "ratings"."""
        keep = (np.ones(len(self), dtype=bool) if min_rating is None
                else self.ratings >= min_rating)
        data = (np.ones(int(keep.sum()), dtype=np.float32) if values == "ones"
                else self.ratings[keep].astype(np.float32))
        m = sp.csr_matrix((data, (self.users[keep], self.items[keep])),
                          shape=(n_users, n_items))
        m.sort_indices()
        return m

    def positives(self, n_users: int, n_items: int, *, min_rating=4):
        """CSR of the events rated >= ``min_rating`` (the hits of the top-K protocol)."""
        return self.matrix(n_users, n_items, min_rating=min_rating)


def random_split(n: int, held_fraction: float, seed) -> tuple[np.ndarray, np.ndarray]:
    """A random (kept, held) partition of ``range(n)``, ``round(held_fraction * n)`` held;
    both sorted.

    >>> random_split(10, 0.2, 0)[1].size
    2
    """
    perm = np.random.default_rng(seed).permutation(n)
    n_held = int(round(held_fraction * n))
    return np.sort(perm[n_held:]), np.sort(perm[:n_held])


def topk_unseen(scores: np.ndarray, seen, k: int = 10, users=None) -> np.ndarray:
    """Top-``k`` item ids per row of ``scores``, skipping each user's ``seen`` items.

    Parameters
    ----------
    scores : ndarray, shape (n_rows, n_items)
        Model scores; row r belongs to user ``users[r]`` (default: user r). Not modified.
    seen : scipy.sparse matrix, shape (n_users, n_items)
        Nonzero (u, i): item i is not a candidate for user u (rated in training).
    k : int
    users : array-like of int or None

    Returns
    -------
    top : ndarray of int64, shape (n_rows, k)
        Best first; equal scores by lower item index; -1 where fewer than k candidates remain.
    """
    n_rows, n_items = scores.shape
    users = np.arange(n_rows) if users is None else np.asarray(users)
    if k > n_items:
        raise ValueError(f"k={k} is larger than the {n_items} items")
    s = np.array(scores, dtype=np.result_type(scores.dtype, np.float32))  # seen -> -inf
    if np.isnan(s).any():
        r, c = (int(x[0]) for x in np.nonzero(np.isnan(s)))
        raise ValueError(f"scores[{r}, {c}] is nan (user {users[r]}); expected numbers")
    seen = sp.csr_matrix(seen)[users]
    s[np.repeat(np.arange(n_rows), np.diff(seen.indptr)), seen.indices] = -np.inf
    cols = np.argpartition(-s, k - 1, axis=1)[:, :k]
    # argpartition returns k items >= the k-th largest score t, but when more than k items tie
    # at or above t it may not pick the lowest-index ones: redo those rows exactly (every item
    # above t, then the lowest-index items equal to t until there are k)
    t = np.take_along_axis(s, cols, axis=1).min(axis=1, keepdims=True)
    tied = np.flatnonzero((s >= t).sum(axis=1) > k)
    if tied.size:
        st, tt = s[tied], t[tied]
        equal = st == tt
        chosen = (st > tt) | (equal & (np.cumsum(equal, axis=1)
                                       <= k - (st > tt).sum(axis=1, keepdims=True)))
        cols[tied] = np.nonzero(chosen)[1].reshape(tied.size, k)  # ascending item ids
    cols.sort(axis=1)  # ascending item ids, so the stable sort below puts lower ids first
    picked = np.take_along_axis(s, cols, axis=1)
    order = np.argsort(-picked, axis=1, kind="stable")
    top = np.take_along_axis(cols, order, axis=1).astype(np.int64)
    top[np.take_along_axis(picked, order, axis=1) == -np.inf] = -1
    return top


def precision_recall_ndcg(top: np.ndarray, positives, users=None) -> dict:
    """Per-user precision@k, recall@k and NDCG@k (binary gains) of top-k lists.

    Parameters
    ----------
    top : ndarray of int, shape (n_rows, k)
        Lists from :func:`topk_unseen` (-1 = no item).
    positives : scipy.sparse matrix, shape (n_users, n_items)
        Nonzero (u, i): item i is a held-out positive of user u.
    users : array-like of int or None
        The user of each row of ``top`` (default: row r is user r).

    Returns
    -------
    dict
        ``users`` (those with at least one positive; the others are skipped), and
        ``precision``, ``recall``, ``ndcg``: arrays aligned with ``users``; formulas in the
        module docstring.
    """
    n_rows, k = top.shape
    users = np.arange(n_rows) if users is None else np.asarray(users)
    pos = sp.csr_matrix(positives)
    pos.sum_duplicates()
    n_items = pos.shape[1]
    pos_keys = np.sort(np.repeat(np.arange(pos.shape[0]), np.diff(pos.indptr)).astype(np.int64)
                       * n_items + pos.indices)
    keys = users[:, None].astype(np.int64) * n_items + top
    if pos_keys.size:
        at = np.minimum(np.searchsorted(pos_keys, keys), pos_keys.size - 1)
        hit = (top >= 0) & (pos_keys[at] == keys)
    else:
        hit = np.zeros(top.shape, dtype=bool)
    n_pos = np.diff(pos.indptr)[users]
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    ideal = np.concatenate([[0.0], np.cumsum(discount)])
    ok = n_pos > 0
    hits = hit.sum(axis=1)
    dcg = hit @ discount
    return {"users": users[ok], "precision": hits[ok] / k, "recall": hits[ok] / n_pos[ok],
            "ndcg": dcg[ok] / ideal[np.minimum(n_pos[ok], k)]}


def evaluate_topk(scores: np.ndarray, seen, positives, k: int = 10, users=None) -> dict:
    """Mean precision@k, recall@k, NDCG@k over the users with a held-out positive, and their
    count ``n_users``: :func:`topk_unseen` then :func:`precision_recall_ndcg`."""
    per_user = precision_recall_ndcg(topk_unseen(scores, seen, k, users), positives, users)
    out = {m: float(per_user[m].mean()) for m in ("precision", "recall", "ndcg")}
    out["n_users"] = int(per_user["users"].size)
    return out


# ----------------------------------------------------------------------- the slow reference

def _reference(scores, seen_sets, positive_sets, k):
    """Plain Python: sort each user's candidates by (-score, item), count hits."""
    out = {"users": [], "precision": [], "recall": [], "ndcg": []}
    for u, row in enumerate(scores):
        cand = sorted((i for i in range(len(row)) if i not in seen_sets[u]
                       and row[i] != -math.inf), key=lambda i: (-row[i], i))[:k]
        pos = positive_sets[u]
        if not pos:
            continue
        gains = [1.0 if i in pos else 0.0 for i in cand]
        dcg = sum(g / math.log2(p + 2) for p, g in enumerate(gains))
        idcg = sum(1.0 / math.log2(p + 2) for p in range(min(k, len(pos))))
        out["users"].append(u)
        out["precision"].append(sum(gains) / k)
        out["recall"].append(sum(gains) / len(pos))
        out["ndcg"].append(dcg / idcg)
    return out


def self_check(n_problems: int = 200, seed: int = 0) -> int:
    """Compare :func:`topk_unseen` + :func:`precision_recall_ndcg` with the plain reference on
    small random problems (few distinct scores, so many ties; some users with every item seen
    or no positive; -inf scores). Raises ``AssertionError`` on a mismatch; returns the number
    of users checked.

    >>> self_check(20) > 0
    True
    """
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(n_problems):
        n_users, n_items = int(rng.integers(1, 7)), int(rng.integers(1, 13))
        k = int(rng.integers(1, n_items + 1))
        scores = rng.integers(0, 4, (n_users, n_items)).astype(float)
        scores[rng.random(scores.shape) < 0.1] = -np.inf
        seen = (rng.random((n_users, n_items)) < rng.random()).astype(float)
        positives = (rng.random((n_users, n_items)) < 0.4) & (seen == 0)
        top = topk_unseen(scores, sp.csr_matrix(seen), k)
        got = precision_recall_ndcg(top, sp.csr_matrix(positives.astype(float)))
        want = _reference(scores, [set(np.flatnonzero(r)) for r in seen],
                          [set(np.flatnonzero(r)) for r in positives], k)
        for u in range(n_users):  # the lists themselves
            cand = sorted((i for i in range(n_items) if not seen[u, i]
                           and scores[u, i] != -np.inf), key=lambda i: (-scores[u, i], i))[:k]
            assert list(top[u]) == cand + [-1] * (k - len(cand)), (u, top[u], cand)
        assert list(got["users"]) == want["users"], (got["users"], want["users"])
        for m in ("precision", "recall", "ndcg"):
            assert np.allclose(got[m], want[m], rtol=0, atol=1e-12), (m, got[m], want[m])
        checked += len(want["users"])
    return checked
