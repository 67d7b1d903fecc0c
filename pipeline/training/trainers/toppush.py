"""TopPush's trainer: outcome events -> sparse (X, y) -> TopPush -> one ranked item list.

Dataset (:func:`outcomes`): one row per item, its latest outcome, with a stable random split
by the item index.

Challenger ``"logistic"`` (:class:`TunedLogistic`): scikit-learn's LogisticRegression, what a
user would otherwise rank by, C tuned over ``LOGISTIC_C`` on a validation part of the training
rows by the gate metric, refitted on all of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest.store import EventStore
from pipeline.training.arrays import csr_from_arrays, csr_to_arrays, features_csr
from pipeline.training.datasets import (
    Window,
    id_indices,
    latest_per_key,
    stable_split,
    window_tables,
)
from pipeline.training.idmap import IdMap
from pipeline.training.trainers import Challenger, Trainer, feature_scorer, idmap
from pipeline.training.tuning import (
    grid_search,
    neighbours,
    skipped,
    validation_mask,
)

# the logistic challenger's grid (5 settings): C over 4 decades around sklearn's default 1.
# On bench/toppush_binary.py's sets (test Pos@Top and AUC of liblinear LR over C = 1e-3..100,
# with and without class_weight="balanced") the best C ranged from 1 (spambase) to 10 (w8a)
# and 100 (diabetes), and 0.1 on the synthetic outcomes of the tests, while balanced weights
# changed little at the best C: the C range is what needs the settings. A warm run tries the
# last C and its neighbours (at most 3 fits)
LOGISTIC_C = (0.01, 0.1, 1.0, 10.0, 100.0)
LOGISTIC_DEFAULT = {"C": 1.0}   # when validation cannot choose


@dataclass
class OutcomeData:
    """TopPush's inputs: one row per item, its latest outcome's features and 0/1 label."""

    items: IdMap | None
    X: object                         # scipy.sparse.csr_matrix, rows = items in ``rows``
    y: np.ndarray                     # 0/1
    rows: np.ndarray                  # item index of each row
    test_mask: np.ndarray
    window: Window | None
    stats: dict = field(default_factory=dict)

    def to_arrays(self) -> dict:
        """The dataset bundle's arrays: ``item_ids``, X (:func:`csr_to_arrays`), ``y``,
        ``rows`` and ``test_mask``."""
        return {"item_ids": self.items.ids, **csr_to_arrays(self.X), "y": self.y,
                "rows": self.rows, "test_mask": self.test_mask}

    @classmethod
    def from_arrays(cls, arrays: dict) -> OutcomeData:
        """The dataset of a bundle's arrays (no id map, window or stats: the arrays keep
        ``item_ids`` as they are)."""
        return cls(items=None, X=csr_from_arrays(arrays), y=arrays["y"], rows=arrays["rows"],
                   test_mask=arrays["test_mask"], window=None)


def outcomes(store: EventStore, *, window=None, items: IdMap | None = None,
             test_fraction: float = 0.2, seed: int = 0, n_features: int | None = None,
             max_features: int = 2**24) -> OutcomeData:
    """TopPush inputs from outcome events: one row per item (its latest outcome). Features of
    index ``max_features`` or more are left out (counted in the stats), so no single event can
    make the model's weight vector arbitrarily large."""
    columns = {"outcome": ["ts", "offset", "item", "label", "feature_index", "feature_value"]}
    tables, win = window_tables(store, ["outcome"], window or {}, columns, key="item")
    t = tables["outcome"]
    items, idx = id_indices(items or IdMap(), t.column("item"))
    keep = latest_per_key(idx, t.column("ts").to_numpy(), t.column("offset").to_numpy())
    t = t.take(pa.array(keep))
    X = features_csr(t, max_features=max_features)
    dropped = int(pc.sum(pc.list_value_length(t.column("feature_index"))).as_py() or 0) - X.nnz
    if n_features is not None and X.shape[1] < n_features:
        X.resize((X.shape[0], n_features))
    y = t.column("label").to_numpy().astype(np.int8)
    rows = idx[keep]
    test = stable_split(rows, test_fraction, seed) if test_fraction > 0 else \
        np.zeros(len(rows), bool)
    return OutcomeData(items=items, X=X, y=y, rows=rows, test_mask=test, window=win,
                       stats={"outcomes": int(len(rows)), "positives": int(y.sum()),
                              "test": int(test.sum()), "features": int(X.shape[1]),
                              "feature_values_over_max_features": dropped})


def _metrics(y, scores) -> dict:
    from solvers import metrics

    if len(np.unique(y)) < 2:
        return {}
    return {"pos@top": float(metrics.pos_at_top(y, scores)),
            "average_precision": float(metrics.average_precision(y, scores)),
            "auc": float(metrics.auc(y, scores)), "ndcg": float(metrics.ndcg(y, scores))}


