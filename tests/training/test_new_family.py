"""The README's "Adding a model family", followed step by step by a toy family that lives only
in this file: an estimator, a trainer with its dataset builder, one registry entry. Nothing
else is touched, and the family is trained, gated, published to a real redis-server and looked
up end to end like the shipped four.

The toy family, ``item_rate``: an item's smoothed click rate from outcome events,
``(clicks + prior · base rate) / (impressions + prior)``, published as one global list
(an existing serving shape, so no artifact kind is added).
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.ingest.files import ingest_files
from pipeline.ingest.synthetic import write_jsonl
from pipeline.serving.lookup import TopK
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
