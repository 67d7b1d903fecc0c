"""Filters (exactly k whenever k eligible items exist), similar items and fold-in, through a
real Redis, against numpy references."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.serving import item_queries
from pipeline.serving.artifact import ModelArtifact
from pipeline.serving.item_queries import UnknownItemError
from pipeline.serving.lookup import TopK
from pipeline.serving.publish import publish
from solvers.fold_in import implicit_pairs, least_squares_fold_in, pairwise_fold_in
from solvers.pairs import popularity_cum
from tests.serving.helpers import reference_fallback, same_answer, user_model

TOP_K = 10


@pytest.fixture
def topk(redis_url, redis_client):
    client = TopK(redis_url, timeout=2.0)
    yield client
    client.close()


def _eligible_reference(art, row, k, exclude=(), allow=None, scores=None) -> list:
    """Top k of every eligible item: not seen (for a user), not excluded, allowed."""
    ids = art.item_ids.tolist()
    if scores is None:
        scores = (art.user_factors[row] @ art.item_factors.T + art.item_bias).astype(np.float32)
    scores = np.array(scores, dtype=np.float32)
    if row is not None:
        scores[art.seen_indices[art.seen_indptr[row]:art.seen_indptr[row + 1]]] = -np.inf
    for x in exclude:
        if x in ids:
            scores[ids.index(x)] = -np.inf
    if allow is not None:
        keep = np.zeros(len(ids), bool)
        keep[[ids.index(x) for x in allow if x in ids]] = True
        scores[~keep] = -np.inf
    order = [i for i in np.argsort(-scores, kind="stable") if np.isfinite(scores[i])][:k]
    return [(ids[i], float(scores[i])) for i in order]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(row=st.integers(0, 59), k=st.integers(1, 40), n_excluded=st.integers(0, 40),
       use_allow=st.booleans(), seed=st.integers(0, 10**6))
def test_filtered_answers_hold_k_eligible_items(redis_client, topk, row, k, n_excluded,
                                                use_allow, seed):
    art = user_model(0)
    if redis_client.get("{rankstream:movies}:current") is None:
        publish("movies", art, redis_client, top_k=TOP_K)
    rng = np.random.default_rng(seed)
    ids = art.item_ids.tolist()
    exclude = [int(x) for x in rng.choice(ids, n_excluded, replace=False)] + [999_999]
    allow = [int(x) for x in rng.choice(ids, 25, replace=False)] if use_allow else None
    user = int(art.key_ids[row])
    rec = topk.recommend("movies", user, k=k, exclude=[str(x) for x in exclude], allow=allow)
    expected = _eligible_reference(art, row, k, exclude, allow)
    assert len(rec.items) == len(expected) == min(k, len(expected))
    assert same_answer(rec.items, expected), (rec.source, rec.items, expected)
    # the batch answers the same
    many = topk.recommend_many("movies", [user, user], k=k, exclude=exclude, allow=allow)
    assert all(same_answer(r.items, expected) for r in many)
    # an unknown user gets the fallback ranking of every eligible item, k of them
    fallback_scores = art.item_factors @ art.user_factors.mean(axis=0) + art.item_bias
    unknown = topk.recommend("movies", "nobody", k=k, exclude=exclude, allow=allow)
    assert unknown.source == "fallback"
    assert same_answer(unknown.items, _eligible_reference(art, None, k, exclude, allow,
                                                          fallback_scores))


def test_unfiltered_fallback_past_the_stored_list_holds_k(redis_client, topk):
    art = user_model(1)
    publish("movies", art, redis_client, top_k=TOP_K)
    rec = topk.recommend("movies", "nobody", k=3 * TOP_K)
    assert rec.source == "fallback" and len(rec.items) == 3 * TOP_K
    assert same_answer(rec.items, reference_fallback(art, 3 * TOP_K))


def test_a_global_list_model_filters_past_its_stored_list(redis_client, topk):
    scores = np.linspace(1.0, 0.0, 50)
    art = ModelArtifact.global_list(item_ids=np.arange(50) + 1000, scores=scores)
    publish("popular", art, redis_client, top_k=5)
    rec = topk.recommend("popular", None, k=5, exclude=list(range(1000, 1010)))
    assert [i for i, _ in rec.items] == list(range(1010, 1015))
    assert [i for i, _ in topk.recommend("popular", None, k=3, allow=[1049, 1020]).items] == [
        1020, 1049]


def test_similar_items_are_the_cosine_neighbours(redis_client, topk):
    art = user_model(2)
    publish("movies", art, redis_client, top_k=TOP_K)
    V = art.item_factors.astype(np.float64)
    unit = V / np.linalg.norm(V, axis=1, keepdims=True)
    for i in (0, 17, 79):
        item = int(art.item_ids[i])
        cos = unit @ unit[i]
        cos[i] = -np.inf
        expected = _eligible_reference(art, None, 8, scores=cos)
        rec = topk.similar("movies", item, k=8)
        assert rec.source == "on_demand" and rec.user == item
        assert same_answer(rec.items, expected, rtol=1e-4)
        filtered = topk.similar("movies", str(item), k=8, exclude=[expected[0][0]])
        assert [x for x, _ in filtered.items] == [x for x, _ in expected[1:]] + [
            x for x, _ in _eligible_reference(art, None, 9, scores=cos)[8:]]
    with pytest.raises(UnknownItemError, match="not in model"):
        topk.similar("movies", 424242, k=3)


@pytest.mark.parametrize("kept", [5, 100], ids=["head-of-5", "head-of-100"])
def test_similar_from_a_kept_head_is_the_full_ranking_whatever_the_filter(
        redis_client, topk, monkeypatch, kept):
    """An item's kept head answers a filtered lookup only when it still holds k items (or the
    whole catalogue); the answers equal the full ranking's for excludes and allow lists that
    leave the head short (a head of 5 of 80 items) and for k past the head."""
    monkeypatch.setattr(item_queries, "SIMILAR_KEPT", kept)
    art = user_model(6)
    publish("movies", art, redis_client, top_k=TOP_K)
    V = art.item_factors.astype(np.float32)
    unit = (V / np.linalg.norm(V, axis=1, keepdims=True)).astype(np.float32)
    ids = art.item_ids.tolist()
    rng = np.random.default_rng(6)
    for trial in range(60):
        i = int(rng.integers(len(ids)))
        cos = unit @ unit[i]
        cos[i] = -np.inf
        k = int(rng.integers(1, 12 if trial % 3 else 90))
        exclude = [ids[j] for j in rng.choice(len(ids), int(rng.integers(0, 8)), replace=False)]
        allow = None if trial % 2 else \
            [ids[j] for j in rng.choice(len(ids), int(rng.integers(0, 40)), replace=False)]
        got = topk.similar("movies", ids[i], k=k, exclude=exclude, allow=allow)
        expected = _eligible_reference(art, None, k, exclude, allow, scores=cos)
        assert [x for x, _ in got.items] == [x for x, _ in expected], trial
        assert same_answer(got.items, expected, rtol=1e-5), trial


def test_similar_heads_kept_are_bounded_per_version(redis_client, topk, monkeypatch):
    monkeypatch.setattr(item_queries, "SIMILAR_ITEMS_KEPT", 3)
    art = user_model(7)
    publish("movies", art, redis_client, top_k=TOP_K)
    for item in art.item_ids[:10].tolist():
        topk.similar("movies", item, k=4)
    heads = topk.versions.current_state("movies").derived["similar"]
    assert list(heads) == [7, 8, 9]     # the last three asked, as item indices


def test_pairwise_fold_in_solves_the_users_own_problem(redis_client, topk):
    spec = {"method": "pairwise", "reg": 0.5, "loss": "squared_hinge", "per_item": 5}
    art = user_model(3, fold_in=spec)
    publish("movies", art, redis_client, top_k=TOP_K)
    met = [int(x) for x in art.item_ids[[3, 9, 40, 41]]]
    rec = topk.fold_in("movies", met + [555_555], k=6)
    assert rec.source == "fold_in" and len(rec.items) == 6
    index = [3, 9, 40, 41]
    V = art.item_factors.astype(np.float64)
    b = art.item_bias.astype(np.float64)
    u = pairwise_fold_in(V.astype(np.float32).astype(np.float64),
                         b.astype(np.float32).astype(np.float64),
                         implicit_pairs(index, len(V), 5), reg=0.5, loss="squared_hinge")
    scores = art.item_factors.astype(np.float32) @ u.astype(np.float32) + art.item_bias
    expected = _eligible_reference(art, None, 6, exclude=met, scores=scores)
    assert same_answer(rec.items, expected, rtol=1e-4)
    assert not set(met) & {i for i, _ in rec.items}
    # the same request twice: the same answer (the sampled pairs are seeded by the items)
    assert topk.fold_in("movies", met, k=6).items == rec.items


def test_a_popularity_fold_in_draws_losers_by_the_counts_the_version_publishes(
        redis_client, topk):
    """Training drew its losers by (count + 1)^0.75 of the users who met each item: the version
    publishes those counts (chunked, read with the factors) and its fold-in draws by them."""
    spec = {"method": "pairwise", "reg": 0.5, "loss": "squared_hinge", "per_item": 5,
            "sampling": "popularity"}
    counts = np.random.default_rng(9).zipf(1.3, 80) % 5000
    art = user_model(3, fold_in=spec, loser_counts=counts)
    publish("movies", art, redis_client, top_k=TOP_K)
    met = [int(x) for x in art.item_ids[[3, 9, 40, 41]]]
    rec = topk.fold_in("movies", met, k=6)
    st = topk.versions.current_state("movies")
    cum = popularity_cum(counts, 80)
    assert np.array_equal(st.loser_cum, cum)
    drawn = item_queries.PairwiseFoldIn.drawn(st, [np.array([3, 9, 40, 41])], spec)[0]
    assert np.array_equal(drawn, implicit_pairs([3, 9, 40, 41], 80, 5, cum=cum))
    V, b = (art.item_factors.astype(np.float32).astype(np.float64),
            art.item_bias.astype(np.float32).astype(np.float64))
    u = pairwise_fold_in(V, b, drawn, reg=0.5, loss="squared_hinge")
    scores = art.item_factors.astype(np.float32) @ u.astype(np.float32) + art.item_bias
    assert same_answer(rec.items, _eligible_reference(art, None, 6, exclude=met, scores=scores),
                       rtol=1e-4)
    # uniform draws where the spec says so, or a version has no counts
    for s, c in (({**spec, "sampling": "uniform"}, counts), (spec, None)):
        publish("movies", user_model(3, fold_in=s, loser_counts=c), redis_client, top_k=TOP_K)
        st = topk.versions.current_state("movies")
        topk.fold_in("movies", met, k=6)
        assert np.array_equal(item_queries.PairwiseFoldIn.drawn(st, [np.array([3, 9, 40, 41])],
                                                                s)[0],
                              implicit_pairs([3, 9, 40, 41], 80, 5))


def test_least_squares_fold_in_and_none(redis_client, topk):
    spec = {"method": "least_squares", "reg": 2.0, "alpha": 10.0}
    art = user_model(4, fold_in=spec, served_as="challenger-als")
    publish("challenged", art, redis_client, top_k=TOP_K)
    met = [int(x) for x in art.item_ids[[1, 2, 3]]]
    rec = topk.fold_in("challenged", met, k=5, exclude=[int(art.item_ids[0])])
    assert rec.source == "challenger-als:fold_in"
    u = least_squares_fold_in(art.item_factors, [1, 2, 3], reg=2.0, alpha=10.0)
    scores = art.item_factors @ u.astype(np.float32) + art.item_bias
    expected = _eligible_reference(art, None, 5, exclude=met + [int(art.item_ids[0])],
                                   scores=scores)
    assert same_answer(rec.items, expected, rtol=1e-4)
    # a version without a fold-in (or a user with no known item) answers the fallback
    publish("plain", user_model(5), redis_client, top_k=TOP_K)
    plain = topk.fold_in("plain", met, k=4)
    assert plain.source == "fallback" and len(plain.items) == 4
    assert not set(met) & {i for i, _ in plain.items}
    assert topk.fold_in("challenged", [123_456_789], k=4).source == "fallback"


def test_limits_are_value_errors(redis_client, topk):
    publish("movies", user_model(6, fold_in={"method": "least_squares", "reg": 1.0,
                                             "alpha": 3.0}), redis_client, top_k=TOP_K)
    with pytest.raises(ValueError, match="at most 1000"):
        topk.recommend("movies", 1, k=3, exclude=list(range(1001)))
    with pytest.raises(ValueError, match="at most 500"):
        topk.fold_in("movies", list(range(501)), k=3)
    with pytest.raises(ValueError, match="expected \\[winner, loser\\]"):
        topk.fold_in("movies", [], comparisons=[[1, 2, 3]], k=3)
    with pytest.raises(ValueError, match="fold_in is"):
        user_model(7, fold_in={"method": "magic"}).validate()
    with pytest.raises(ValueError, match="lacks \\['alpha'\\]"):
        user_model(7, fold_in={"method": "least_squares", "reg": 1.0})
    with pytest.raises(ValueError, match="fold-in method 'solvers:AltSVM' is not a FoldIn"):
        user_model(7, fold_in={"method": "solvers:AltSVM"})


def test_a_blend_folds_in_each_part_on_its_columns(redis_client, topk):
    """A blend version (factors [a U₁, b U₂] against [V₁, V₂], bias a b₁, as
    trainers/als.py publishes it) folds a new user in as [a u₁, b u₂]: part 1's own pairwise
    fold-in on V₁ with bias b₁ (per_user comparisons in all), part 2's least squares on V₂."""
    rng = np.random.default_rng(11)
    n_users, n_items, r1, r2, a, b = 30, 50, 4, 3, 0.7, 0.2
    V1, V2 = rng.standard_normal((n_items, r1)), rng.standard_normal((n_items, r2))
    b1 = rng.standard_normal(n_items)
    pairwise = {"method": "pairwise", "reg": 0.5, "loss": "squared_hinge", "per_item": 5,
                "per_user": 12}
    least_squares = {"method": "least_squares", "reg": 2.0, "alpha": 10.0}
    spec = {"method": "blend", "parts": [{**pairwise, "columns": [0, r1], "scale": a},
                                         {**least_squares, "columns": [r1, r1 + r2],
                                          "scale": b}]}
    art = ModelArtifact.user_item(
        user_ids=np.arange(n_users), item_ids=np.arange(n_items) + 1000,
        user_factors=np.hstack([a * rng.standard_normal((n_users, r1)),
                                b * rng.standard_normal((n_users, r2))]),
        item_factors=np.hstack([V1, V2]), item_bias=a * b1, fold_in=spec,
        served_as="blend-als")
    publish("blended", art, redis_client, top_k=TOP_K)
    index = [2, 7, 19, 33, 41]
    met = [int(art.item_ids[i]) for i in index]
    rec = topk.fold_in("blended", met, k=8)
    assert rec.source == "blend-als:fold_in" and len(rec.items) == 8
    # a stored list of the same version says only what serves it; a similar-items answer,
    # made now, says how too
    assert topk.recommend("blended", 0, k=3).source == "blend-als"
    assert topk.similar("blended", met[0], k=3).source == "blend-als:on_demand"
    V = art.item_factors.astype(np.float64)     # float32 as published
    bias = art.item_bias.astype(np.float64)
    # ceil(12 / 5) = 3 each, the 12 of smallest hash kept (training's per_user)
    u1 = pairwise_fold_in(V[:, :r1], bias / a, implicit_pairs(index, n_items, 3, cap=12),
                          reg=0.5, loss="squared_hinge")
    u2 = least_squares_fold_in(V[:, r1:], index, reg=2.0, alpha=10.0)
    u = np.concatenate([a * u1, b * u2]).astype(np.float32)
    scores = art.item_factors @ u + art.item_bias
    expected = _eligible_reference(art, None, 8, exclude=met, scores=scores)
    assert same_answer(rec.items, expected, rtol=1e-4)
    fallback = topk.recommend("blended", None, k=8)
    assert rec.items != fallback.items[:8]
    assert topk.fold_in("blended", met, k=8).items == rec.items   # cached parts: the same
    for bad in ({"method": "blend", "parts": []},
                {"method": "blend", "parts": [{**pairwise, "columns": [1, 4], "scale": a}]},
                {"method": "blend", "parts": [{**pairwise, "columns": [0, 4]}]}):
        with pytest.raises(ValueError, match="fold_in is"):
            user_model(12, fold_in=bad)
