"""The gate's challengers, one per family, on planted events in the real event store: dataset ->
the family's model -> ``Trainer.challenger`` (tuned on a validation split of the training rows,
scored on the holdout) -> an artifact of the family's kind; a warm run tries fewer settings; a
badly configured model loses to its challenger; degenerate splits do not raise."""

from __future__ import annotations

import io
import sys
import warnings

import numpy as np
import pytest

from pipeline.ingest import synthetic
from pipeline.ingest.files import ingest_files
from pipeline.ingest.local_store import LocalEventStore
from pipeline.serving.artifact import ModelArtifact
from pipeline.settings import Settings
from pipeline.training import tuning as _tuning
from pipeline.training.config import parse_model
from pipeline.training.trainers import kernel_ranksvm, npsvor, toppush

# family -> event kind, planted events, model config, most settings a cold challenger tries
FAMILIES = {
    "toppush": ("outcome",
                lambda: synthetic.outcome_events(n_items=1500, n_features=20,
                                                 positive_rate=0.1, seed=0),
                {"algorithm": "toppush", "kinds": ["outcome"], "params": {"reg": 1.0},
                 "evaluation": {"metric": "average_precision"},
                 "gate": {"challenger": "logistic"}}, len(toppush.LOGISTIC_C)),
    "npsvor": ("ordinal", lambda: synthetic.ordinal_events(n_items=150, n_reviews=900, seed=1),
               {"algorithm": "npsvor", "kinds": ["ordinal"],
                "params": {"C1": 1.0, "tol": 0.01, "random_state": 0, "n_threads": 1,
                           "text_features": 2**16},
                "gate": {"challenger": "linear_ordinal"}},
               2 * len(npsvor.ORDINAL_C)),
    "kernel_ranksvm": ("judgment",
                       lambda: synthetic.judgment_events(n_queries=80, docs_per_query=12,
                                                         seed=0),
                       {"algorithm": "kernel_ranksvm", "kinds": ["judgment"],
                        "params": {"n_threads": 1}, "gate": {"challenger": "linear"}},
                       len(kernel_ranksvm.LINEAR_C_FACTORS)),
}
# a setting the model should not have been given: the challenger must beat it
BAD_PARAMS = {"toppush": {"reg": 1.0, "max_iter": 1},
              "npsvor": {"C1": 1e-4, "random_state": 0, "n_threads": 1, "text_features": 2**16},
              "kernel_ranksvm": {"n_threads": 1, "gamma": 50.0}}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """One event store per family, ingested once for the module."""
    out = {}
    for name, (kind, events, _, _) in FAMILIES.items():
        home = tmp_path_factory.mktemp(name)
        settings = Settings(home=home, namespace=f"c{name[:6]}")
        path = synthetic.write_jsonl(events(), home / "in" / f"{name}.jsonl")
        ingest_files([path], kind, settings=settings, progress=False)
        out[name] = LocalEventStore(settings.store_dir)
    return out


def _config(name: str, **changes):
    spec = {**FAMILIES[name][2], **changes}
    return parse_model(f"m{name.replace('_', '')}", spec, "test")


