"""Publish a :class:`~pipeline.serving.artifact.ModelArtifact` to Redis as a new immutable version,
then flip the model's ``current`` pointer to it in one atomic script, then prune old versions.
The key layout is ``pipeline/serving/REDIS_LAYOUT.md``.

Readers never see a half-written model: every key of the new version is written (pipelined in
big non-transactional chunks, one pipeline per node on a cluster) before ``current`` moves, and
live keys are never updated in place; after the flip the bucket pointers follow. Per-user top-K
lists are computed exactly (blocked BLAS matmul + a jitted selection kernel, in threads) while
earlier blocks are being written.

Examples
--------
>>> import numpy as np, redis
>>> art = ModelArtifact.user_item(user_ids=["ann", "bob"], item_ids=[1, 2, 3],
...                               user_factors=np.ones((2, 2)), item_factors=np.eye(3, 2))
>>> res = publish("movies", art, redis.Redis(), top_k=2)  # doctest: +SKIP
>>> res.version, res.n_lists  # doctest: +SKIP
(1, 2)
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import scipy.sparse as sp

from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.artifact_kinds import kind_of
from pipeline.serving.background import BATCH_NICENESS, run_at_niceness
from pipeline.serving.layout import (
    BUCKETS,
    FORMAT_VERSION,
    MAX_VALUE_BYTES,
    PAIR_DTYPE,
    ModelKeys,
    VersionKeys,
    bucket_of,
    pack_f32,
    pack_i32,
    pack_ids,
    pack_keys,
    pack_pairs,
)
from pipeline.serving.redis_client import as_client
from pipeline.serving.shards import ShardWriter
from pipeline.serving.sparse_factors import CSR, pack_rows, row_bytes
from pipeline.serving.versions import (
    FencedError,
    SupersededError,
    delete_version,
    flip,
    prune,
    prune_versions,
    read_current,
    rollback,
    sync_pointers,
    versions,
)
from solvers.topk import topk_of_scores

__all__ = ["PublishResult", "SupersededError", "FencedError", "publish", "rollback", "versions",
           "prune"]

ITEM_CHUNK = 65536  # the most rows per items/V/b/val/gs/lc value; fewer when rows are wide
KEY_CHUNK = 10000  # the most keys per key-index value; fewer when keys are long
MSET_KEYS = 16    # keys per MSET: Redis spends ~1-4 µs a key, so about 0.05 ms a command


@dataclass
class PublishResult:
    """What :func:`publish` did."""

    model: str
    namespace: str
    version: int
    publish_id: str
    kind: str
    n_items: int
    n_lists: int
    seconds: float
    pruned: list[int] = field(default_factory=list)
    timings: dict = field(default_factory=dict)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _json_item_bytes(values: list[str]) -> int:
    """The most bytes one string takes in a UTF-8 JSON array (quotes, escapes, ``", "``)."""
    return max((len(json.dumps(v, ensure_ascii=False).encode()) for v in values),
               default=0) + 2


def item_chunk_rows(art: ModelArtifact) -> int:
    """Rows per item chunk of ``art``: the largest power of two up to :data:`ITEM_CHUNK`
    whose every chunked value (ids, factors, bias, values, global scores) stays within
    :data:`MAX_VALUE_BYTES`; at least 1 (a single row wider than that is one value).

    >>> art = ModelArtifact.global_list(item_ids=[1, 2], scores=[0.5, 0.25])
    >>> item_chunk_rows(art)   # 8 bytes per id: 65536 rows are 512 KiB
    65536
    >>> wide = ModelArtifact.user_item(user_ids=[1], item_ids=[1, 2], user_factors=[[0.0] * 600],
    ...                                item_factors=[[0.0] * 600] * 2)
    >>> item_chunk_rows(wide)  # 2,400 bytes per row: 256 rows are 600 KiB
    256
    """
    if art.item_ids.dtype.kind in "iu":
        rows = MAX_VALUE_BYTES // 8
    else:   # a JSON array: its brackets, and each id with its separator
        rows = (MAX_VALUE_BYTES - 2) // _json_item_bytes([str(x) for x in art.item_ids.tolist()])
    rows = max(1, min(rows, MAX_VALUE_BYTES // max(row_bytes(art.item_factors)
                                                   if art.item_factors is not None else 0, 4)))
    return min(ITEM_CHUNK, 1 << (rows.bit_length() - 1))


def key_chunk_keys(key_strs: list[str]) -> int:
    """Keys per key index chunk: up to :data:`KEY_CHUNK`, fewer when the longest key would
    take a chunk of that many past :data:`MAX_VALUE_BYTES`; at least 1."""
    if not key_strs:
        return KEY_CHUNK
    return int(min(KEY_CHUNK, max(1, (MAX_VALUE_BYTES - 2) // _json_item_bytes(key_strs))))


def _meta(art: ModelArtifact, model: str, version: int, publish_id: str, top_k: int,
          global_role: str, buckets: np.ndarray, item_chunk: int, key_chunk: int) -> dict:
    n_item_chunks = -(-art.n_items // item_chunk)
    counts = kind_of(art.kind).counts(art)
    return {
        "format_version": FORMAT_VERSION, "kind": art.kind, "model": model, "version": version,
        "publish_id": publish_id, "status": "writing", "algorithm": art.algorithm,
        "params": json.dumps(art.params), "metrics": json.dumps(art.metrics),
        "trained_at": art.trained_at or "", "published_at": _now(), "n_items": art.n_items,
        "served_as": art.served_as, "healed_at": art.healed_at,
        "fold_in": json.dumps(art.fold_in),
        "watermark": json.dumps(art.watermark or {}),
        "item_id_type": "int64" if art.item_ids.dtype.kind in "iu" else "str",
        "item_chunk": item_chunk, "n_item_chunks": n_item_chunks, "rank": art.rank,
        "has_item_bias": int(art.item_bias is not None),
        "factor_format": CSR if sp.issparse(art.item_factors) else "dense",
        "has_item_values": int(art.item_scores is not None), "top_k": top_k,
        "has_global_scores": int(global_role != "none"),
        "has_loser_counts": int(art.loser_counts is not None),
        "n_keys": art.n_keys, "buckets": BUCKETS, "key_chunk": key_chunk,
        "bucket_keys": json.dumps(np.bincount(buckets, minlength=BUCKETS).tolist()),
        **counts,
        "global": global_role, "scorer": art.scorer.kind if art.scorer is not None else "none",
    }


def _write_items(w: ShardWriter, vk: VersionKeys, art: ModelArtifact, chunk: int) -> None:
    for c, lo in enumerate(range(0, art.n_items, chunk)):
        hi = min(lo + chunk, art.n_items)
        w.set(vk.items(c), pack_ids(art.item_ids[lo:hi]))
        if sp.issparse(art.item_factors):
            w.set(vk.item_factors(c), pack_rows(art.item_factors, lo, hi))
        elif art.item_factors is not None:
            w.set(vk.item_factors(c), pack_f32(art.item_factors[lo:hi]))
        if art.item_bias is not None:
            w.set(vk.item_bias(c), pack_f32(art.item_bias[lo:hi]))
        if art.item_scores is not None:
            w.set(vk.item_values(c), pack_f32(art.item_scores[lo:hi]))
        if art.loser_counts is not None:
            w.set(vk.loser_counts(c), pack_i32(art.loser_counts[lo:hi]))


def publish(model_name: str, artifact: ModelArtifact, redis, top_k: int = 100,
            keep_versions: int = 3, *, namespace: str = "rankstream",
            progress: bool = False, fence: int | None = None,
            niceness: int | None = BATCH_NICENESS) -> PublishResult:
    """Write ``artifact`` as a new version of ``model_name``, flip ``current`` to it, prune.

    Parameters
    ----------
    model_name : str
        Letters, digits, ``_ . -``.
    artifact : ModelArtifact
        Any kind (``user_item``, ``global_list``, ``query_docs``, ``predicted_ratings``).
    redis : redis.Redis or str
        A redis-py client or a URL (``redis://``, ``rediss://``, ``unix://``).
    top_k : int
        Length of every precomputed list (per user, per query, and the global list).
    keep_versions : int
        Versions kept after publishing (the new one included); older ones are deleted.
    namespace : str
        Key namespace (the first part of the hash tag ``{namespace:model}``).
    progress : bool
        Show a progress bar over users.
    fence : int or None
        The retrain's lease token (:mod:`pipeline.serving.lease`): the flip happens only while
        the model's lease still holds it.
    niceness : int or None
        The CPU priority the version is computed and written at (Linux; None: the caller's):
        a publish is batch work, and on a host it shares with lookups it takes the CPU they
        leave (:mod:`pipeline.serving.background`).

    Returns
    -------
    PublishResult

    Raises
    ------
    SupersededError
        A newer version went live while this one was written (a concurrent publisher), or
        (:class:`FencedError`) ``fence`` lost the model's lease; this version is deleted and
        ``current`` stays where it was.

    Examples
    --------
    >>> from pipeline.serving.embedded_redis import EmbeddedRedis
    >>> art = ModelArtifact.global_list(item_ids=["a", "b", "c"], scores=[0.2, 0.9, 0.5])
    >>> with EmbeddedRedis() as server:
    ...     first = publish("top-items", art, server.url, top_k=2)
    ...     second = publish("top-items", art, server.url, top_k=2, keep_versions=1)
    >>> first.version, second.version, second.pruned
    (1, 2, [1])
    """
    top_k = _checked_top_k(artifact, top_k, keep_versions)
    return run_at_niceness(_publish, model_name, artifact, as_client(redis, retries=3), top_k,
                           keep_versions, namespace, progress, fence, niceness=niceness)


def _publish(model_name: str, artifact: ModelArtifact, client, top_k: int, keep_versions: int,
             namespace: str, progress: bool, fence: int | None) -> PublishResult:
    t_start = time.perf_counter()
    keys = ModelKeys(namespace, model_name)
    draft = _draft(client, keys, artifact, model_name, top_k)
    value, waited, n_keys, t_written = _write_and_flip(client, keys, draft, artifact,
                                                       progress, fence)
    t_flipped = time.perf_counter()
    sync_pointers(client, keys, value)
    t_synced = time.perf_counter()
    pruned = prune_versions(keys, client, keep_versions, sync=False)
    t_end = time.perf_counter()
    return PublishResult(
        model=model_name, namespace=namespace, version=draft.version,
        publish_id=draft.publish_id, kind=artifact.kind, n_items=artifact.n_items,
        n_lists=int(draft.meta["n_lists"]), seconds=t_end - t_start, pruned=pruned,
        timings={"write": t_written - t_start, "waiting_for_topk": waited,
                 "flip": t_flipped - t_written, "pointers": t_synced - t_flipped,
                 "prune": t_end - t_synced, "keys_written": n_keys})


@dataclass
class _Draft:
    """A version about to be written: its number and publish id, its meta (``status``
    ``writing``), the per-key keys as strings with their buckets, and the scores its global
    list ranks by (None: no global list)."""

    version: int
    publish_id: str
    vk: VersionKeys
    meta: dict
    key_strs: list
    buckets: np.ndarray
    global_scores: object
    top_k: int


def _checked_top_k(artifact, top_k: int, keep_versions: int) -> int:
    """``top_k`` capped at the artifact's items, after checking the arguments of a publish."""
    if not isinstance(artifact, ModelArtifact):
        raise TypeError(f"artifact must be a ModelArtifact, got {type(artifact).__name__}")
    if int(top_k) < 1:
        raise ValueError(f"top_k is {top_k}, it must be at least 1")
    if int(keep_versions) < 1:
        raise ValueError(f"keep_versions is {keep_versions}, it must be at least 1")
    top_k = int(min(top_k, artifact.n_items))
    if top_k * PAIR_DTYPE.itemsize > MAX_VALUE_BYTES:
        raise ValueError(f"top_k is {top_k}: a list of {top_k} items takes "
                         f"{top_k * PAIR_DTYPE.itemsize} bytes, over the {MAX_VALUE_BYTES} one "
                         f"value may hold; at most {MAX_VALUE_BYTES // PAIR_DTYPE.itemsize}")
    return top_k


def _draft(client, keys: ModelKeys, artifact: ModelArtifact, model_name: str,
           top_k: int) -> _Draft:
    """Take the next version number of the model and describe the version to write."""
    key_strs = [] if artifact.key_ids is None else [str(k) for k in artifact.key_ids.tolist()]
    buckets = np.fromiter((bucket_of(k) for k in key_strs), dtype=np.int64,
                          count=len(key_strs))
    version = int(client.incr(keys.seq))
    publish_id = secrets.token_hex(8)
    global_scores, global_role = kind_of(artifact.kind).global_scores(artifact)
    meta = _meta(artifact, model_name, version, publish_id, top_k, global_role, buckets,
                 item_chunk_rows(artifact), key_chunk_keys(key_strs))
    return _Draft(version, publish_id, keys.version(version), meta, key_strs, buckets,
                  global_scores, top_k)


def _write_and_flip(client, keys: ModelKeys, draft: _Draft, artifact: ModelArtifact,
                    progress: bool, fence: int | None) -> tuple[bytes, float, int, float]:
    """Write every key of ``draft`` (listed as pending first, so that a publish that dies
    is cleaned up by a later prune), mark it complete, flip ``current`` to it. Returns (the
    new value of ``current``, seconds waiting for top-K compute, keys written, the time the
    writes ended). On any failure the version's keys are deleted, unless the flip stood (its
    reply was lost), and the error is raised."""
    vk = draft.vk
    client.sadd(keys.pending, draft.version)
    client.hset(vk.meta, mapping=draft.meta)
    try:
        waited, n_keys = _write_version(client, keys, vk, artifact, keys.model, draft.key_strs,
                                        draft.buckets, draft.top_k, draft.global_scores,
                                        progress, draft.meta)
        t_written = time.perf_counter()
        client.hset(vk.meta, "status", "complete")
        value = flip(client, keys, draft.version, draft.publish_id, fence)
    except BaseException:
        try:  # best effort: leave no half-written or superseded version (prune retries later)
            now = read_current(client, keys)
            if now is None or now[0] != draft.version:
                delete_version(client, keys, draft.version)
        except Exception:
            pass
        raise
    return value, waited, n_keys, t_written


def _write_version(client, keys: ModelKeys, vk: VersionKeys, artifact: ModelArtifact,
                   model_name: str, key_strs: list[str], buckets: np.ndarray, top_k: int,
                   global_scores, progress: bool, meta: dict) -> tuple[float, int]:
    """Every key of the version (key index first); returns (seconds waiting for top-K
    compute, keys written)."""
    with ShardWriter(client, keys, mset_keys=MSET_KEYS) as w:
        waited = _write_all(w, vk, artifact, model_name, key_strs, buckets, top_k,
                            global_scores, progress, int(meta["item_chunk"]),
                            int(meta["key_chunk"]))
        w.finish()
        return waited, w.n_keys


def _write_key_index(w: ShardWriter, vk: VersionKeys, key_strs: list[str],
                     buckets: np.ndarray, chunk: int) -> None:
    """Each bucket's keys, in chunks of ``chunk`` (written before the keys they list, so a
    publish that dies leaves an index the next prune deletes by)."""
    order = np.argsort(buckets, kind="stable")
    bounds = np.searchsorted(buckets[order], np.arange(BUCKETS + 1))
    for b in range(BUCKETS):
        rows = order[bounds[b]:bounds[b + 1]].tolist()
        for c, lo in enumerate(range(0, len(rows), chunk)):
            w.set_in(b, vk.key_index(b, c), pack_keys([key_strs[r] for r in
                                                       rows[lo:lo + chunk]]))


def _write_all(w: ShardWriter, vk: VersionKeys, artifact: ModelArtifact, model_name: str,
               key_strs: list[str], buckets: np.ndarray, top_k: int, global_scores,
               progress: bool, item_chunk: int, key_chunk: int) -> float:
    _write_key_index(w, vk, key_strs, buckets, key_chunk)
    _write_items(w, vk, artifact, item_chunk)
    if artifact.scorer is not None:
        w.set(vk.scorer, artifact.scorer.to_bytes())
    if global_scores is not None:
        w.set(vk.global_list, pack_pairs(*topk_of_scores(global_scores, top_k)))
        for c, lo in enumerate(range(0, artifact.n_items, item_chunk)):
            w.set(vk.global_scores(c), pack_f32(np.asarray(global_scores[lo:lo + item_chunk],
                                                           np.float32)))
    bar = None
    if progress and kind_of(artifact.kind).per_key:
        from tqdm import tqdm

        # disable=None: drawn only on a terminal, never into a log file or a pipe
        bar = tqdm(total=artifact.n_keys, unit="key", desc=f"publish {model_name}",
                   disable=None)
    try:
        return kind_of(artifact.kind).write_lists(w, vk, artifact, key_strs, buckets, top_k,
                                                  bar)
    finally:
        if bar is not None:
            bar.close()
