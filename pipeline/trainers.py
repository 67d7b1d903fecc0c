"""One adapter per algorithm between the generic retrain loop and a solver: build the dataset,
fit with a warm start, evaluate, and turn the model into a publishable artifact and checkpoint.

Datasets and warm states travel as dicts of plain numpy arrays (``np.savez``-able, no pickle).
Every warm state is keyed by external ids, so it survives renumbering-free growth of the data:
AltSVM duals by (user, winner, loser) indices of the persisted id maps, TopPush duals by item
index.
"""

from __future__ import annotations

import time

import numpy as np

from pipeline import datasets
from pipeline.idmap import IdMap


def _idmap(arrays: dict, name: str) -> IdMap:
    return IdMap(arrays[name]) if name in arrays else IdMap()


class AltSVMTrainer:
    algorithm = "altsvm"
    dataset_keys = ("max_pairs_per_user",)

    def build(self, store, cfg, previous: dict | None) -> tuple[dict, dict]:
        prev = previous or {}
        ev = cfg.evaluation
        data = datasets.collaborative(
            store, cfg.kinds, window=cfg.window, users=_idmap(prev, "user_ids"),
            items=_idmap(prev, "item_ids"), holdout=int(ev.get("holdout", 5)),
            min_train=int(ev.get("min_train", 5)),
            max_pairs_per_user=cfg.params.get("max_pairs_per_user"), seed=int(ev["seed"]))
        arrays = {"user_ids": data.users.ids, "item_ids": data.items.ids,
                  "comparisons": data.comparisons,
                  **{f"train_{k}": v for k, v in data.train.items()},
                  **{f"test_{k}": v for k, v in data.test.items()},
                  "seen_indptr": data.seen_indptr, "seen_indices": data.seen_indices}
        return arrays, {"window": data.window.describe(), "stats": data.stats,
                        "n_train": int(len(data.comparisons))}

    def fit(self, arrays: dict, cfg, warm: dict | None):
        from solvers import AltSVM

        params = {k: v for k, v in cfg.params.items() if k not in self.dataset_keys}
        model = AltSVM(**params)
        started = time.perf_counter()
        model.fit(arrays["comparisons"], n_users=len(arrays["user_ids"]),
                  n_items=len(arrays["item_ids"]), warm_start=warm)
        return model, {"fit_seconds": time.perf_counter() - started,
                       "n_iter": int(model.n_iter_), "objective": float(model.objective_[-1])}

    def evaluate(self, model, arrays: dict, cfg) -> dict:
        from solvers import metrics, pairs_from_ratings

        u, i, r = arrays["test_user"], arrays["test_item"], arrays["test_rating"]
        if len(u) == 0:
            return {}
        scores = model.predict(u, i)
        k = 10
        out = {f"ndcg@{k}": float(metrics.ndcg_at_k(u, r, scores, k=k)),
               f"precision@{k}": float(metrics.precision_at_k(u, r >= 4, scores, k=k))}
        pairs = pairs_from_ratings(u, i, r)
        if len(pairs):
            out["pairwise_accuracy"] = float(metrics.pairwise_accuracy(
                model.predict(pairs[:, 0], pairs[:, 1]), model.predict(pairs[:, 0], pairs[:, 2])))
        return out

    def artifact(self, model, arrays: dict, cfg, **describe):
        from pipeline.artifact import ModelArtifact

        bias = model.item_bias_ if getattr(model, "item_bias", False) else None
        return ModelArtifact.user_item(
            user_ids=arrays["user_ids"], item_ids=arrays["item_ids"],
            user_factors=model.user_factors_, item_factors=model.item_factors_, item_bias=bias,
            seen=(arrays["seen_indptr"], arrays["seen_indices"]), algorithm=self.algorithm,
            **describe)

    def checkpoint(self, model, arrays: dict) -> dict:
        state = model.warm_state()
        return {"user_ids": arrays["user_ids"], "item_ids": arrays["item_ids"],
                **{f"warm_{k}": v for k, v in state.items()}}


class TopPushTrainer:
    algorithm = "toppush"

    def build(self, store, cfg, previous: dict | None) -> tuple[dict, dict]:
        prev = previous or {}
        ev = cfg.evaluation
        n_features = int(prev["warm_coef"].shape[0]) if "warm_coef" in prev else None
        data = datasets.outcomes(store, window=cfg.window, items=_idmap(prev, "item_ids"),
                                 test_fraction=float(ev.get("fraction", 0.2)),
                                 seed=int(ev["seed"]), n_features=n_features)
        X = data.X.tocsr()
        arrays = {"item_ids": data.items.ids, "X_data": X.data, "X_indices": X.indices,
                  "X_indptr": X.indptr, "X_shape": np.array(X.shape), "y": data.y,
                  "rows": data.rows, "test_mask": data.test_mask}
        return arrays, {"window": data.window.describe(), "stats": data.stats,
                        "n_train": int((~data.test_mask).sum())}

    @staticmethod
    def _X(arrays: dict):
        from scipy.sparse import csr_matrix

        return csr_matrix((arrays["X_data"], arrays["X_indices"], arrays["X_indptr"]),
                          shape=tuple(arrays["X_shape"]))

    def fit(self, arrays: dict, cfg, warm: dict | None):
        from solvers import TopPush

        X, train = self._X(arrays), ~arrays["test_mask"]
        model = TopPush(**cfg.params)
        started = time.perf_counter()
        model.fit(X[train], arrays["y"][train], ids=arrays["rows"][train], warm_start=warm)
        return model, {"fit_seconds": time.perf_counter() - started,
                       "n_iter": int(model.n_iter_)}

    def evaluate(self, model, arrays: dict, cfg) -> dict:
        from solvers import metrics

        test = arrays["test_mask"]
        y = arrays["y"][test]
        if len(np.unique(y)) < 2:
            return {}
        s = model.decision_function(self._X(arrays)[test])
        return {"pos@top": float(metrics.pos_at_top(y, s)),
                "average_precision": float(metrics.average_precision(y, s)),
                "auc": float(metrics.auc(y, s)), "ndcg": float(metrics.ndcg(y, s))}

    def artifact(self, model, arrays: dict, cfg, **describe):
        from pipeline.artifact import ModelArtifact

        scores = model.decision_function(self._X(arrays))
        return ModelArtifact.global_list(item_ids=arrays["item_ids"][arrays["rows"]],
                                         scores=scores, algorithm=self.algorithm, **describe)

    def checkpoint(self, model, arrays: dict) -> dict:
        return {"item_ids": arrays["item_ids"],
                **{f"warm_{k}": v for k, v in model.warm_state().items()}}


TRAINERS = {"altsvm": AltSVMTrainer(), "toppush": TopPushTrainer()}


def warm_state(checkpoint_arrays: dict) -> dict:
    """The solver warm state stored in a checkpoint (the ``warm_*`` arrays)."""
    return {k[5:]: v for k, v in checkpoint_arrays.items() if k.startswith("warm_")}