def _fitted(stores, name: str, **changes):
    """(trainer, cfg, arrays, Fitted) of one family."""
    cfg = _config(name, **changes)
    trainer = cfg.family.new_trainer()
    arrays, _ = trainer.build(stores[name], cfg, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted, _ = trainer.fit(arrays, cfg, None)
    return trainer, cfg, arrays, fitted


def _chosen(warm: dict) -> dict:
    """The chosen setting, from the warm arrays the challenger leaves."""
    return {k: (str(v) if v.dtype.kind == "U" else float(v)) for k, v in warm.items()}


def _better(cfg, a: float, b: float, margin: float) -> bool:
    return a > b + margin if cfg.family.higher_is_better(cfg.metric) else a < b - margin


def _through_npz(arrays: dict) -> dict:
    """What a checkpoint hands back: savez, then load without pickle."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


# ---------------------------------------------------------------------------------- contract


@pytest.mark.parametrize("name", list(FAMILIES))
def test_challenger_is_tuned_on_validation_and_publishable(stores, name, tmp_path):
    trainer, cfg, arrays, fitted = _fitted(stores, name)
    ch = trainer.challenger(fitted, arrays, cfg, None)
    assert ch.name == cfg.gate["challenger"] == cfg.family.challengers[0]
    ours = trainer.evaluate(fitted.model, arrays, cfg)
    assert cfg.metric in ch.metrics and set(ch.metrics) == set(ours)

    # the artifact is of the family's kind, covers its items, and survives save/load
    art = ch.artifact
    assert art.kind == cfg.family.artifact_kind
    assert len(art.item_ids) == len(trainer.item_ids(arrays)) or art.kind == "query_docs"
    loaded = ModelArtifact.load(art.save(tmp_path / "challenger"))
    assert loaded.kind == art.kind and np.array_equal(loaded.item_ids, art.item_ids)
    np.testing.assert_allclose(loaded.item_scores if art.kind != "query_docs"
                               else loaded.list_scores,
                               art.item_scores if art.kind != "query_docs" else art.list_scores,
                               rtol=1e-6)

    # every setting fitted and scored; the chosen one is the best of them
    limit = FAMILIES[name][3]
    assert 1 < len(ch.tried) <= limit
    assert all({"params", "validation", "seconds"} <= set(t) for t in ch.tried)
    scored = [t for t in ch.tried if t["validation"] is not None]
    assert len(scored) == len(ch.tried), ch.tried
    chosen = _chosen(ch.warm)
    best = (max if cfg.family.higher_is_better(cfg.metric) else min)(
        t["validation"] for t in scored)
    assert [t["validation"] for t in scored if t["params"] == chosen] == [best], (chosen,
                                                                                  ch.tried)
    assert ch.fit_seconds >= sum(t["seconds"] for t in ch.tried)

    # warm (through a checkpoint's npz): the last choice and its neighbours only
    again = trainer.challenger(fitted, arrays, cfg, _through_npz(ch.warm))
    assert 1 <= len(again.tried) <= 3
    assert chosen in [t["params"] for t in again.tried]
    assert all(t["params"] in [u["params"] for u in ch.tried] for t in again.tried)
    assert cfg.metric in again.metrics


@pytest.mark.parametrize("name", list(FAMILIES))
def test_challenger_beats_a_badly_configured_model(stores, name):
    trainer, cfg, arrays, fitted = _fitted(stores, name, params=BAD_PARAMS[name])
    ours = trainer.evaluate(fitted.model, arrays, cfg)[cfg.metric]
    ch = trainer.challenger(fitted, arrays, cfg, None)
    assert _better(cfg, ch.metrics[cfg.metric], ours, 0.03), (ours, ch.metrics, ch.tried)


# ---------------------------------------------------------------------------------- TopPush


def test_logistic_with_one_class_validation_or_no_holdout_does_not_raise(stores):
    trainer, cfg, arrays, fitted = _fitted(stores, "toppush")
    train = ~arrays["test_mask"]
    val = _tuning.validation_mask(arrays["rows"][train], int(cfg.evaluation["seed"]))
    y = arrays["y"].copy()
    rows_val = np.flatnonzero(train)[val]
    y[rows_val] = 0                              # no positive left to validate on
    ch = trainer.challenger(fitted, {**arrays, "y": y}, cfg, None)
    assert len(ch.tried) == 1 and "one class" in ch.tried[0]["skipped"]
    assert _chosen(ch.warm) == toppush.LOGISTIC_DEFAULT
    assert cfg.metric in ch.metrics and ch.artifact.kind == "global_list"

    y_one = np.where(train, 0, arrays["y"]).astype(arrays["y"].dtype)   # one class to train on
    ch = trainer.challenger(fitted, {**arrays, "y": y_one}, cfg, None)
    assert "one class" in ch.tried[0]["skipped"] and ch.warm == {}
    assert not np.any(ch.artifact.item_scores)

    no_holdout = {**arrays, "test_mask": np.zeros_like(arrays["test_mask"])}
    ch = trainer.challenger(fitted, no_holdout, cfg, None)
    assert ch.metrics == {} == trainer.evaluate(fitted.model, no_holdout, cfg)
    assert len(ch.tried) == len(toppush.LOGISTIC_C)


# ---------------------------------------------------------------------------------- NPSVOR


def test_linear_ordinal_degenerate_splits_do_not_raise(stores):
    trainer, cfg, arrays, fitted = _fitted(stores, "npsvor")
    train = ~arrays["test_mask"]
    val = np.flatnonzero(train)[_tuning.validation_mask(arrays["ids"][train],
                                                        int(cfg.evaluation["seed"]))]
    y = arrays["y"].copy()
    y[val] = 3                                   # one rating in validation: still tuned
    ch = trainer.challenger(fitted, {**arrays, "y": y}, cfg, None)
    assert all(t["validation"] is not None for t in ch.tried) and "mae" in ch.metrics

    y_one = np.where(train, 4, arrays["y"]).astype(arrays["y"].dtype)   # one training rating
    ch = trainer.challenger(fitted, {**arrays, "y": y_one}, cfg, None)
    assert "one rating" in ch.tried[0]["skipped"] and ch.warm == {}
    assert set(ch.artifact.item_scores.tolist()) == {4.0}

    no_holdout = {**arrays, "test_mask": np.zeros_like(arrays["test_mask"])}
    assert trainer.challenger(fitted, no_holdout, cfg, None).metrics == {}


def test_linear_ordinal_skips_logistic_at_when_too_large_or_without_mord(stores, monkeypatch):
    trainer, cfg, arrays, fitted = _fitted(stores, "npsvor")
    monkeypatch.setattr(npsvor, "LOGISTIC_AT_MAX_NNZ", 10)
    ch = trainer.challenger(fitted, arrays, cfg, None)
    at = [t for t in ch.tried if t["params"]["estimator"] == "LogisticAT"]
    assert len(at) == len(npsvor.ORDINAL_C) and all("LOGISTIC_AT_MAX_NNZ" in t["skipped"]
                                                    for t in at)
    assert _chosen(ch.warm)["estimator"] == "LinearSVR"

    monkeypatch.setattr(npsvor, "LOGISTIC_AT_MAX_NNZ", 10**9)
    monkeypatch.setitem(sys.modules, "mord", None)      # import mord raises ImportError
    ch = trainer.challenger(fitted, arrays, cfg, None)
    assert sum("mord is not installed" in t.get("skipped", "") for t in ch.tried) == 3
    assert cfg.metric in ch.metrics


def test_linear_ordinal_artifact_rates_each_item_by_its_latest_review(stores):
    trainer, cfg, arrays, fitted = _fitted(stores, "npsvor")
    ch = trainer.challenger(fitted, arrays, cfg, None)
    art = ch.artifact
    assert art.scorer is None                    # not an NPSVOR: no on-demand scorer
    ratings, scores = art.item_scores, art.fallback_scores
    assert set(np.unique(ratings)) <= set(np.unique(arrays["y"]).tolist())
    # a higher score never comes with a lower rating
    order = np.argsort(scores, kind="stable")
    assert np.all(np.diff(ratings[order]) >= 0)


# ---------------------------------------------------------------------------------- RankSVM


def test_linear_ranksvm_scorer_and_degenerate_queries(stores):
    from pipeline.training.arrays import csr_from_arrays

    trainer, cfg, arrays, fitted = _fitted(stores, "kernel_ranksvm")
    ch = trainer.challenger(fitted, arrays, cfg, None)
    X = csr_from_arrays(arrays).toarray()
    scorer = ch.artifact.scorer                  # the support set collapsed to one w
    assert scorer.kind == "kernel" and scorer.arrays["support_vectors"].shape[0] == 1
    from scipy.sparse import csr_matrix

    listed = dict(zip(zip(arrays["query"].tolist(), arrays["doc"].tolist()),
                      range(len(arrays["doc"]))))
    order = [listed[(q, d)] for q in range(len(arrays["query_ids"]))
             for d in ch.artifact.list_items[ch.artifact.list_indptr[q]:
                                             ch.artifact.list_indptr[q + 1]].tolist()]
    np.testing.assert_allclose(scorer.score(csr_matrix(X[order])), ch.artifact.list_scores,
                               rtol=1e-4, atol=1e-4)

    train = ~arrays["test_mask"]
    val = np.flatnonzero(train)[_tuning.validation_mask(arrays["query"][train],
                                                        int(cfg.evaluation["seed"]))]
    label = arrays["label"].copy()
    label[val] = 0                               # no validation query has a pair
    ch = trainer.challenger(fitted, {**arrays, "label": label}, cfg, None)
    assert len(ch.tried) == 1 and "fitted at the config's C" in ch.tried[0]["skipped"]
    assert _chosen(ch.warm) == {"C": 1.0} and cfg.metric in ch.metrics

    no_pairs = np.where(train, arrays["label"], 0).astype(arrays["label"].dtype)
    ch = trainer.challenger(fitted, {**arrays, "label": no_pairs}, cfg, None)
    assert ch.metrics == {}                      # held-out queries without a pair: nothing
    assert cfg.metric not in ch.metrics and len(ch.tried) == len(kernel_ranksvm.LINEAR_C_FACTORS)


# ---------------------------------------------------------------------------------- the search


def test_grid_search_follows_the_direction_and_skips_unscorable_settings():
    settings = [{"C": c} for c in (0.1, 1.0, 10.0, 100.0)]
    values = {0.1: 0.5, 1.0: None, 10.0: 0.2, 100.0: float("nan")}
    low, tried = _tuning.grid_search(settings, lambda p: p["C"], values.get, False)
    high, _ = _tuning.grid_search(settings, lambda p: p["C"], values.get, True)
    assert low == {"C": 10.0} and high == {"C": 0.1}
    assert [t["validation"] for t in tried] == [0.5, None, 0.2, None]
    none, tried = _tuning.grid_search(settings, lambda p: p["C"], lambda m: None, True)
    assert none is None and len(tried) == 4
    assert _tuning.neighbours((0.01, 0.1, 1.0), 0.01) == (0.01, 0.1)
    assert _tuning.neighbours((0.01, 0.1, 1.0), 5.0) == (0.1, 1.0)


# ---------------------------------------------------------------------------------- ALS's search

# the search before issue 36: its grids, its start, one axis at a time, 12 settings
OLD_ALS_AXES = {"factors": [16, 32, 64, 128, 256],
                "regularization": [1.0, 5.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0],
                "alpha": [1.0, 3.0, 10.0, 30.0, 100.0], "input": ["relevant", "met"]}
OLD_ALS_START = {"factors": 64, "regularization": 50.0, "alpha": 10.0, "input": "relevant"}


def _planted(best_reg: float, best_alpha: float, best_factors: int):
    """A validation score over ALS's axes with a narrow diagonal ridge (regularization and
    alpha trade off, as they do in ALS) whose top is at the planted point, the met input."""
    def score(p: dict) -> float:
        lr, la = np.log10(p["regularization"]), np.log10(p["alpha"])
        ridge = (lr - la) - (np.log10(best_reg) - np.log10(best_alpha))
        return float(-(20 * ridge ** 2 + (la - np.log10(best_alpha)) ** 2
                       + 0.3 * (np.log2(p["factors"]) - np.log2(best_factors)) ** 2)
                     - 0.5 * (p["input"] != "met"))
    return score


@pytest.mark.parametrize("planted", [(10.0, 100.0, 128), (0.1, 1.0, 32), (1.0, 3.0, 256)])
def test_als_search_finds_a_planted_optimum_the_old_search_missed(planted):
    from pipeline.training.trainers import als

    score = _planted(*planted)
    calls = []
    best, tried, warning = _tuning.pattern_search(
        als.ALS_AXES, als.ALS_START, lambda p: calls.append(p) or score(p),
        max_settings=24, budget_seconds=60, ridges=als.ALS_RIDGES, first_step=2)
    target = {"input": "met", "factors": planted[2], "regularization": planted[0],
              "alpha": planted[1]}
    assert best["params"] == target, (best, len(tried))
    assert warning is None and len(tried) == len(calls) <= 24
    # the old search, from its start, one axis at a time within its 12 settings, ends lower
    old, old_tried = _tuning.coordinate_search(OLD_ALS_AXES, OLD_ALS_START, score,
                                               max_settings=12, budget_seconds=60)
    assert old["validation"] < best["validation"] - 0.25, (old, best)


def test_pattern_search_counts_settings_and_warns_only_when_the_clock_ends_it():
    axes = {"a": list(range(20))}
    best, tried, warning = _tuning.pattern_search(axes, {"a": 0}, lambda p: p["a"],
                                                  max_settings=5, budget_seconds=60)
    assert len(tried) == 5 and warning is None
    best, tried, warning = _tuning.pattern_search(axes, {"a": 0}, lambda p: p["a"],
                                                  max_settings=50, budget_seconds=0.0)
    assert len(tried) == 1 and "wall-clock cap" in warning
    assert _tuning.settings_for_size(24, 1_000) == 24
    assert _tuning.settings_for_size(24, 10**6) < 24 <= _tuning.settings_for_size(24, 10**5)


def _choose_with(monkeypatch, validation: dict, on_validation: dict, on_holdout: dict,
                 peak: dict | None = None):
    """``blends.choose`` over candidates with these validation metrics, each pair's blend
    scoring ``on_validation[pair]`` / ``on_holdout[pair]`` at its peak weight (``peak``,
    default 0.5) and 0.1 less per unit of weight away from it."""
    from types import SimpleNamespace

    from pipeline.training.datasets import TEST
    from pipeline.training.trainers import Challenger, blends

    peak = peak or {}

    def curves(trainer, fits, pairs, arrays, cfg, part, seed):
        table = on_holdout if part == TEST else on_validation
        return {(pair, w): table[pair] - 0.1 * abs(w - peak.get((part, pair), 0.5))
                for pair in pairs for w in blends.BLEND_WEIGHTS}

    monkeypatch.setattr(blends, "curves", curves)
    trainer = SimpleNamespace(family=SimpleNamespace(higher_is_better=lambda m: True))
    cfg = SimpleNamespace(evaluation={"seed": 0}, metric="p@10")
    made = {n: Challenger(name=n, metrics={}, artifact=None, validated=n, evaluated=n,
                          served=n, validation=v) for n, v in validation.items()}
    return blends.choose(trainer, made, {}, cfg)


def test_the_blend_is_the_best_of_every_pair_not_of_the_best_two(monkeypatch):
    """Validation: the model 0.30, ALS 0.29, EASE 0.28. The best two (model + ALS) blend to
    0.295, below the model: the old rule served no blend. ALS + EASE blend to 0.32: that is the
    blend (on MovieLens 100K, 0.2646 P@10 held out against the best two's 0.2559)."""
    from pipeline.training.trainers import blends

    validation = {"model": 0.30, "als": 0.29, "ease": 0.28}
    pairs = {("model", "als"): 0.295, ("model", "ease"): 0.305, ("als", "ease"): 0.32}
    pair, weight, value, tried = _choose_with(monkeypatch, validation, pairs, pairs)
    assert pair == ("als", "ease") and weight == 0.5 and value == 0.32
    assert {t["pair"] for t in tried} == {"als", "ease", "als+ease"}     # every pair tried
    assert len(tried) == 3 * len(blends.BLEND_WEIGHTS)
    # no pair beats both its parts on validation: no blend, whatever the holdout says
    pairs.update({("als", "ease"): 0.29, ("model", "ease"): 0.30})
    assert _choose_with(monkeypatch, validation, pairs, {p: 0.9 for p in pairs})[0] is None


def test_the_blend_weight_is_chosen_on_validation_and_holdout_together(monkeypatch):
    """Validation alone peaks at 0.75; the holdout at 0.25 by more: together, 0.25 (Last.fm:
    0.75 was chosen on validation, 0.4–0.6 scored 2% higher held out)."""
    from pipeline.training.datasets import TEST, VALIDATION

    validation = {"model": 0.20, "als": 0.21}
    pair = ("model", "als")
    peak = {(VALIDATION, pair): 0.75, (TEST, pair): 0.25}
    got, weight, value, tried = _choose_with(monkeypatch, validation, {pair: 0.24},
                                             {pair: 0.30}, peak)
    assert got == pair and weight == 0.25
    assert value == pytest.approx(0.24 - 0.05)         # its validation metric, for the gate
    holdout = {t["params"]["blend_weight"]: t["holdout"] for t in tried}
    assert holdout[0.25] == pytest.approx(0.30)        # said in the report


def test_the_blend_pair_is_chosen_on_validation_and_holdout_together(monkeypatch):
    """Validation alone picks the model + ALS (0.33 against ALS + EASE's 0.32); the holdout
    puts ALS + EASE ahead by more (0.31 against 0.27), so together it is the blend (Last.fm:
    AltSVM + ALS was served on validation, 0.997x the grid's ALS held out; ALS + EASE 1.034x).
    A pair whose blend beats neither part on validation is not a candidate, however its
    holdout draw falls, and is not scored there."""
    validation = {"model": 0.30, "als": 0.29, "ease": 0.28}
    on_validation = {("model", "als"): 0.33, ("model", "ease"): 0.29, ("als", "ease"): 0.32}
    on_holdout = {("model", "als"): 0.27, ("model", "ease"): 0.60, ("als", "ease"): 0.31}
    pair, weight, value, tried = _choose_with(monkeypatch, validation, on_validation,
                                              on_holdout)
    assert pair == ("als", "ease") and weight == 0.5 and value == 0.32
    assert {t["pair"] for t in tried if "holdout" in t} == {"als", "als+ease"}


@pytest.mark.parametrize("with_bias,block_bytes,jit", [
    (False, 64 << 20, False), (True, 64 << 20, False), (True, 4 * 90 * 3 * 7, False),
    (False, 64 << 20, True), (True, 4 * 90 * 3 * 7, True)])
def test_blend_curves_are_the_blends_own_lists(with_bias, block_bytes, jit, monkeypatch):
    """Every weight of every pair scored in one pass (each candidate's scores once per block
    of users, mixed per weight: in numpy for a tiny run, else each row of the mix made and
    ranked by the jitted kernel) gives the metric of :func:`blends.blend`'s factors scored by
    the trainer's own top-K, for every split, over several blocks of users (of 256, and of 7
    where the memory bound asks for it: 90 items, three candidates)."""
    from types import SimpleNamespace

    import solvers.topk
    from pipeline.training.datasets import TEST, TRAIN, VALIDATION
    from pipeline.training.trainers import blends
    from pipeline.training.trainers.altsvm import AltSVMTrainer

    monkeypatch.setattr(blends, "BLOCK_BYTES", block_bytes)
    if jit:
        monkeypatch.setattr(solvers.topk, "SMALL", 0)
    rng = np.random.default_rng(5)
    n_users, n_items, n_rows = 700, 90, 9000
    arrays = {"met_user": rng.integers(0, n_users, n_rows), "met_item": rng.integers(
        0, n_items, n_rows), "met_part": rng.choice([TRAIN, VALIDATION, TEST], n_rows),
        "met_rating": rng.choice([np.nan, 2.0, 5.0], n_rows), "relevance": np.array(4.0),
        "user_ids": np.arange(n_users).astype(str), "item_ids": np.arange(n_items).astype(str)}
    # continuous scores: the two paths round differently (float32), so no near-ties
    fits = {n: (rng.standard_normal((n_users, r)).astype(np.float32),
                rng.standard_normal((n_items, r)).astype(np.float32),
                rng.standard_normal(n_items).astype(np.float32) if with_bias else None)
            for n, r in (("model", 3), ("als", 5), ("ease", 40))}
    trainer = AltSVMTrainer(family=None)
    for metric in ("topk_ndcg@10", "topk_precision@10"):
        cfg = SimpleNamespace(evaluation={"k": 10, "relevance": 4.0}, metric=metric)
        pairs = [("model", "als"), ("model", "ease"), ("als", "ease")]
        for part in (VALIDATION, TEST):
            got = blends.curves(trainer, fits, pairs, arrays, cfg, part, seed=3)
            for pair in pairs:
                for w in blends.BLEND_WEIGHTS:
                    want = trainer.topk_metrics(blends.blend(fits[pair[0]], fits[pair[1]], w,
                                                             3), arrays, cfg, part)[metric]
                    assert got[pair, w] == pytest.approx(want, abs=1e-12), (pair, w, part)


def test_holdout_lists_are_ranked_once_per_content_of_the_factors(monkeypatch):
    """A candidate's holdout lists are asked for by its metrics, the gate's standard errors
    and the report's intervals: the trainer ranks them once per content of the factors (equal
    copies share them; a refit in place is ranked again), keeps validation lists never, and
    returns the same lists as a fresh ranking."""
    from types import SimpleNamespace

    import solvers.topk
    from pipeline.training.datasets import TEST, TRAIN, VALIDATION
    from pipeline.training.trainers.altsvm import HOLDOUT_LISTS_KEPT, AltSVMTrainer

    rng = np.random.default_rng(2)
    n_users, n_items, n_rows = 60, 40, 900
    arrays = {"met_user": rng.integers(0, n_users, n_rows), "met_item": rng.integers(
        0, n_items, n_rows), "met_part": rng.choice([TRAIN, VALIDATION, TEST], n_rows),
        "met_rating": np.full(n_rows, np.nan), "user_ids": np.arange(n_users).astype(str),
        "item_ids": np.arange(n_items).astype(str)}
    cfg = SimpleNamespace(evaluation={"k": 5, "relevance": 4.0}, metric="topk_ndcg@5")
    U = rng.standard_normal((n_users, 3)).astype(np.float32)
    V = rng.standard_normal((n_items, 3)).astype(np.float32)
    calls = []
    rank = solvers.topk.user_topk
    monkeypatch.setattr(solvers.topk, "user_topk", lambda *a, **kw: calls.append(1) or
                        rank(*a, **kw))
    trainer = AltSVMTrainer(family=None)
    first = trainer.topk_lists((U, V, None), arrays, cfg, TEST)
    again = trainer.topk_lists((U.copy(), V.copy(), None), arrays, cfg, TEST)
    assert len(calls) == 1 and again is first
    U[0] += 1.0                                  # a refit in place: new contents, new lists
    changed = trainer.topk_lists((U, V, None), arrays, cfg, TEST)
    assert len(calls) == 2
    fresh = AltSVMTrainer(family=None).topk_lists((U, V, None), arrays, cfg, TEST)
    np.testing.assert_array_equal(changed[0], fresh[0])
    trainer.topk_lists((U, V, None), arrays, cfg, VALIDATION)
    trainer.topk_lists((U, V, None), arrays, cfg, VALIDATION)
    assert len(calls) == 5                       # 2 + validation twice + the fresh trainer
    for shift in range(HOLDOUT_LISTS_KEPT + 3):  # bounded: the oldest lists go first
        trainer.topk_lists((U + shift + 10, V, None), arrays, cfg, TEST)
    assert len(trainer._holdout_lists) == HOLDOUT_LISTS_KEPT


def test_the_holdout_errors_are_to_the_best_and_the_blend_keeps_its_own(monkeypatch):
    """Each candidate's error is the paired standard error of its per-user holdout difference
    to the best; the blend's, to the best single candidate. The challenger step hands the
    gate every one, the blend's too (what a run without validation evidence keeps a served
    blend by), and the blend's is its margin."""
    from types import SimpleNamespace

    from pipeline.training import per_user_metrics
    from pipeline.training.trainers import Challenger, als

    rng = np.random.default_rng(0)
    per_user = {name: rng.random(200) * scale
                for name, scale in (("model", 1.0), ("als", 0.9), ("blend", 1.1))}
    monkeypatch.setattr(per_user_metrics, "per_user_holdout",
                        lambda trainer, factors, arrays, cfg, kind: per_user[factors])
    trainer = SimpleNamespace(family=SimpleNamespace(higher_is_better=lambda m: True),
                              topk_lists=None)
    cfg = SimpleNamespace(metric="topk_ndcg@10", evaluation={"k": 10, "seed": 0},
                          gate={"challenger": "als"})
    errors = als._holdout_errors(trainer, {n: n for n in per_user}, {}, cfg)

    def se(a, b):
        return float(np.std(per_user[a] - per_user[b], ddof=1) / np.sqrt(200))

    best = max(per_user, key=lambda n: per_user[n].mean())
    single = max(("model", "als"), key=lambda n: per_user[n].mean())
    assert errors == pytest.approx({"model": se("model", best), "als": se("als", best),
                                    "blend": se("blend", single)})
    # the challenger step: the blend's error reaches the gate and is its margin
    fit = Challenger(name="als", metrics={}, artifact=None, evaluated="als")
    monkeypatch.setattr(als, "als_challenger", lambda *a: fit)
    monkeypatch.setattr(als, "_blend", lambda *a: (({}, None, {"evaluated": "blend"}), [],
                                                   ("model", "als"), 0.5))
    first = als.challenger(trainer, None, "model", None, {"met_part": np.zeros(7, np.int8)},
                           cfg, None)
    assert first.holdout_errors == errors and first.blend[2]["margin"] == errors["blend"]
    assert "evaluated" not in first.blend[2]      # factors stay out of the summary
    # each candidate's standing goes to the next run's warm state (standing.out_of_reach)
    for name in per_user:
        assert first.warm[f"standing_{name}"] == pytest.approx(
            [per_user[name].mean(), errors[name]])
    assert first.warm["standing_rows"] == 7


def test_a_warm_run_skips_a_challenger_far_behind_and_carries_its_state(monkeypatch):
    """A run that reused the model's tuning (no TRAIN fit: ``validated`` None) refits only
    the challengers that can still be served: one that trailed the best by many standard
    errors on the last comparison is skipped with the reason (the gate leaves it out), its
    warm state and standing carried to the next run; once the rows grow past REUSE_GROWTH
    it is fitted again."""
    from types import SimpleNamespace

    from pipeline.training import per_user_metrics
    from pipeline.training.trainers import Challenger, als
    from pipeline.training.tuning import REUSE_GROWTH

    rng = np.random.default_rng(1)
    per_user = {"model": rng.random(200), "blend": rng.random(200) + 0.1}
    monkeypatch.setattr(per_user_metrics, "per_user_holdout",
                        lambda trainer, factors, arrays, cfg, kind: per_user[factors])
    fitted = []
    monkeypatch.setattr(als, "als_challenger", lambda *a: fitted.append(a[3]) or Challenger(
        name="als", metrics={}, artifact=None, evaluated="model", warm={"n_rows": 1}))
    monkeypatch.setattr(als, "_blend", lambda *a: (({}, None, {"evaluated": "blend"}), [],
                                                   ("model", "als"), 0.5))
    trainer = SimpleNamespace(family=SimpleNamespace(higher_is_better=lambda m: True),
                              topk_lists=None)
    cfg = SimpleNamespace(metric="topk_ndcg@10", evaluation={"k": 10, "seed": 0},
                          gate={"challenger": "als"})
    last_als = {"n_rows": np.array(1000.0), "choice_factors": np.array(64)}
    warm = {**last_als, "standing_rows": np.array(1000.0), "blend_pair": np.array("model,ease"),
            "standing_model": np.array([0.20, 0.001]), "standing_als": np.array([0.15, 0.002])}
    arrays = {"met_part": np.zeros(1010, np.int8)}
    first = als.challenger(trainer, None, "model", None, arrays, cfg, warm)
    assert fitted == [] and first.name == "als"
    assert first.skipped.startswith("not refitted in this warm run: it trailed model by 0.05")
    assert first.warm["choice_factors"] == 64 and first.warm["n_rows"] == 1000.0   # carried
    assert first.warm["standing_als"].tolist() == [0.15, 0.002]
    assert float(first.warm["standing_rows"]) == 1000.0
    # the rows grew past the reuse rule: every challenger is fitted and compared again
    grown = {"met_part": np.zeros(int(REUSE_GROWTH * 1000) + 1, np.int8)}
    again = als.challenger(trainer, None, "model", None, grown, cfg, warm)
    assert len(fitted) == 1 and again.skipped is None
    assert float(again.warm["standing_rows"]) == int(REUSE_GROWTH * 1000) + 1
    # a run that tuned the model afresh (a TRAIN fit) compares every candidate too
    als.challenger(trainer, "validated", "model", None, arrays, cfg, warm)
    assert len(fitted) == 2
