"""The README's "Adding a model family", followed step by step by a toy family that lives only
in this file: an estimator, a trainer with its dataset builder, one registry entry. Nothing
else is touched, and the family is trained, gated, published to a real redis-server and looked
up end to end like the shipped four.

The toy family, ``item_rate``: an item's smoothed click rate from outcome events,
``(clicks + prior · base rate) / (impressions + prior)``, published as one global list
(an existing serving shape, so no artifact kind is added).

A second toy family, ``taste``, publishes per-user lists (``user_item``) and is also answered at
request time: candidates given in a request are scored by its own estimator rebuilt from the
published version (``scorer_kind``, ``from_scorer``), and a user it has not met is folded in by
its own method. Both are named by ``module:Class`` in what the trainer publishes, so serving
imports them; nothing outside this file is registered or touched.
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.ingest.files import ingest_files
from pipeline.ingest.synthetic import rating_events, write_jsonl
from pipeline.serving.item_queries import FoldIn
from pipeline.serving.lookup import TopK
from pipeline.serving.scorers import ScorerKind
from pipeline.settings import Settings
from pipeline.training import retrain
from pipeline.training.config import parse_model
from pipeline.training.datasets import event_ids, id_indices, stable_split, window_tables
from pipeline.training.idmap import IdMap
from pipeline.training.registry import FAMILIES, Family, register
from pipeline.training.trainers import Trainer, idmap
from solvers import _params as P
from solvers._base import Estimator


# 1-2. The estimator, on the shared base: parameters, their constraints, fit, its state.
class ItemRate(Estimator):
    algorithm = "ItemRate"
    fitted_attribute = "scores_"
    warm_keys = ("scores",)
    _parameter_constraints = {"prior": P.Positive()}

    def __init__(self, *, prior=1.0):
        self.prior = prior

    def fit(self, items, labels, n_items: int, warm_start=None):
        self._check_params()
        clicks = np.bincount(items, weights=labels, minlength=n_items)
        shown = np.bincount(items, minlength=n_items)
        base = labels.mean() if len(labels) else 0.0
        self.scores_ = (clicks + self.prior * base) / (shown + self.prior)
        self.n_iter_ = 1
        return self

    def _warm_arrays(self) -> dict:
        return {"scores": self.scores_}

    def _state_arrays(self) -> dict:
        return {"scores": self.scores_}

    def _from_state(self, arrays: dict) -> None:
        self.scores_ = arrays["scores"]


# 3. The trainer, with its dataset builder.
def item_outcomes(store, window, items: IdMap, fraction: float, seed: int) -> dict:
    """One row per outcome event: its item's index, its label, and whether it is held out."""
    columns = {"outcome": ["ts", "offset", "event_id", "item", "label"]}
    tables, win = window_tables(store, ["outcome"], window, columns, key="item")
    t = tables["outcome"]
    items, item = id_indices(items, t.column("item"))
    test = stable_split(event_ids(t.column("event_id")), fraction, seed)
    return {"item_ids": items.ids, "item": item, "label": t.column("label").to_numpy(),
            "test": test, "window": win}


def _average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    order = np.argsort(-scores, kind="stable")
    hits = np.cumsum(labels[order])
    return float((hits / np.arange(1, len(order) + 1))[labels[order] == 1].mean())


class ItemRateTrainer(Trainer):
    id_maps = ("item_ids",)

    def build(self, store, cfg, previous):
        ev = cfg.evaluation
        data = item_outcomes(store, cfg.window, idmap(previous, "item_ids"),
                             float(ev["fraction"]), int(ev["seed"]))
        window = data.pop("window")
        return data, {"window": window.describe(), "stats": {"events": len(data["item"])},
                      "n_train": int((~data["test"]).sum())}

    def fit_model(self, model, arrays, warm, cfg):
        train = ~arrays["test"]
        model.fit(arrays["item"][train], arrays["label"][train], len(arrays["item_ids"]))

    def evaluate(self, model, arrays, cfg):
        test = arrays["test"]
        return {"average_precision": _average_precision(model.scores_[arrays["item"][test]],
                                                        arrays["label"][test])}

    def baselines(self, arrays, cfg):
        flat = np.zeros(len(arrays["item_ids"]))
        test = arrays["test"]
        return {"constant": ({"average_precision": _average_precision(
            flat[arrays["item"][test]], arrays["label"][test])}, flat)}

    def artifact(self, model, arrays, cfg, **describe):
        from pipeline.serving.artifact import ModelArtifact

        return ModelArtifact.global_list(item_ids=arrays["item_ids"], scores=model.scores_,
                                         algorithm=cfg.algorithm, **describe)


# 4. One registry entry (a plugin registers it; here, the test, for its own duration).
HERE = "tests.training.test_new_family"
ENTRY = Family(name="item_rate", estimator=f"{HERE}:ItemRate", trainer=f"{HERE}:ItemRateTrainer",
               kinds=("outcome",), metrics={"average_precision": +1},
               evaluation={"split": "random", "fraction": 0.3, "metric": "average_precision",
                           "seed": 0},
               splits=("random",), artifact_kind="global_list")