class TunedLogistic:
    """The ``"logistic"`` challenger: L2 logistic regression (scikit-learn, liblinear) tuned on
    a validation split of the training rows.

    ``fit`` carves a validation part out of the rows by a stable hash of ``ids``
    (:func:`~pipeline.training.tuning.validation_mask`, ``seed + 1``), fits every C
    of ``LOGISTIC_C`` on the rest, scores it by ``metric`` on the validation part, and refits
    the best on all rows. With ``warm`` (a previous ``warm_state()``) it tries the last C and
    its neighbours. Only the columns with a non-zero in the training rows enter the fit (a
    2**24-wide hashed space costs what its used columns cost); the others get weight 0. When
    the validation part cannot score (one class, or empty) the fit is at
    ``LOGISTIC_DEFAULT``; when the training rows have one class (or no feature) every score is
    0. ``tried_`` says which. Every metric of the family is higher-is-better.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 4)); y = (X[:, 0] + 0.3 * rng.normal(size=300) > 1).astype(int)
    >>> model = TunedLogistic(metric="auc").fit(X, y)
    >>> len(model.tried_), model.best_ in [t["params"] for t in model.tried_]
    (5, True)
    """

    def __init__(self, *, metric: str = "pos@top", seed: int = 0, warm: dict | None = None):
        self.metric, self.seed, self.warm = metric, seed, warm

    def settings(self) -> list[dict]:
        grid = LOGISTIC_C
        if self.warm and "C" in self.warm:
            grid = neighbours(LOGISTIC_C, float(self.warm["C"]))
        return [{"C": C} for C in grid]

    @staticmethod
    def _fit(X, y, params):
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(C=params["C"], solver="liblinear",
                                  dual=X.shape[1] > X.shape[0], max_iter=1000).fit(X, y)

    def fit(self, X, y, ids=None):
        from scipy.sparse import csr_matrix

        X = csr_matrix(X)
        y = np.asarray(y)
        ids = np.arange(len(y)) if ids is None else np.asarray(ids)
        self.columns_ = np.unique(X.indices)
        Xc = X[:, self.columns_]
        Xc.indices = Xc.indices.astype(np.int32)   # liblinear refuses int64 indices
        Xc.indptr = Xc.indptr.astype(np.int32)
        self.model_, self.best_ = None, None
        if len(np.unique(y)) < 2 or len(self.columns_) == 0:
            why = "training rows have one class" if len(np.unique(y)) < 2 else "no feature"
            self.tried_ = [skipped(LOGISTIC_DEFAULT, f"{why}: every score is 0")]
            return self
        val = validation_mask(ids, self.seed)
        tune = ~val
        if len(np.unique(y[val])) < 2 or len(np.unique(y[tune])) < 2:
            self.best_ = dict(LOGISTIC_DEFAULT)
            self.tried_ = [skipped(self.best_, f"validation split ({int(val.sum())} of "
                                   f"{len(y)} rows) has one class on a side: fitted at the "
                                   "default")]
        else:
            self.best_, self.tried_ = grid_search(
                self.settings(), lambda p: self._fit(Xc[tune], y[tune], p),
                lambda m: _metrics(y[val], m.decision_function(Xc[val])).get(self.metric),
                higher_is_better=True)
            self.best_ = self.best_ or dict(LOGISTIC_DEFAULT)
        # the final fit's warnings (no convergence) reach the run's log as the model's do
        self.model_ = self._fit(Xc, y, self.best_)
        return self

    def decision_function(self, X):
        from scipy.sparse import csr_matrix

        if self.model_ is None:
            return np.zeros(X.shape[0])
        return self.model_.decision_function(csr_matrix(X)[:, self.columns_])

    def warm_state(self) -> dict:
        if self.best_ is None:
            return {}
        return {"C": np.array(float(self.best_["C"]))}

    def scorer(self, n_features: int):
        """Its weights over all ``n_features`` columns as a linear scorer (the intercept, a
        shift of every score, changes no order)."""
        from pipeline.serving.scorers import Scorer

        w = np.zeros(int(n_features))
        if self.model_ is not None:
            w[self.columns_] = np.asarray(self.model_.coef_).ravel()
        return Scorer.linear(w)


