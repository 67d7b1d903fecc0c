"""The bucket pointers (format 2): a late copy never moves a pointer back, a batch that straddles
a pointer move waits and answers from one version, a publisher that died between its flip and
the pointers is repaired, and format 1 data is refused by readers and cleaned up by publish."""

from __future__ import annotations

import pytest

from pipeline.serving.layout import BUCKETS, ModelKeys, bucket_of, parse_pointer
from pipeline.serving.lookup import TopK
from pipeline.serving.publish import publish
from pipeline.serving.versions import prune, rollback, sync_pointers, versions
from tests.serving.helpers import reference_user, same_answer, user_model

KEYS = ModelKeys("rankstream", "m")


def _pointers(client) -> list:
    return client.mget(KEYS.pointers)


def test_a_late_pointer_copy_never_moves_a_pointer_back(redis_client, redis_url):
    publish("m", user_model(1, n_users=20), redis_client, top_k=5)
    first = redis_client.get(KEYS.current)
    art = user_model(2, n_users=20)
    publish("m", art, redis_client, top_k=5, keep_versions=1)      # v1 pruned
    second = redis_client.get(KEYS.current)
    assert parse_pointer(second, "c")[2] > parse_pointer(first, "c")[2]
    assert set(_pointers(redis_client)) == {second}
    # a publisher that stalled after flipping v1 copies its value now: refused everywhere
    assert sync_pointers(redis_client, KEYS, first) == 0
    assert set(_pointers(redis_client)) == {second}
    with TopK(redis_url) as topk:
        batch = topk.recommend_many("m", art.key_ids.tolist(), k=5)
    assert {r.version for r in batch} == {2}
    assert all(same_answer(r.items, reference_user(art, i, 5)) for i, r in enumerate(batch))


def test_a_batch_straddling_a_pointer_move_answers_from_one_version(redis_client, redis_url):
    old, new = user_model(3, n_users=60), user_model(4, n_users=60)
    publish("m", old, redis_client, top_k=5)
    v1 = redis_client.get(KEYS.current)
    publish("m", new, redis_client, top_k=5)
    users = new.key_ids.tolist()
    behind = {bucket_of(str(u)) for u in users[:30]}
    # half the users' buckets still name version 1: a move under way (or a dead publisher)
    redis_client.mset({KEYS.pointer(b): v1 for b in behind})
    with TopK(redis_url) as topk:
        lone = topk.recommend("m", users[0], k=5)     # one user: the version its pointer names
        assert lone.version == 1 and same_answer(lone.items, reference_user(old, 0, 5))
        batch = topk.recommend_many("m", users, k=5)  # waits, then moves the pointers itself
    assert {r.version for r in batch} == {2}
    assert all(same_answer(r.items, reference_user(new, i, 5)) for i, r in enumerate(batch))
    assert set(_pointers(redis_client)) == {redis_client.get(KEYS.current)}


def test_a_publish_that_died_after_its_flip_is_repaired_by_prune(redis_client, redis_url,
                                                                monkeypatch):
    import pipeline.serving.publish as P

    old, new = user_model(5, n_users=20), user_model(6, n_users=20)
    publish("m", old, redis_client, top_k=5)

    def die(*args, **kwargs):
        raise ConnectionError("publisher killed between its flip and the pointers")

    monkeypatch.setattr(P, "sync_pointers", die)
    with pytest.raises(ConnectionError):
        P.publish("m", new, redis_client, top_k=5)
    monkeypatch.undo()
    assert [(v.version, v.current) for v in versions("m", redis_client)] == [(1, False),
                                                                            (2, True)]
    with TopK(redis_url) as topk:
        # the pointers still name version 1: every answer is version 1's, whole
        assert {r.version for r in topk.recommend_many("m", old.key_ids.tolist(), k=5)} == {1}
        assert prune("m", redis_client) == []       # moves the pointers; deletes nothing
        batch = topk.recommend_many("m", new.key_ids.tolist(), k=5)
    assert {r.version for r in batch} == {2}
    assert set(_pointers(redis_client)) == {redis_client.get(KEYS.current)}


def test_format_1_data_is_refused_by_readers_and_replaced_by_a_publish(redis_client,
                                                                      redis_url):
    tag = KEYS.tag   # what a format 1 publisher left: one tag, current without an epoch
    redis_client.set(f"{tag}:current", "1:00ff00ff")
    redis_client.rpush(f"{tag}:versions", 1)
    redis_client.set(f"{tag}:seq", 1)
    redis_client.hset(f"{tag}:v1:meta", mapping={"format_version": 1, "status": "complete",
                                                   "publish_id": "00ff00ff", "kind": "user_item"})
    redis_client.set(f"{tag}:v1:topk:1", b"\0" * 8)
    with TopK(redis_url) as topk, pytest.raises(Exception, match="format 1 publisher"):
        topk.recommend("m", 1)
    art = user_model(7, n_users=10)
    assert publish("m", art, redis_client, top_k=5, keep_versions=1).pruned == [1]
    assert not list(redis_client.scan_iter(match=f"{tag}:v1:*"))
    with TopK(redis_url) as topk:
        assert same_answer(topk.recommend("m", 1, k=5).items, reference_user(art, 0, 5))
    redis_client.hset(f"{tag}:v2:meta", "format_version", 1)   # a kept version of format 1
    publish("m", art, redis_client, top_k=5)
    with pytest.raises(ValueError, match="format_version 1, this rankstream serves format 2"):
        rollback("m", redis_client)


def test_every_bucket_has_a_pointer_and_keys_spread_over_the_buckets(redis_client):
    art = user_model(8, n_users=2000, n_items=30)
    publish("m", art, redis_client, top_k=3)
    assert len(_pointers(redis_client)) == BUCKETS and None not in _pointers(redis_client)
    used = {bucket_of(str(u)) for u in art.key_ids.tolist()}
    assert len(used) > 0.8 * BUCKETS      # 2000 users in 1024 buckets: most are used
