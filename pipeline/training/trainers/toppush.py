"""TopPush's trainer: outcome events -> sparse (X, y) -> TopPush -> one ranked item list."""

from __future__ import annotations

import numpy as np

from pipeline.training import datasets
from pipeline.training.trainers import Trainer, idmap


def _matrix(arrays: dict):
    from scipy.sparse import csr_matrix

    return csr_matrix((arrays["X_data"], arrays["X_indices"], arrays["X_indptr"]),
                      shape=tuple(arrays["X_shape"]))


def _metrics(y, scores) -> dict:
    from solvers import metrics

    if len(np.unique(y)) < 2:
        return {}
    return {"pos@top": float(metrics.pos_at_top(y, scores)),
            "average_precision": float(metrics.average_precision(y, scores)),
            "auc": float(metrics.auc(y, scores)), "ndcg": float(metrics.ndcg(y, scores))}


class TopPushTrainer(Trainer):
    id_maps = ("item_ids",)

    def build(self, store, cfg, previous: dict | None) -> tuple[dict, dict]:
        ev = cfg.evaluation
        n_features = int(previous["warm_coef"].shape[0]) if previous and \
            "warm_coef" in previous else None
        data = datasets.outcomes(store, window=cfg.window, items=idmap(previous, "item_ids"),
                                 test_fraction=float(ev["fraction"]), seed=int(ev["seed"]),
                                 n_features=n_features,
                                 max_features=self.family.dataset_param(cfg.params,
                                                                        "max_features"))
        X = data.X.tocsr()
        arrays = {"item_ids": data.items.ids, "X_data": X.data, "X_indices": X.indices,
                  "X_indptr": X.indptr, "X_shape": np.array(X.shape), "y": data.y,
                  "rows": data.rows, "test_mask": data.test_mask}
        return arrays, {"window": data.window.describe(), "stats": data.stats,
                        "n_train": int((~data.test_mask).sum())}

    def fit_model(self, model, arrays: dict, warm: dict | None, cfg) -> None:
        train = ~arrays["test_mask"]
        model.fit(_matrix(arrays)[train], arrays["y"][train], ids=arrays["rows"][train],
                  warm_start=warm)

    def evaluate(self, model, arrays: dict, cfg) -> dict:
        test = arrays["test_mask"]
        return _metrics(arrays["y"][test], model.decision_function(_matrix(arrays)[test]))

    def baselines(self, arrays: dict, cfg) -> dict:
        """``best_feature``: the single feature, with its sign, that ranks the training
        outcomes best by the gate metric (among the 50 of largest standardized mean
        difference between positives and negatives), scored on the holdout."""
        X, y, test = _matrix(arrays).tocsc(), arrays["y"], arrays["test_mask"]
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
        found["feature"] = int(best)
        return {"best_feature": (found, scores.astype(np.float32))}

    def item_ids(self, arrays: dict):
        return arrays["item_ids"][arrays["rows"]]

    def artifact(self, model, arrays: dict, cfg, **describe):
        from pipeline.serving.artifact import ModelArtifact

        return ModelArtifact.global_list(item_ids=self.item_ids(arrays),
                                         scores=model.decision_function(_matrix(arrays)),
                                         algorithm=self.family.name, **describe)