@pytest.fixture
def item_rate():
    register(ENTRY)
    try:
        yield ENTRY
    finally:
        FAMILIES.pop(ENTRY.name)


def _impressions(n_items=60, per_item=40, seed=0) -> tuple[list[dict], np.ndarray]:
    rng = np.random.default_rng(seed)
    rate = rng.beta(1, 6, n_items)                     # planted click rates
    return [{"event_id": f"o{i}-{j}", "ts": 1_700_000_000_000 + i * per_item + j,
             "item": f"item{i}", "label": int(rng.random() < rate[i]), "features": [1.0]}
            for i in range(n_items) for j in range(per_item)], rate


def test_a_new_family_is_an_estimator_a_trainer_and_a_registry_entry(item_rate, tmp_path,
                                                                       redis_url):
    cfg = parse_model("popular", {"algorithm": "item_rate", "params": {"prior": 5.0}},
                      "test")                   # validated against the entry and constraints
    with pytest.raises(ValueError, match="prior is -1"):
        parse_model("bad", {"algorithm": "item_rate", "params": {"prior": -1}}, "test")
    events, rate = _impressions()
    settings = Settings(home=tmp_path / "home", namespace=f"t{tmp_path.name[-12:]}")
    ingest_files([write_jsonl(events, tmp_path / "outcomes.jsonl")], "outcome",
                 settings=settings, progress=False)
    run = retrain.run("popular", {"popular": cfg}, settings=settings, redis_url=redis_url)
    assert run["decision"] == retrain.Decision.PUBLISHED, run.get("reason")
    trained = run["train"]
    assert (trained["metrics"]["average_precision"]
            > trained["baselines"]["constant"]["average_precision"])
    with TopK(redis_url, namespace=settings.namespace) as topk:
        top = topk.recommend("popular", None, k=5)
    assert top.source == "global" and top.version == 1 and len(top.items) == 5
    planted_best = {f"item{i}" for i in np.argsort(-rate)[:15]}
    assert len({item for item, _ in top.items} & planted_best) >= 3


# ---------------------------------------------------------------------- a request-time family
HOME = "tests.training.test_new_family"


class TasteScorer(ScorerKind):
    """Its scorer kind: the base's defaults, the estimator packs (``scorer_state``) and scores
    (``decision_function``) itself."""


class CentroidFoldIn(FoldIn):
    """Its fold-in: a new user's factor is the mean factor of the items they met."""

    def user_factor(self, st, V, b, met, pairs, spec):
        return V[np.union1d(met, pairs[:, 0])].astype(np.float64).mean(axis=0)


class Taste(Estimator):
    """Item bias plus a rank-``rank`` SVD of the residual ratings; a request's candidate
    (a taste vector) scores by the mean user's taste."""

    algorithm = "Taste"
    fitted_attribute = "item_factors_"
    warm_keys = ("item_factors",)
    _parameter_constraints = {"rank": P.Int(minimum=1)}
    scorer_kind = f"{HOME}:TasteScorer"

    def __init__(self, *, rank=2):
        self.rank = rank

    def fit(self, users, items, ratings, n_users: int, n_items: int, warm_start=None):
        self._check_params()
        centred = ratings - ratings.mean()
        self.item_bias_ = np.bincount(items, centred, n_items) / (np.bincount(items, None,
                                                                            n_items) + 5.0)
        R = np.zeros((n_users, n_items))
        R[users, items] = centred - self.item_bias_[items]
        left, s, right = np.linalg.svd(R, full_matrices=False)
        self.user_factors_ = left[:, :self.rank] * np.sqrt(s[:self.rank])
        self.item_factors_ = right[:self.rank].T * np.sqrt(s[:self.rank])
        self.n_iter_ = 1
        return self

    def scorer_state(self) -> tuple[dict, dict]:
        return {"n_features": self.rank}, {"w": self.user_factors_.mean(axis=0)}

    @classmethod
    def from_scorer(cls, params, arrays):
        model = cls(rank=params["n_features"])
        model.w_ = arrays["w"]
        return model

    def decision_function(self, X):
        return X @ self.w_

    def _warm_arrays(self) -> dict:
        return {"item_factors": self.item_factors_}

    def _state_arrays(self) -> dict:
        return {"item_factors": self.item_factors_}

    def _from_state(self, arrays: dict) -> None:
        self.item_factors_ = arrays["item_factors"]


def _pairwise_accuracy(users, ratings, predicted) -> float:
    """Of each held-out user's pairs of different ratings, the share the prediction orders
    right (a tie counts half)."""
    right = total = 0.0
    for u in np.unique(users):
        r, p = ratings[users == u], predicted[users == u]
        differ = np.sign(r[:, None] - r[None, :])
        agree = np.sign(p[:, None] - p[None, :]) * differ
        right += ((agree > 0) + 0.5 * (agree == 0))[differ > 0].sum()
        total += (differ > 0).sum()
    return float(right / max(total, 1))


