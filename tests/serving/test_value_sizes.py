"""No Redis value over 1 MiB, no MSET over 1 MiB, and a version's chunks loaded a few MiB per
round trip (issue 50): wide item factors (an EASE blend's are 1,700-5,000 columns) published
through a real redis-server answer exactly as the in-process computation does."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.serving import version_cache
from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.layout import MAX_VALUE_BYTES, ModelKeys
from pipeline.serving.lookup import TopK
from pipeline.serving.publish import (
    ITEM_CHUNK,
    KEY_CHUNK,
    item_chunk_rows,
    key_chunk_keys,
    publish,
)
from pipeline.serving.redis_wire import MsetWriter
from solvers.fold_in import least_squares_fold_in
from tests.serving.helpers import reference_fallback, reference_user, same_answer, user_model


def _items(n: int, rank: int, str_ids: bool = False, width: int = 0) -> ModelArtifact:
    ids = [f"{'x' * width}item-{i}" for i in range(n)] if str_ids else np.arange(n)
    return ModelArtifact.user_item(user_ids=[1], item_ids=ids, user_factors=np.ones((1, rank)),
                                   item_factors=np.ones((n, rank)))


@pytest.mark.parametrize("rank, str_ids, width, rows", [
    (1, False, 0, ITEM_CHUNK),     # 8 bytes per id: 512 KiB
    (32, False, 0, 8192),          # 128 bytes per row: 1 MiB exactly
    (600, False, 0, 256),          # 2,400 bytes per row
    (5000, False, 0, 32),          # an EASE blend's width: 20,000 bytes per row
    (300_000, False, 0, 1),        # one row over 1 MiB: a chunk of its own
    (1, True, 2000, 512),          # string ids of ~2 KB each
])
def test_item_chunk_keeps_every_chunk_within_1_mib(rank, str_ids, width, rows):
    n = 3 if rank > 1000 else 40
    art = _items(n, rank, str_ids, width)
    assert item_chunk_rows(art) == rows
    row = max(4 * rank, 8 if not str_ids else len(f'"{"x" * width}item-39", '))
    assert rows * row + 2 * str_ids <= MAX_VALUE_BYTES or rows == 1


def test_key_chunk_and_top_k_bounds():
    assert key_chunk_keys([]) == KEY_CHUNK and key_chunk_keys(["42"]) == KEY_CHUNK
    long = ["u" * 5000, "v"]
    assert key_chunk_keys(long) == (MAX_VALUE_BYTES - 2) // 5004
    art = _items(200_000, 1)
    with pytest.raises(ValueError, match="top_k is 150000: a list of 150000 items takes "
                                         "1200000 bytes, over the 1048576 one value may hold; "
                                         "at most 131072"):
        publish("m", art, "redis://127.0.0.1:1/0", top_k=150_000)


class _Conn:
    """A connection that records what an MsetWriter sends."""

    def __init__(self):
        self.sent: list[bytes] = []
        self.unread = 0

    def send_packed_command(self, chunks, check_health=False):
        self.sent += chunks if isinstance(chunks, list) else [chunks]

    def read_response(self):
        return b"OK"

    def disconnect(self):
        pass


class _Pool:
    def __init__(self):
        self.conn = _Conn()

    def get_connection(self, *args):
        return self.conn

    def release(self, conn):
        pass


def test_mset_commands_hold_at_most_1_mib_unless_one_key():
    pool = _Pool()
    with MsetWriter(pool) as w:
        w.mset([f"k{i}" for i in range(1000)], [b"x" * 3000] * 1000)   # 3 MB in 1000 keys
        w.set("big", b"y" * (3 << 20))                                  # one value of 3 MiB
        w.mset([f"s{i}" for i in range(2500)], [b"z"] * 2500)           # small: 1000 a command
        w.finish()
    sizes = [len(c) for c in pool.conn.sent]
    keys = [int(c.split(b"\r\n", 1)[0][1:]) // 2 for c in pool.conn.sent]   # *<argc>
    assert sum(keys) == 1000 + 1 + 2500 == w.n_keys
    assert all(s <= 1 << 20 for s, n in zip(sizes, keys) if n > 1)
    assert [n for s, n in zip(sizes, keys) if s > 1 << 20] == [1]
    assert keys[-3:] == [1000, 1000, 500] and max(keys) == 1000


class _Counting:
    """A redis-py client that counts its pipelines (round trips)."""

    def __init__(self, client):
        self.client, self.trips = client, 0

    def pipeline(self, *args, **kw):
        self.trips += 1
        return self.client.pipeline(*args, **kw)

    def __getattr__(self, name):
        return getattr(self.client, name)


@pytest.mark.parametrize("str_ids", [False, True], ids=["int-ids", "str-ids"])
def test_wide_factors_publish_small_values_and_answer_as_in_process(redis_client, redis_url,
                                                                    monkeypatch, str_ids):
    spec = {"method": "least_squares", "reg": 2.0, "alpha": 10.0}
    n_users, n_items, rank = 40, 3000, 600
    art = user_model(11, n_users=n_users, n_items=n_items, rank=rank, str_ids=str_ids,
                     fold_in=spec, precompute=np.arange(n_users) % 2 == 0)
    publish("wide", art, redis_client, top_k=10, keep_versions=1)
    res = publish("wide", art, redis_client, top_k=10, keep_versions=1)
    assert res.pruned == [1]
    keys = [k for pattern in ("{rankstream:wide}*", "{rankstream:wide:*}*")
            for k in redis_client.scan_iter(match=pattern, count=10_000)]
    assert not [k for k in keys if b":v1:" in k]       # the old chunks went with the version
    sizes = {k: redis_client.strlen(k) for k in keys if redis_client.type(k) == b"string"}
    assert max(sizes.values()) <= MAX_VALUE_BYTES, max(sizes.items(), key=lambda kv: kv[1])
    factor_chunks = [k for k in sizes if b":v2:V:" in k]
    meta = redis_client.hgetall("{rankstream:wide}:v2:meta")
    assert int(meta[b"item_chunk"]) == 256 and int(meta[b"n_item_chunks"]) == 12
    assert len(factor_chunks) == 12 and sum(sizes[k] for k in factor_chunks) == n_items * rank * 4

    # the chunks are read a few per round trip, and are the published factors exactly
    monkeypatch.setattr(version_cache, "TRIP_BYTES", 3 * 256 * 601 * 4)
    with TopK(redis_url, timeout=2.0) as topk:
        st = topk.versions.current_state("wide")
        counting = _Counting(topk.transport.bulk)
        V, b = version_cache.load_factors(counting, st)
        assert counting.trips == 4     # 12 chunks of V and b, three of each per trip
        np.testing.assert_array_equal(V, art.item_factors)
        np.testing.assert_array_equal(b, art.item_bias)
        assert st.item_ids == art.item_ids.tolist()

    with TopK(redis_url, timeout=2.0) as topk:
        for row in range(n_users):       # precomputed (even rows) and on demand (odd rows)
            rec = topk.recommend("wide", art.key_ids[row].item(), k=10)
            assert rec.source == ("precomputed" if row % 2 == 0 else "on_demand")
            assert same_answer(rec.items, reference_user(art, row, 10), rtol=1e-4), row
        assert same_answer(topk.recommend("wide", "nobody", k=10).items,
                           reference_fallback(art, 10), rtol=1e-4)
        unit = art.item_factors / np.linalg.norm(art.item_factors, axis=1, keepdims=True)
        ids = art.item_ids.tolist()
        for i in (0, 1234, n_items - 1):
            cos = (unit @ unit[i]).astype(np.float32)
            cos[i] = -np.inf
            order = np.argsort(-cos, kind="stable")[:8]
            rec = topk.similar("wide", ids[i], k=8)
            assert [x for x, _ in rec.items] == [ids[j] for j in order]
            assert np.allclose([s for _, s in rec.items], cos[order], atol=1e-5)
        met = [1, 700, 2999]
        rec = topk.fold_in("wide", [ids[j] for j in met], k=6)
        u = least_squares_fold_in(art.item_factors, met, reg=2.0, alpha=10.0)
        scores = (art.item_factors @ u.astype(np.float32) + art.item_bias).astype(np.float32)
        scores[met] = -np.inf
        order = np.argsort(-scores, kind="stable")[:6]
        assert rec.source == "fold_in"
        assert same_answer(rec.items, [(ids[j], float(scores[j])) for j in order], rtol=1e-4)
    assert ModelKeys("rankstream", "wide").current.encode() in keys
