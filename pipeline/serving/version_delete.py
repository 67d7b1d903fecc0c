"""Deleting a version's keys: by name through its key index (each bucket's keys, written before
the keys they list) and each bucket's ``fresh_keys`` set (the users the refresher rewrote, some
of whom the index never listed), or by SCAN when the index is incomplete (a publish that died
half-way).
The caller has taken the version out of the version list and moved every bucket pointer past
it first (:func:`pipeline.serving.versions.prune_versions`), so no reader is pointed at it.
"""

from __future__ import annotations

import json
import re

from pipeline.serving.layout import BUCKETS, FORMAT_VERSION, LayoutError, ModelKeys, unpack_keys
from pipeline.serving.shards import NodeBatch


def delete_version(client, keys: ModelKeys, version: int, batch: int = 1000,
                   bucket_group: int = 64) -> None:
    """Delete every key of ``version`` (which must no longer be listed or current, and no
    bucket pointer may name it) with UNLINK in batches of ``batch`` keys of one slot, pipelined
    per node: model-level keys by name, per-key keys through each bucket's key index and
    ``fresh_keys`` set, ``bucket_group`` buckets at a time (or a SCAN of the version's prefixes
    when an index is incomplete: it finds the refresher's keys too). Its meta hash goes last,
    then it leaves the pending set."""
    vk = keys.version(version)
    client.sadd(keys.pending, version)
    meta = {k.decode(): v.decode() for k, v in client.hgetall(vk.meta).items()}
    if meta:
        client.hset(vk.meta, "status", "deleting")
    try:
        model_names, index = _indexed_names(client, vk, meta)
        per_bucket = None
    except (KeyError, ValueError, LayoutError):
        model_names, per_bucket = _scanned_names(client, keys, vk)
    unlink = _Unlinker(client, keys, batch)
    unlink.add(None, model_names)
    if per_bucket is not None:
        for b, names in per_bucket.items():
            unlink.add(b, names)
    else:
        for g in range(0, BUCKETS, bucket_group):   # every bucket: any may have fresh keys
            _unlink_indexed(client, keys, vk, index, range(g, min(g + bucket_group, BUCKETS)),
                            unlink)
    unlink.add(None, [vk.meta])
    unlink.flush()
    client.srem(keys.pending, version)


def _unlink_indexed(client, keys: ModelKeys, vk, index: list[int], group, unlink) -> None:
    """UNLINK the per-key keys of the buckets in ``group``: those their key index chunks list
    and those their ``fresh_keys`` set lists (each key's ``topk``, ``u``, ``seen``,
    ``fresh``), then the index chunks and the set, after the keys they list."""
    reads = NodeBatch(client)
    where = []
    for b in group:
        reads.add(keys.pointer(b), "SMEMBERS", vk.fresh_keys(b))
        where.append((b, None))
        for c in range(index[b]):
            reads.add(keys.pointer(b), "GET", vk.key_index(b, c))
            where.append((b, c))
    found: dict[int, set[str]] = {b: set() for b in group}
    for (b, c), raw in zip(where, reads.execute()):
        if c is None and isinstance(raw, (set, list)):
            found[b].update(k.decode() for k in raw)
        elif isinstance(raw, bytes):
            found[b].update(unpack_keys(raw, vk.key_index(b, c)))
    for b in group:
        prefix = vk.bucket_prefixes[b]
        names = [prefix + kind + key for key in sorted(found[b])
                 for kind in ("topk:", "u:", "seen:", "fresh:")]
        if names or index[b]:
            unlink.add(b, names + [vk.key_index(b, c) for c in range(index[b])]
                       + [vk.fresh_keys(b)])
    unlink.flush()


def _indexed_names(client, vk, meta: dict) -> tuple[list[str], list[int]]:
    """Model-level key names of a version and its key index chunks per bucket; LayoutError
    when the meta or an index chunk is missing (the caller then scans)."""
    if int(meta.get("format_version", -1)) != FORMAT_VERSION:
        raise LayoutError("unknown format")
    names = [vk.global_list, vk.scorer]
    for c in range(int(meta["n_item_chunks"])):
        names += [vk.items(c), vk.item_factors(c), vk.item_bias(c), vk.item_values(c),
                  vk.global_scores(c), vk.loser_counts(c)]
    counts = json.loads(meta["bucket_keys"])
    key_chunk = int(meta["key_chunk"])
    if len(counts) != BUCKETS or key_chunk < 1:
        raise LayoutError("bucket_keys does not list every bucket")
    index = [-(-int(n) // key_chunk) for n in counts]
    check = NodeBatch(client)
    base = vk.base
    for b, chunks in enumerate(index):
        for c in range(chunks):
            check.add("{" + base + ":" + str(b) + "}", "EXISTS", vk.key_index(b, c))
    if not all(r == 1 for r in check.execute()):
        raise LayoutError("key index incomplete")
    return names, index

_BUCKET_KEY = re.compile(r"^\{([^{}]*):([0-9]+)\}:v([0-9]+):")


def _scanned_names(client, keys: ModelKeys, vk) -> tuple[list[str], dict[int, list[str]]]:
    """Key names of a version found by SCAN (every node of a cluster): model-level ones, and
    per bucket."""
    model = [k.decode() for k in client.scan_iter(match=vk.prefix + "*", count=1000)]
    model = [n for n in model if n != vk.meta]
    per_bucket: dict[int, list[str]] = {}
    pattern = "{" + vk.base + ":*}:v" + str(vk.version) + ":*"
    for raw in client.scan_iter(match=pattern, count=1000):
        name = raw.decode()
        m = _BUCKET_KEY.match(name)
        if m and m.group(1) == vk.base and int(m.group(3)) == vk.version:
            per_bucket.setdefault(int(m.group(2)), []).append(name)
    return model, per_bucket


class _Unlinker:
    """UNLINK commands of at most ``batch`` keys of one slot, pipelined per node."""

    def __init__(self, client, keys: ModelKeys, batch: int):
        self.keys, self.size = keys, batch
        self.batch = NodeBatch(client)

    def add(self, bucket: int | None, names: list[str]) -> None:
        route = self.keys.current if bucket is None else self.keys.pointer(bucket)
        for i in range(0, len(names), self.size):
            self.batch.add(route, "UNLINK", *names[i:i + self.size])
        if len(self.batch) >= 200:
            self.flush()

    def flush(self) -> None:
        if len(self.batch):
            errors = [r for r in self.batch.execute() if isinstance(r, Exception)]
            if errors:
                raise RuntimeError(f"model {self.keys.model!r}: UNLINK refused: {errors[0]}")