class TopPushTrainer(Trainer):
    id_maps = ("item_ids",)

    def build(self, store, cfg, previous: dict | None) -> tuple[dict, dict]:
        ev = cfg.evaluation
        n_features = int(previous["warm_coef"].shape[0]) if previous and \
            "warm_coef" in previous else None
        data = outcomes(store, window=cfg.window, items=idmap(previous, "item_ids"),
                        test_fraction=float(ev["fraction"]), seed=int(ev["seed"]),
                        n_features=n_features,
                        max_features=self.family.dataset_param(cfg.params, "max_features"))
        return data.to_arrays(), {"window": data.window.describe(), "stats": data.stats,
                                  "n_train": int((~data.test_mask).sum())}

    def fit_model(self, model, arrays: dict, warm: dict | None, cfg) -> None:
        data = OutcomeData.from_arrays(arrays)
        train = ~data.test_mask
        model.fit(data.X[train], data.y[train], ids=data.rows[train], warm_start=warm)

    def evaluate(self, model, arrays: dict, cfg) -> dict:
        data = OutcomeData.from_arrays(arrays)
        test = data.test_mask
        return _metrics(data.y[test], model.decision_function(data.X[test]))

    def holdout_unit(self, arrays: dict, cfg) -> str | None:
        return "positives" if cfg.metric == "average_precision" else None

    def per_unit_holdout(self, candidate, arrays: dict, cfg) -> np.ndarray:
        """The precision at each held-out positive's rank among the held-out rows (their mean
        is the average precision) of ``candidate``: a fitted model, or one score per row."""
        from solvers.metrics import average_precision

        data = OutcomeData.from_arrays(arrays)
        test = data.test_mask
        if len(np.unique(data.y[test])) < 2:
            return np.zeros(0)
        scores = (candidate[test] if isinstance(candidate, np.ndarray)
                  else candidate.decision_function(data.X[test]))
        return average_precision(data.y[test], scores, per_positive=True)

    def baselines(self, arrays: dict, cfg) -> dict:
        """``best_feature``: the single feature, with its sign, that ranks the training
        outcomes best by the gate metric (among the 50 of largest standardized mean
        difference between positives and negatives), scored on the holdout."""
        X, y, test = csr_from_arrays(arrays).tocsc(), arrays["y"], arrays["test_mask"]
        train = ~test
        if len(np.unique(y[train])) < 2 or X.shape[1] == 0:
            return {}
        Xt = X[train]
        pos, neg = y[train] == 1, y[train] == 0
        mean_p = np.asarray(Xt[pos].mean(0)).ravel()
        mean_n = np.asarray(Xt[neg].mean(0)).ravel()
        variance = (np.asarray(Xt.multiply(Xt).mean(0)).ravel()
                    - np.asarray(Xt.mean(0)).ravel() ** 2)
        gap = (mean_p - mean_n) / np.sqrt(np.maximum(variance, 0.0) + 1e-12)
        best, best_value = None, -np.inf
        sign = 1.0 if self.family.higher_is_better(cfg.metric) else -1.0
        for j in np.argsort(-np.abs(gap))[:50]:
            if gap[j] == 0:
                break   # the rest do not separate the classes at all
            column = np.sign(gap[j]) * Xt[:, j].toarray().ravel()
            value = _metrics(y[train], column).get(cfg.metric)
            if value is not None and sign * value > best_value:
                best, best_value = j, sign * value
        if best is None:
            return {}
        scores = np.sign(gap[best]) * X[:, best].toarray().ravel()
        found = _metrics(y[test], scores[test])
        found.update(feature=int(best), sign=int(np.sign(gap[best])))
        return {"best_feature": (found, scores.astype(np.float32))}

    def item_ids(self, arrays: dict):
        return arrays["item_ids"][arrays["rows"]]

    def artifact(self, model, arrays: dict, cfg, **describe):
        """The training rows ranked (a global list), and the weights as a linear scorer: new
        rows are scored by ``/rank`` with what TopPush learned (``decision_function = Xw``)."""
        from pipeline.serving.artifact import ModelArtifact
        from pipeline.serving.scorers import Scorer

        return ModelArtifact.global_list(item_ids=self.item_ids(arrays),
                                         scores=model.decision_function(csr_from_arrays(arrays)),
                                         scorer=Scorer.linear(model.coef_),
                                         algorithm=self.family.name, **describe)

    def trivial_artifact(self, scores, arrays: dict, **describe):
        """The best feature's list, and the feature with its sign as a linear scorer."""
        from pipeline.serving.artifact import ModelArtifact

        scorer = feature_scorer(describe.get("metrics"), arrays)
        return ModelArtifact.global_list(item_ids=self.item_ids(arrays), scores=scores,
                                         scorer=scorer, **describe)

    def challenger(self, fitted, arrays: dict, cfg, warm: dict | None) -> Challenger:
        """``"logistic"``: :class:`TunedLogistic` on the training rows (validation split by the
        item index), scored on the holdout like the model, published as a global list."""
        from pipeline.serving.artifact import ModelArtifact

        started = time.perf_counter()
        data = OutcomeData.from_arrays(arrays)
        X, y, test = data.X, data.y, data.test_mask
        train = ~test
        tuned = TunedLogistic(metric=cfg.metric, seed=int(cfg.evaluation["seed"]),
                              warm=warm).fit(X[train], y[train], ids=data.rows[train])
        scores = tuned.decision_function(X)
        return Challenger(
            name="logistic", metrics=_metrics(y[test], scores[test]),
            artifact=ModelArtifact.global_list(item_ids=self.item_ids(arrays), scores=scores,
                                               scorer=tuned.scorer(X.shape[1])),
            tried=tuned.tried_, fit_seconds=time.perf_counter() - started,
            warm=tuned.warm_state(), evaluated=scores)
