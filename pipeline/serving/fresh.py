"""The serving side of the refresher: a refreshed user's list (:func:`fresh_answer_parts`) and
the atomic rewrite of that user's keys under the version being served (:func:`write_fresh`).

The refresher (``rankstream refresh``) recomputes a touched user's factor with the served
version's own fold-in, from the user's whole history; this module turns the factor into the
list publish would have written for it (the same top-K code, :func:`solvers.topk.topk_of_scores`)
and writes the user's ``topk``, ``u``, ``seen`` and ``fresh`` keys in one Lua script per bucket,
in the bucket's slot, only while the bucket's pointer still names the version
(``REDIS_LAYOUT.md``, "Refreshed users", has the keys and the argument). Lookups then answer
that user with ``source == "fresh"``.

Examples
--------
>>> import numpy as np
>>> V, b = np.eye(3, 2, dtype=np.float32), np.zeros(3, np.float32)
>>> class Version:   # what fresh_answer_parts reads of a version
...     n_items, rank = 3, 2
>>> pairs = fresh_answer_parts(Version(), (V, b), np.array([0.0, 1.0]), np.array([2]), 2)
>>> from pipeline.serving.layout import unpack_pairs
>>> unpack_pairs(pairs)
([1, 0], [1.0, 0.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from pipeline.serving.layout import (
    ModelKeys,
    bucket_of,
    pack_i32,
    pack_pairs,
)
from pipeline.serving.shards import NodeBatch
from pipeline.serving.sparse_factors import pack_factor
from solvers.fold_in import sorted_unique
from solvers.topk import user_topk_blocks

USERS_PER_SCRIPT = 200   # users one script call writes (bounds the time a script holds Redis)

# KEYS: the bucket's pointer, its fresh_keys set, then per user topk, u, seen, fresh;
# ARGV: "<version>:<publish_id>:", then per user key, ranked pairs, float32 factor, int32 seen
# items, stamp_ms. Writes nothing and returns 0 unless the pointer still names the version
# (any epoch); else sets every user's four keys, adds the keys to fresh_keys, returns 1.
WRITE_FRESH = """
local ptr = redis.call('GET', KEYS[1])
if not ptr or string.sub(ptr, 1, #ARGV[1]) ~= ARGV[1] then return 0 end
local n = (#KEYS - 2) / 4
for i = 0, n - 1 do
  local k, a = 3 + 4 * i, 2 + 5 * i
  redis.call('SET', KEYS[k], ARGV[a + 1])
  redis.call('SET', KEYS[k + 1], ARGV[a + 2])
  redis.call('SET', KEYS[k + 2], ARGV[a + 3])
  redis.call('SET', KEYS[k + 3], ARGV[a + 4])
  redis.call('SADD', KEYS[2], ARGV[a])
end
return 1
"""


@dataclass
class FreshUser:
    """One refreshed user: ``key`` (:func:`~pipeline.serving.layout.key_of` of the user id),
    ``factor`` (float32, the version's rank), ``seen`` (int32 item indices left out of the
    list), ``pairs`` (the ranked list, :func:`fresh_answer_parts`), ``stamp_ms`` (when the
    refresh was computed, or the newest event it saw: the value of the ``fresh`` marker)."""

    key: str
    factor: np.ndarray
    seen: np.ndarray
    pairs: bytes
    stamp_ms: int


def fresh_lists(st, factors, user_factors, seen: list, top_k: int) -> list[bytes]:
    """The ranked pairs (``pack_pairs``) of ``s = V u + b`` over the items not in each user's
    ``seen`` indices, ``top_k`` long (fewer when fewer are left), for every row ``u`` of
    ``user_factors``: what publish writes as the users' lists, by the same code
    (:func:`solvers.topk.user_topk_blocks`: float32 scores, ties by lower index), in one call
    for a whole batch. ``st`` is the version (``n_items``, ``rank``; a
    :class:`~pipeline.serving.version_cache.VersionState` keeps ``Vᵀ`` for the next call),
    ``factors`` its ``(V, b or None)``."""
    V, b = factors
    U = np.asarray(user_factors, dtype=np.float32).reshape(len(seen), -1)
    if U.shape[1] != st.rank:
        raise ValueError(f"user factors have {U.shape[1]} values, the version has rank "
                         f"{st.rank}")
    rows = [sorted_unique(x) for x in seen]
    for x in rows:
        if len(x) and (x[0] < 0 or x[-1] >= st.n_items):
            raise ValueError(f"seen indices name item {int(x[-1])} or {int(x[0])}, the "
                             f"version has {st.n_items} items")
    indptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([len(x) for x in rows], out=indptr[1:])
    indices = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    derived = getattr(st, "derived", None)
    VT = None if derived is None else derived.get("VT")
    if VT is None:
        VT = (V.T.tocsr() if sp.issparse(V)
              else np.ascontiguousarray(np.asarray(V, dtype=np.float32).T))
        if derived is not None:
            derived["VT"] = VT
    if sp.issparse(VT):     # an item-kNN's: the users' rows are as sparse as their items
        U = sp.csr_matrix(U)
    out = []
    for blk in user_topk_blocks(U, VT.T, int(top_k), item_bias=b, workers=1, jit=True,
                                seen_indptr=indptr, seen_indices=indices):
        out += [pack_pairs(blk.indices[r, :n], blk.scores[r, :n])
                for r, n in enumerate(blk.counts.tolist())]
    return out


def fresh_answer_parts(st, factors, user_factor, seen_indices, top_k: int) -> bytes:
    """One user's :func:`fresh_lists`."""
    return fresh_lists(st, factors, np.asarray(user_factor).reshape(1, -1), [seen_indices],
                       top_k)[0]


def write_fresh(client, keys: ModelKeys, version: int, publish_id: str,
                users: list[FreshUser], *, sparse: bool = False) -> list[bool]:
    """Rewrite each user's ``topk``, ``u``, ``seen`` and ``fresh`` keys of ``version`` (whose
    publish is ``publish_id``; ``sparse``: its factors are, ``sparse_factors.py``) and add
    them to their bucket's ``fresh_keys``: one script per bucket (and
    :data:`USERS_PER_SCRIPT` users), atomic in the bucket's slot, pipelined per node. Returns,
    per user, whether it was written: False where the bucket's pointer no longer names the
    version (it flipped or rolled back: re-apply to the version it names).

    Raises
    ------
    RuntimeError
        A script was refused (an error reply: a foreign key type, a cluster slot moving);
        the other buckets' writes stand.
    """
    prefix = f"{int(version)}:{publish_id}:"
    vk = keys.version(version)
    by_bucket: dict[int, list[int]] = {}
    for i, user in enumerate(users):
        by_bucket.setdefault(bucket_of(user.key), []).append(i)
    batch, calls = NodeBatch(client), []
    for b, rows in by_bucket.items():
        for lo in range(0, len(rows), USERS_PER_SCRIPT):
            chunk = rows[lo:lo + USERS_PER_SCRIPT]
            bp = vk.bucket_prefix(b)
            script_keys, args = [keys.pointer(b), vk.fresh_keys(b)], [prefix]
            for i in chunk:
                u = users[i]
                script_keys += [bp + "topk:" + u.key, bp + "u:" + u.key, bp + "seen:" + u.key,
                                bp + "fresh:" + u.key]
                args += [u.key, u.pairs, pack_factor(u.factor, sparse=sparse),
                         pack_i32(u.seen), str(int(u.stamp_ms))]
            batch.add(keys.pointer(b), "EVAL", WRITE_FRESH, len(script_keys), *script_keys,
                      *args)
            calls.append(chunk)
    written = [False] * len(users)
    if not calls:
        return written
    replies = batch.execute()
    errors = [r for r in replies if isinstance(r, Exception)]
    for chunk, reply in zip(calls, replies):
        if reply == 1:
            for i in chunk:
                written[i] = True
    if errors:
        raise RuntimeError(f"model {keys.model!r} version {version}: a refresh write was "
                           f"refused ({errors[0]}); {sum(written)} of {len(users)} users "
                           "were written")
    return written
