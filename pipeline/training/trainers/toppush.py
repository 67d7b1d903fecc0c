"""TopPush's trainer: outcome events -> sparse (X, y) -> TopPush -> one ranked item list."""

from __future__ import annotations

import numpy as np

from pipeline.training import datasets
from pipeline.training.trainers import Trainer, idmap


def _matrix(arrays: dict):
    from scipy.sparse import csr_matrix

    return csr_matrix((arrays["X_data"], arrays["X_indices"], arrays["X_indptr"]),
                      shape=tuple(arrays["X_shape"]))


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

    def fit_model(self, model, arrays: dict, warm: dict | None) -> None:
        train = ~arrays["test_mask"]
        model.fit(_matrix(arrays)[train], arrays["y"][train], ids=arrays["rows"][train],
                  warm_start=warm)

    def evaluate(self, model, arrays: dict, cfg) -> dict:
        from solvers import metrics

        test = arrays["test_mask"]
        y = arrays["y"][test]
        if len(np.unique(y)) < 2:
            return {}
        s = model.decision_function(_matrix(arrays)[test])
        return {"pos@top": float(metrics.pos_at_top(y, s)),
                "average_precision": float(metrics.average_precision(y, s)),
                "auc": float(metrics.auc(y, s)), "ndcg": float(metrics.ndcg(y, s))}

    def artifact(self, model, arrays: dict, cfg, **describe):
        from pipeline.serving.artifact import ModelArtifact

        scores = model.decision_function(_matrix(arrays))
        return ModelArtifact.global_list(item_ids=arrays["item_ids"][arrays["rows"]],
                                         scores=scores, algorithm=self.family.name, **describe)
