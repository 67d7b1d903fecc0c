"""Publish -> lookup returns exactly the model's own top-K (numpy reference), for every kind;
pruning, rollback, namespaces, malformed keys, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.layout import (
    LayoutError,
    ModelKeys,
    UnknownModelError,
    pack_i32,
    pack_pairs,
)
from pipeline.serving.lookup import TopK
from pipeline.serving.publish import publish
from pipeline.serving.versions import rollback, versions
from tests.serving.helpers import (
    reference_fallback,
    reference_global,
    reference_user,
    same_answer,
    user_model,
)


@pytest.fixture
def topk(redis_url, redis_client):
    client = TopK(redis_url, timeout=2.0)
    yield client
    client.close()


@pytest.mark.parametrize("str_ids", [False, True])
def test_user_model_lists_match_numpy(redis_client, topk, str_ids):
    art = user_model(0, str_ids=str_ids)
    res = publish("movies", art, redis_client, top_k=15)
    assert res.version == 1 and res.n_lists == art.n_keys
    users = art.key_ids.tolist()
    for row, user in enumerate(users):
        for k in (1, 10, 15):
            rec = topk.recommend("movies", user, k=k)
            assert rec.source == "precomputed" and rec.version == 1 and not rec.stale
            assert same_answer(rec.items, reference_user(art, row, k)), (user, k)
    batch = topk.recommend_many("movies", users, k=10)
    assert [r.user for r in batch] == users
    for row, rec in enumerate(batch):
        assert rec.source == "precomputed"
        assert same_answer(rec.items, reference_user(art, row, 10))


def test_seen_items_are_excluded_and_short_lists_kept(redis_client, topk):
    # user 0 has seen all but 3 items: the list holds only those 3
    art = ModelArtifact.user_item(user_ids=[0, 1], item_ids=list(range(8)),
                                  user_factors=np.eye(2, 3), item_factors=np.arange(24.0)
                                  .reshape(8, 3) % 5, seen=([0, 5, 5], [0, 1, 2, 3, 4]))
    publish("m", art, redis_client, top_k=6)
    rec = topk.recommend("m", 0, k=6)
    assert sorted(i for i, _ in rec.items) == [5, 6, 7] and rec.source == "precomputed"
    assert len(topk.recommend("m", 1, k=6).items) == 6


def test_on_demand_users_and_long_k_match_numpy(redis_client, topk):
    mask = np.arange(60) % 4 == 0  # a quarter of the users get a precomputed list
    art = user_model(3, precompute=mask)
    publish("m", art, redis_client, top_k=8)
    for row, user in enumerate(art.key_ids.tolist()):
        rec = topk.recommend("m", user, k=8)
        assert rec.source == ("precomputed" if mask[row] else "on_demand")
        assert same_answer(rec.items, reference_user(art, row, 8))
        longer = topk.recommend("m", user, k=25)  # beyond top_k: scored on demand
        assert longer.source == "on_demand"
        assert same_answer(longer.items, reference_user(art, row, 25))
    mixed = topk.recommend_many("m", art.key_ids.tolist()[:8] + [999999], k=5)
    assert [r.source for r in mixed][:5] == ["precomputed", "on_demand", "on_demand",
                                             "on_demand", "precomputed"]
    assert mixed[-1].source == "fallback" and len({r.version for r in mixed}) == 1


def test_k_past_the_apis_bound_is_refused_as_the_api_and_cli_refuse_it(redis_client, topk):
    """The client keeps the bound the HTTP API and `rankstream recommend` keep (1,000): a k of
    100,000 asked for a whole catalogue in one answer (issue 51)."""
    art = user_model(3)
    publish("m", art, redis_client, top_k=8)
    user = art.key_ids.tolist()[0]
    assert len(topk.recommend("m", user, k=1000).items) > 8    # the bound itself: all unseen
    for ask in (lambda k: topk.recommend("m", user, k=k),
                lambda k: topk.recommend_many("m", [user], k=k),
                lambda k: topk.similar("m", art.item_ids[0].item(), k=k),
                lambda k: topk.fold_in("m", [art.item_ids[0].item()], k=k)):
        with pytest.raises(ValueError, match=r"k is 100000, expected 0\.\.1000"):
            ask(100_000)
        with pytest.raises(ValueError, match=r"k is -1, expected 0\.\.1000"):
            ask(-1)


def test_unknown_user_gets_the_fallback_list_and_is_told(redis_client, topk):
    art = user_model(4)
    publish("m", art, redis_client, top_k=10)
    rec = topk.recommend("m", "nobody", k=7)
    assert rec.source == "fallback"
    assert same_answer(rec.items, reference_fallback(art, 7))
    given = ModelArtifact.user_item(user_ids=[1], item_ids=[5, 6, 7], user_factors=[[1.0]],
                                    item_factors=[[1.0], [2.0], [3.0]],
                                    fallback_scores=[9.0, 1.0, 5.0])
    publish("m2", given, redis_client)
    assert topk.recommend("m2", 42, k=2).items == [(5, 9.0), (7, 5.0)]


def test_global_list_and_predicted_ratings(redis_client, topk):
    rng = np.random.default_rng(5)
    ids = np.arange(500) * 3
    scores = rng.standard_normal(500)
    publish("toppush", ModelArtifact.global_list(item_ids=ids, scores=scores,
                                                 algorithm="TopPush"), redis_client, top_k=50)
    rec = topk.recommend("toppush", k=20)
    assert rec.source == "global" and rec.user is None
    assert same_answer(rec.items, reference_global(ids, scores, 20))
    assert topk.recommend("toppush", "anyone", k=50).items[:20] == rec.items  # user ignored
    assert [r.source for r in topk.recommend_many("toppush", ["a", "b"], k=3)] == ["global"] * 2
    ratings = rng.integers(1, 6, 300)
    publish("npsvor", ModelArtifact.predicted_ratings(item_ids=[f"i{i}" for i in range(300)],
                                                      ratings=ratings), redis_client, top_k=30)
    rec = topk.recommend("npsvor", k=30)
    assert same_answer(rec.items, reference_global([f"i{i}" for i in range(300)], ratings, 30))
    assert [s for _, s in rec.items] == sorted((s for _, s in rec.items), reverse=True)


def test_query_docs_lists(redis_client, topk):
    art = ModelArtifact.query_docs(query_ids=["q1", "q2", "q3"], doc_ids=["d0", "d1", "d2", "d3"],
                                   indptr=[0, 3, 4, 4], docs=[0, 2, 3, 1],
                                   scores=[0.5, 2.0, 1.0, 0.3])
    publish("rank", art, redis_client, top_k=2)
    assert topk.recommend("rank", "q1", k=5).items == [("d2", 2.0), ("d3", 1.0)]
    assert topk.recommend("rank", "q2").items == [("d1", pytest.approx(0.3))]
    missing = topk.recommend("rank", "q3")  # no candidates, no fallback
    assert missing.source == "missing" and missing.items == []


def test_pruning_keeps_exactly_keep_versions(redis_client, topk):
    kept_answers = {}
    for seed in range(6):
        art = user_model(seed, n_users=10, n_items=20)
        res = publish("m", art, redis_client, top_k=5, keep_versions=3)
        kept_answers[res.version] = topk.recommend("m", art.key_ids[0], k=5).items
        assert res.pruned == ([res.version - 3] if res.version > 3 else [])
    assert [v.version for v in versions("m", redis_client)] == [4, 5, 6]
    assert [v.current for v in versions("m", redis_client)] == [False, False, True]
    left = {k.decode().split(":")[2]
            for k in redis_client.scan_iter(match="{rankstream:m}:v[0-9]*")}
    assert left == {"v4", "v5", "v6"}
    in_buckets = {k.decode().split("}:")[1].split(":")[0]
                  for k in redis_client.scan_iter(match="{rankstream:m:*}:v[0-9]*")}
    assert in_buckets == {"v4", "v5", "v6"}   # per-user keys of pruned versions too
    # rollback restores the previous answers, and forward again
    assert rollback("m", redis_client) == 5
    assert topk.recommend("m", 1, k=5).items == kept_answers[5]
    assert rollback("m", redis_client) == 4
    assert topk.recommend("m", 1, k=5).items == kept_answers[4]
    with pytest.raises(ValueError, match="no kept version older than the current version 4"):
        rollback("m", redis_client)
    assert rollback("m", redis_client, version=6) == 6
    assert topk.recommend("m", 1, k=5).items == kept_answers[6]
    with pytest.raises(ValueError, match="version 2 is not kept"):
        rollback("m", redis_client, version=2)
    # a publish after a rollback keeps the current version even when it is the oldest
    rollback("m", redis_client, version=4)
    publish("m", user_model(9, n_users=10, n_items=20), redis_client, keep_versions=1)
    assert [v.version for v in versions("m", redis_client)] == [7]


def test_concurrent_publisher_never_flips_current_backwards(redis_client, topk, monkeypatch):
    """Publisher A takes version 1 and is slow; B takes version 2 and flips first. A's flip
    is refused (it would move `current` back to older data and break the order of
    `versions`): A's version is deleted and SupersededError says why."""
    import pipeline.serving.publish as P

    real_flip = P.flip
    newer = user_model(2, n_users=10, n_items=20)

    def slow_flip(client, keys, version, publish_id, fence=None):
        if version == 1:                      # B runs and finishes while A is about to flip
            monkeypatch.setattr(P, "flip", real_flip)
            assert publish("m", newer, redis_client, top_k=5).version == 2
        real_flip(client, keys, version, publish_id, fence)

    monkeypatch.setattr(P, "flip", slow_flip)
    with pytest.raises(P.SupersededError, match="version 2 was published after version 1"):
        publish("m", user_model(1, n_users=10, n_items=20), redis_client, top_k=5)
    assert [(v.version, v.current) for v in versions("m", redis_client)] == [(2, True)]
    assert not list(redis_client.scan_iter(match="{rankstream:m}:v1:*"))
    assert not list(redis_client.scan_iter(match="{rankstream:m:*}:v1:*"))
    assert same_answer(topk.recommend("m", newer.key_ids[0], k=5).items,
                       reference_user(newer, 0, 5))
    assert publish("m", user_model(3, n_users=10, n_items=20), redis_client).version == 3