class TasteTrainer(Trainer):
    id_maps = ("user_ids", "item_ids")

    def build(self, store, cfg, previous):
        columns = {"rating": ["ts", "offset", "event_id", "user", "item", "rating"]}
        tables, win = window_tables(store, ["rating"], cfg.window, columns, key="user")
        t = tables["rating"]
        users, user = id_indices(idmap(previous, "user_ids"), t.column("user"))
        items, item = id_indices(idmap(previous, "item_ids"), t.column("item"))
        test = stable_split(event_ids(t.column("event_id")),
                            float(cfg.evaluation["fraction"]), int(cfg.evaluation["seed"]))
        return ({"user_ids": users.ids, "item_ids": items.ids, "user": user, "item": item,
                 "rating": t.column("rating").to_numpy(), "test": test},
                {"window": win.describe(), "stats": {"ratings": len(user)},
                 "n_train": int((~test).sum())})

    def fit_model(self, model, arrays, warm, cfg):
        train = ~arrays["test"]
        model.fit(arrays["user"][train], arrays["item"][train], arrays["rating"][train],
                  len(arrays["user_ids"]), len(arrays["item_ids"]))

    def _held_out(self, arrays, predicted):
        test = arrays["test"]
        return {"pairwise_accuracy": _pairwise_accuracy(arrays["user"][test],
                                                        arrays["rating"][test],
                                                        predicted[test])}

    def evaluate(self, model, arrays, cfg):
        u, i = arrays["user"], arrays["item"]
        return self._held_out(arrays, np.einsum("ij,ij->i", model.user_factors_[u],
                                                model.item_factors_[i])
                              + model.item_bias_[i])

    def baselines(self, arrays, cfg):
        flat = np.zeros(len(arrays["item_ids"]))
        return {"constant": (self._held_out(arrays, flat[arrays["item"]]), flat)}

    def artifact(self, model, arrays, cfg, **describe):
        from pipeline.serving.artifact import ModelArtifact
        from pipeline.serving.scorers import Scorer

        return ModelArtifact.user_item(
            user_ids=arrays["user_ids"], item_ids=arrays["item_ids"],
            user_factors=model.user_factors_, item_factors=model.item_factors_,
            item_bias=model.item_bias_, scorer=Scorer.of(model),
            fold_in={"method": f"{HOME}:CentroidFoldIn"}, algorithm=cfg.algorithm, **describe)


TASTE = Family(name="taste", estimator=f"{HOME}:Taste", trainer=f"{HOME}:TasteTrainer",
               kinds=("rating",), metrics={"pairwise_accuracy": +1},
               evaluation={"split": "random", "fraction": 0.3, "metric": "pairwise_accuracy",
                           "seed": 0},
               splits=("random",), artifact_kind="user_item")


@pytest.fixture
def taste():
    register(TASTE)
    try:
        yield TASTE
    finally:
        FAMILIES.pop(TASTE.name)


def test_a_plugin_family_is_scored_at_request_time_and_folds_in_a_new_user(taste, tmp_path,
                                                                          redis_url):
    cfg = parse_model("tastes", {"algorithm": "taste", "params": {"rank": 3}}, "test")
    settings = Settings(home=tmp_path / "home", namespace=f"t{tmp_path.name[-12:]}")
    events = rating_events(n_users=80, n_items=40, per_user=15, seed=3)
    ingest_files([write_jsonl(events, tmp_path / "ratings.jsonl")], "rating",
                 settings=settings, progress=False)
    run = retrain.run("tastes", {"tastes": cfg}, settings=settings, redis_url=redis_url)
    assert run["decision"] == retrain.Decision.PUBLISHED, run.get("reason")
    from pipeline.serving.artifact import ModelArtifact

    art = ModelArtifact.load(f"{run['publish']['checkpoint']}/artifact")
    assert art.scorer.params["estimator"] == f"{HOME}:Taste"
    V, b, ids = art.item_factors, art.item_bias, art.item_ids.tolist()
    w = art.user_factors.mean(axis=0)
    candidates = [(f"c{n}", x) for n, x in enumerate(np.eye(3).tolist() + [[1.0, -1.0, 0.5]])]
    met = ids[:4]
    with TopK(redis_url, namespace=settings.namespace) as topk:
        ranked = topk.rank("tastes", candidates, k=4)
        folded = topk.fold_in("tastes", met, k=5)
    # scored by the plugin's own estimator, rebuilt from the published scorer
    expected = np.array([x for _, x in candidates]) @ w
    assert ranked.source == "scored" and ranked.version == 1
    np.testing.assert_allclose([s for _, s in ranked.items], np.sort(expected)[::-1],
                               rtol=1e-5, atol=1e-6)
    # folded in by the plugin's own method: the mean factor of the met items
    scores = V @ V[:4].mean(axis=0).astype(np.float32) + b
    scores[:4] = -np.inf
    order = np.argsort(-scores, kind="stable")[:5]
    assert folded.source == "fold_in"
    assert [i for i, _ in folded.items] == [ids[j] for j in order]
