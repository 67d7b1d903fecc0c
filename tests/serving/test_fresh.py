"""The refresher's serving side against a real redis-server: refreshed users' lists
(``pipeline.serving.fresh``), answered with ``source == "fresh"`` in one round trip, never
mixed with the published list, refused once the version flipped, deleted with the version;
and the version's watermark from the artifact to the meta."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from pipeline.serving import layout as L
from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.fresh import FreshUser, fresh_answer_parts, write_fresh
from pipeline.serving.lookup import TopK
from pipeline.serving.publish import publish
from pipeline.serving.version_cache import load_factors
from pipeline.serving.versions import versions
from tests.serving.helpers import same_answer, user_model

TOP_K = 10
DOC = Path(L.__file__).with_name("REDIS_LAYOUT.md").read_text()


@pytest.fixture
def topk(redis_url, redis_client):
    client = TopK(redis_url, timeout=2.0)
    yield client
    client.close()


def _refreshed(topk, model: str, user, factor, seen_items=(), stamp_ms: int = 1) -> tuple:
    """(FreshUser of ``user`` with ``factor`` and the items ``seen_items``, the version state,
    its items as ranked (id, score) pairs)."""
    st = topk.versions.current_state(model)
    factors = load_factors(topk.transport.bulk, st)
    seen = np.array([st.index_of(x) for x in seen_items], np.int32)
    pairs = fresh_answer_parts(st, factors, factor, seen, st.top_k)
    idx, sc = L.unpack_pairs(pairs)
    items = [(st.item_ids[i], s) for i, s in zip(idx, sc)]
    return FreshUser(L.key_of(user), np.asarray(factor, np.float32), seen, pairs,
                     stamp_ms), st, items


def _version_keys(redis_client, version: int) -> list[str]:
    return [k.decode() for k in redis_client.scan_iter(match="{rankstream:*", count=1000)
            if f":v{version}:" in k.decode()]


def test_fresh_keys_are_documented_and_built_as_documented():
    section = DOC.split("## Refreshed users (the refresher)\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().split("|")[1:-1]] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("| ---")][1:]
    assert {r[0].strip("`"): (r[1].strip("`"), r[2]) for r in rows} == {
        name: (pattern, rtype) for name, (pattern, rtype, _) in L.FRESH_KEY_PATTERNS.items()}
    vk, b = L.ModelKeys("ns", "m").version(7), L.bucket_of("alice")
    assert vk.fresh("alice") == "{ns:m:" + str(b) + "}:v7:fresh:alice"
    assert vk.fresh_keys(b) == "{ns:m:" + str(b) + "}:v7:fresh_keys"
    assert "watermark" in L.META_FIELDS


def test_fresh_list_is_what_publish_writes_for_that_factor(redis_client, topk):
    art = user_model(1)
    publish("movies", art, redis_client, top_k=TOP_K)
    st = topk.versions.current_state("movies")
    factors = load_factors(topk.transport.bulk, st)
    vk = L.ModelKeys("rankstream", "movies").version(st.version)
    for row in (0, 5, 17):
        seen = art.seen_indices[art.seen_indptr[row]:art.seen_indptr[row + 1]]
        got = fresh_answer_parts(st, factors, art.user_factors[row], seen, TOP_K)
        stored = redis_client.get(vk.topk(L.key_of(int(art.key_ids[row]))))
        (gi, gs), (si, ss) = L.unpack_pairs(got), L.unpack_pairs(stored)
        assert gi == si and np.allclose(gs, ss, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="rank 6"):
        fresh_answer_parts(st, factors, np.ones(3), [], TOP_K)
    with pytest.raises(ValueError, match="80 items"):
        fresh_answer_parts(st, factors, np.ones(6), [80], TOP_K)


def test_a_refreshed_user_is_answered_fresh_in_every_path(redis_client, topk):
    art = user_model(2, served_as="challenger-als")
    publish("movies", art, redis_client, top_k=TOP_K)
    user, other = int(art.key_ids[3]), int(art.key_ids[4])
    before = topk.recommend("movies", user, k=5)
    assert before.source == "challenger-als"
    factor = -art.user_factors[3]
    met = [int(art.item_ids[0]), int(art.item_ids[1])]
    fresh, st, items = _refreshed(topk, "movies", user, factor, met, stamp_ms=1234)
    assert write_fresh(redis_client, st.keys, st.version, st.publish_id, [fresh]) == [True]
    assert items != before.items[:len(items)]
    vk = st.vkeys
    assert redis_client.get(vk.fresh(fresh.key)) == b"1234"
    assert redis_client.smembers(vk.fresh_keys(L.bucket_of(fresh.key))) == {fresh.key.encode()}

    rec = topk.recommend("movies", user, k=5)     # the one-round-trip path
    assert (rec.items, rec.source, rec.version) == (items[:5], "fresh", st.version)
    many = topk.recommend_many("movies", [other, user], k=5)
    assert [r.source for r in many] == ["challenger-als", "fresh"] and many[1].items == items[:5]
    # filtered (the resolve path), and past the stored list (scored from the fresh factor)
    drop = items[0][0]
    filtered = topk.recommend("movies", user, k=5, exclude=[drop])
    assert filtered.source == "fresh" and filtered.items == items[1:6]
    longer = topk.recommend("movies", user, k=TOP_K + 5)
    V, b = load_factors(topk.transport.bulk, st)
    scores = (V @ factor.astype(np.float32) + b).astype(np.float32)
    scores[[st.index_of(x) for x in met]] = -np.inf
    order = np.argsort(-scores, kind="stable")[:TOP_K + 5]
    assert longer.source == "fresh"
    assert same_answer(longer.items, [(st.item_ids[i], float(scores[i])) for i in order])
    assert not set(met) & {i for i, _ in longer.items}
    assert topk.stats()["movies"]["fresh"] == 4
    topk.counts.flush()
    assert redis_client.hget(st.keys.lookups, f"{st.version}:fresh") == b"4"


def test_a_user_the_version_never_met_gets_their_own_list(redis_client, topk):
    art = user_model(3)
    publish("movies", art, redis_client, top_k=TOP_K)
    assert topk.recommend("movies", 999_999, k=4).source == "fallback"
    factor = np.linspace(-1, 1, art.rank)
    fresh, st, items = _refreshed(topk, "movies", 999_999, factor, [int(art.item_ids[2])])
    other, _, other_items = _refreshed(topk, "movies", "new-user", -factor)
    assert write_fresh(redis_client, st.keys, st.version, st.publish_id,
                       [fresh, other]) == [True, True]
    rec = topk.recommend("movies", 999_999, k=4)
    assert (rec.items, rec.source) == (items[:4], "fresh")
    both = topk.recommend_many("movies", ["new-user", 999_999, int(art.key_ids[0])], k=4)
    assert [r.source for r in both] == ["fresh", "fresh", "precomputed"]
    assert both[0].items == other_items[:4] and both[1].items == items[:4]


def test_a_write_to_a_version_flipped_away_writes_nothing(redis_client, topk):
    art = user_model(4)
    first = publish("movies", art, redis_client, top_k=TOP_K)
    st = topk.versions.current_state("movies")
    users = [_refreshed(topk, "movies", u, np.ones(art.rank))[0] for u in
             [int(art.key_ids[0]), int(art.key_ids[1]), "stranger", 424242]]
    publish("movies", user_model(5), redis_client, top_k=TOP_K)
    before = {k: redis_client.get(k) for k in _version_keys(redis_client, first.version)
              if redis_client.type(k) == b"string"}
    assert write_fresh(redis_client, st.keys, first.version, first.publish_id,
                       users) == [False] * 4
    after = {k: redis_client.get(k) for k in _version_keys(redis_client, first.version)
             if redis_client.type(k) == b"string"}
    assert after == before and not any("fresh" in k for k in after)
    # a publish id that is not the version's is refused the same way
    assert write_fresh(redis_client, st.keys, 2, "0" * 16, users[:1]) == [False]
    assert write_fresh(redis_client, st.keys, 2, first.publish_id, []) == []


@pytest.mark.parametrize("index", ["complete", "incomplete"])
def test_deleting_a_version_deletes_its_fresh_keys(redis_client, topk, index):
    art = user_model(6)
    first = publish("movies", art, redis_client, top_k=TOP_K)
    st = topk.versions.current_state("movies")
    users = [_refreshed(topk, "movies", u, np.ones(art.rank), stamp_ms=9)[0] for u in
             [int(art.key_ids[0]), int(art.key_ids[7]), "stranger", "other-stranger"]]
    assert all(write_fresh(redis_client, st.keys, st.version, st.publish_id, users))
    names = _version_keys(redis_client, first.version)
    assert sum(":fresh:" in n for n in names) == 4
    if index == "incomplete":   # a chunk gone: the prune finds the keys by SCAN
        chunk = next(n for n in names if re.search(r":keys:\d+$", n))
        redis_client.delete(chunk)
    publish("movies", user_model(7), redis_client, top_k=TOP_K, keep_versions=1)
    assert _version_keys(redis_client, first.version) == []
    assert [v.version for v in versions("movies", redis_client)] == [first.version + 1]


def test_the_watermark_goes_from_the_artifact_to_the_meta(redis_client, topk, tmp_path):
    mark = {"rankstream.rating/0": 42, "rankstream.rating/1": 7}
    art = user_model(8, watermark=mark)
    loaded = ModelArtifact.load(art.save(tmp_path / "art"))
    assert loaded.watermark == mark
    publish("movies", loaded, redis_client, top_k=TOP_K)
    [info] = versions("movies", redis_client)
    assert info.watermark == mark
    assert topk.versions.current_state("movies").watermark == mark
    # an artifact saved before watermarks loads with None and publishes {}
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    del manifest["watermark"]
    (tmp_path / "art" / "manifest.json").write_text(json.dumps(manifest))
    old = ModelArtifact.load(tmp_path / "art")
    assert old.watermark is None
    publish("movies", old, redis_client, top_k=TOP_K)
    assert versions("movies", redis_client)[-1].watermark == {}
    for bad in ({"no-partition": 1}, {"t/0": -1}, {"t/x": 1}, [1]):
        with pytest.raises(ValueError, match="watermark"):
            user_model(8, watermark=bad)


def test_readers_see_one_whole_list_while_a_user_is_rewritten(redis_url, redis_client, topk):
    """One thread rewrites a user between two lists A and B; readers (single, batch, past the
    stored list) never see a mix, nor a fresh source with the published list."""
    art = user_model(9)
    publish("movies", art, redis_client, top_k=TOP_K)
    user, other = int(art.key_ids[11]), int(art.key_ids[12])
    k_long = TOP_K + 6
    published = topk.recommend("movies", user, k=TOP_K).items
    published_long = topk.recommend("movies", user, k=k_long).items
    rng = np.random.default_rng(0)
    writes = {}
    for name in "AB":
        factor = rng.standard_normal(art.rank) * 3
        fresh, st, items = _refreshed(topk, "movies", user, factor, [int(art.item_ids[5])])
        V, b = load_factors(topk.transport.bulk, st)
        scores = (V @ fresh.factor + b).astype(np.float32)
        scores[5] = -np.inf
        order = np.argsort(-scores, kind="stable")[:k_long]
        writes[name] = (fresh, items, [(st.item_ids[i], float(scores[i])) for i in order])
    assert writes["A"][1] != writes["B"][1] and published not in (writes["A"][1],
                                                                  writes["B"][1])
    stop, errors, seen = threading.Event(), [], {"A": 0, "B": 0, "published": 0}
    n_writes = [0]

    def kind_of(items, long=False) -> str | None:
        for name in "AB":
            expected = writes[name][2] if long else writes[name][1]
            if (same_answer(items, expected) if long else items == expected):
                return name
        return None

    def reader(mode: str, n: int):
        with TopK(redis_url, timeout=2.0) as client:
            try:
                for _ in range(n):
                    if mode == "one":
                        recs = [client.recommend("movies", user, k=TOP_K)]
                    elif mode == "many":
                        recs = client.recommend_many("movies", [other, user], k=TOP_K)[1:]
                    else:
                        recs = [client.recommend("movies", user, k=k_long)]
                    rec = recs[0]
                    got = kind_of(rec.items, long=mode == "long")
                    if rec.source == "fresh" and got is not None:
                        seen[got] += 1
                    elif rec.source in ("precomputed", "on_demand") and rec.items == (
                            published_long if mode == "long" else published):
                        seen["published"] += 1
                    else:
                        errors.append((mode, rec.source, rec.items))
                        return
            except Exception as err:   # noqa: BLE001 - reported by the test
                errors.append((mode, repr(err)))

    def writer():
        flip = 0
        while not stop.is_set():
            fresh = writes["AB"[flip]][0]
            fresh.stamp_ms = n_writes[0] + 1
            ok = write_fresh(redis_client, st.keys, st.version, st.publish_id, [fresh])
            if ok != [True]:
                errors.append(("writer", ok))
                return
            n_writes[0] += 1
            flip ^= 1

    readers = [threading.Thread(target=reader, args=(mode, 800))
               for mode in ("one", "many", "long")]
    for t in readers:
        t.start()
    w = threading.Thread(target=writer)
    w.start()
    for t in readers:
        t.join(120)
    stop.set()
    w.join(30)
    assert not errors, errors[:3]
    assert sum(seen.values()) == 2400
    assert seen["A"] > 0 and seen["B"] > 0 and n_writes[0] > 20, (seen, n_writes)