def test_namespaces_are_separate(redis_url, redis_client):
    a, b = user_model(1, n_users=5), user_model(2, n_users=5)
    publish("m", a, redis_client, top_k=5, namespace="team-a")
    publish("m", b, redis_client, top_k=5, namespace="team-b")
    with TopK(redis_url, namespace="team-a") as ta, TopK(redis_url, namespace="team-b") as tb:
        assert same_answer(ta.recommend("m", 1, k=5).items, reference_user(a, 0, 5))
        assert same_answer(tb.recommend("m", 1, k=5).items, reference_user(b, 0, 5))
        with pytest.raises(UnknownModelError, match="namespace 'rankstream'"):
            TopK(redis_url).recommend("m", 1)


def test_artifact_save_load_round_trip_without_pickle(tmp_path, redis_client, topk):
    art = user_model(7, str_ids=True, loser_counts=np.arange(80) * 3)
    path = art.save(tmp_path / "art")
    assert json.loads((path / "manifest.json").read_text())["kind"] == "user_item"
    with np.load(path / "arrays.npz", allow_pickle=False) as npz:
        assert npz["key_ids"].dtype.kind == "U"
    again = ModelArtifact.load(path)
    for name in ("item_ids", "key_ids", "user_factors", "seen_indices", "loser_counts"):
        assert np.array_equal(getattr(again, name), getattr(art, name))
    publish("m", again, redis_client, top_k=5)
    assert same_answer(topk.recommend("m", "user-3", k=5).items, reference_user(art, 3, 5))


def test_artifact_errors_name_both_values():
    with pytest.raises(ValueError, match=r"item_factors has shape \(3, 2\), expected \(3, 4\)"):
        ModelArtifact.user_item(user_ids=[1], item_ids=[1, 2, 3], user_factors=np.ones((1, 4)),
                                item_factors=np.ones((3, 2)))
    with pytest.raises(ValueError, match="duplicate"):
        ModelArtifact.global_list(item_ids=[1, 1], scores=[0, 1])
    with pytest.raises(ValueError, match="non-finite"):
        ModelArtifact.global_list(item_ids=[1, 2], scores=[0, np.nan])
    with pytest.raises(ValueError, match=r"loser_counts has shape \(2,\) and dtype int64, "
                                         r"expected \(3,\) counts"):
        ModelArtifact.user_item(user_ids=[1], item_ids=[1, 2, 3], user_factors=np.ones((1, 2)),
                                item_factors=np.ones((3, 2)), loser_counts=np.array([1, 2]))


def _setup_malformed(redis_client):
    publish("m", user_model(0, n_users=5, n_items=10), redis_client, top_k=5)
    return "{rankstream:m}"


V1 = ModelKeys("rankstream", "m").version(1)   # user 1's keys are in its bucket's hash tag


@pytest.mark.parametrize("damage, message", [
    (lambda r, t: r.set(f"{t}:current", "banana"),
     "expected '<version>:<publish_id>:<epoch>'"),
    (lambda r, t: r.set(f"{t}:current", "1:00ff00ff"), "written by a format 1 publisher"),
    (lambda r, t: (r.delete(f"{t}:current"), r.hset(f"{t}:current", "a", "b")),
     "not a string key"),
    (lambda r, t: r.set(V1.topk("1"), b"1234567"), "not up to 5"),
    (lambda r, t: r.set(V1.topk("1"), pack_pairs([99], [1.0])), "outside the version"),
    (lambda r, t: (r.delete(V1.topk("1")), r.hset(V1.topk("1"), "x", "y")),
     "exists but is not a string"),
    (lambda r, t: r.hset(f"{t}:v1:meta", "format_version", "99"), "format_version '99'"),
    (lambda r, t: r.hset(f"{t}:v1:meta", "format_version", "1"), "format_version '1'"),
    (lambda r, t: r.set(f"{t}:v1:items:0", b"xyz"), "does not hold int64 ids"),
    (lambda r, t: (r.delete(V1.topk("1")), r.set(V1.user_factor("1"), b"12345")),
     "expected a multiple of 4"),
])
def test_malformed_or_foreign_keys_raise_a_clear_error(redis_url, redis_client, damage,
                                                        message):
    tag = _setup_malformed(redis_client)
    damage(redis_client, tag)
    with TopK(redis_url) as topk, pytest.raises(LayoutError, match=message):
        topk.recommend("m", 1, k=3)


def test_malformed_loser_counts_raise_a_clear_error(redis_url, redis_client):
    """The counts a popularity fold-in draws by are read with the factors: a chunk of the
    wrong length or a negative count is the layout's error, not a draw by NaN weights."""
    spec = {"method": "pairwise", "reg": 0.5, "loss": "squared_hinge", "per_item": 2,
            "sampling": "popularity"}
    publish("m", user_model(0, n_users=5, n_items=10, fold_in=spec,
                            loser_counts=np.arange(10)), redis_client, top_k=5)
    for value, message in ((pack_i32([1, 2]), r"hold \(2,\) counts"),
                           (pack_i32([-1] + [0] * 9), "least -1")):
        redis_client.set(V1.loser_counts(0), value)
        with TopK(redis_url) as topk, pytest.raises(LayoutError, match=message):
            topk.fold_in("m", [100, 107], k=3)


def test_malformed_versions_list_raises(redis_client):
    tag = _setup_malformed(redis_client)
    redis_client.rpush(f"{tag}:versions", "not-a-number")
    with pytest.raises(LayoutError, match="expected version numbers"):
        versions("m", redis_client)


def test_unknown_model(topk):
    with pytest.raises(UnknownModelError, match="model 'nothing' has no published version"):
        topk.recommend("nothing", 1)


def test_cli_publish_recommend_versions_rollback(tmp_path, redis_url, redis_client, capsys):
    art = user_model(11, n_users=4, n_items=12)
    art.save(tmp_path / "a")
    common = ["--redis-url", redis_url, "--namespace", "cli", "--home", str(tmp_path)]
    assert main(["publish", "m", str(tmp_path / "a"), "--top-k", "5", "--no-progress",
                 *common]) == 0
    assert main(["publish", "m", str(tmp_path / "a"), "--top-k", "4", "--no-progress",
                 *common]) == 0
    assert "version 2" in capsys.readouterr().out
    assert main(["recommend", "m", "1", "-k", "3", "--json", *common]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["version"] == 2 and out["source"] == "precomputed"
    assert same_answer([(i, s) for i, s in out["items"]], reference_user(art, 0, 3))
    assert main(["versions", "m", *common]) == 0
    table = capsys.readouterr().out
    assert "*       2" in table and "       1" in table
    assert main(["rollback", "m", *common]) == 0
    assert "current version 2 -> 1" in capsys.readouterr().out
    assert main(["recommend", "nope", "1", *common]) == 1
    assert "model 'nope' is not served" in capsys.readouterr().err


def test_lookups_count_their_answer_sources_and_models_shows_the_fallback_share(
        redis_url, redis_client, tmp_path, capsys):
    from pipeline.serving.versions import answer_counts

    art = user_model(4, n_users=10, n_items=20)
    publish("m", art, redis_client, top_k=5)
    with TopK(redis_url) as topk:
        for user in list(art.key_ids[:3]) + ["stranger-1", "stranger-2"]:
            topk.recommend("m", user, k=5)
        assert topk.stats() == {"m": {"precomputed": 3, "fallback": 2}}
    assert answer_counts("m", redis_client) == {1: {"precomputed": 3, "fallback": 2}}
    config = tmp_path / "models.toml"
    config.write_text('[models.m]\nalgorithm = "altsvm"\n')
    assert main(["models", "--config", str(config), "--home", str(tmp_path),
                 "--redis-url", redis_url]) == 0
    assert "40.0% of 5" in capsys.readouterr().out
    publish("m", art, redis_client, top_k=5, keep_versions=1)   # v1 pruned: its counts too
    assert answer_counts("m", redis_client) == {}
