"""AltSVM's trainer: rating and comparison events -> comparisons -> AltSVM -> per-user top-K."""

from __future__ import annotations

from pipeline.training import datasets
from pipeline.training.trainers import Trainer, idmap


class AltSVMTrainer(Trainer):
    id_maps = ("user_ids", "item_ids")

    def build(self, store, cfg, previous: dict | None) -> tuple[dict, dict]:
        ev = cfg.evaluation
        data = datasets.collaborative(
            store, cfg.kinds, window=cfg.window, users=idmap(previous, "user_ids"),
            items=idmap(previous, "item_ids"), split=ev["split"], holdout=int(ev["holdout"]),
            fraction=float(ev["fraction"]), min_train=int(ev["min_train"]),
            max_pairs_per_user=self.family.dataset_param(cfg.params, "max_pairs_per_user") or None,
            seed=int(ev["seed"]))
        arrays = {"user_ids": data.users.ids, "item_ids": data.items.ids,
                  "comparisons": data.comparisons,
                  **{f"train_{k}": v for k, v in data.train.items()},
                  **{f"test_{k}": v for k, v in data.test.items()},
                  "seen_indptr": data.seen_indptr, "seen_indices": data.seen_indices}
        return arrays, {"window": data.window.describe(), "stats": data.stats,
                        "n_train": int(len(data.comparisons))}

    def fit_model(self, model, arrays: dict, warm: dict | None) -> None:
        model.fit(arrays["comparisons"], n_users=len(arrays["user_ids"]),
                  n_items=len(arrays["item_ids"]), warm_start=warm)

    def fit_info(self, model) -> dict:
        return {"objective": float(model.objective_[-1])}

    def evaluate(self, model, arrays: dict, cfg) -> dict:
        """NDCG@k and precision@k over each user's held-out ratings (relevant: rating >=
        ``evaluation.relevance``), and the pairwise accuracy of their held-out pairs."""
        from solvers import metrics, pairs_from_ratings

        u, i, r = arrays["test_user"], arrays["test_item"], arrays["test_rating"]
        if len(u) == 0:
            return {}
        k, relevance = int(cfg.evaluation["k"]), float(cfg.evaluation["relevance"])
        scores = model.predict(u, i)
        out = {f"ndcg@{k}": float(metrics.ndcg_at_k(u, r, scores, k=k)),
               f"precision@{k}": float(metrics.precision_at_k(u, r >= relevance, scores, k=k))}
        pairs = pairs_from_ratings(u, i, r)
        if len(pairs):
            out["pairwise_accuracy"] = float(metrics.pairwise_accuracy(
                model.predict(pairs[:, 0], pairs[:, 1]), model.predict(pairs[:, 0], pairs[:, 2])))
        return out

    def artifact(self, model, arrays: dict, cfg, **describe):
        from pipeline.serving.artifact import ModelArtifact

        bias = model.item_bias_ if model.item_bias else None
        return ModelArtifact.user_item(
            user_ids=arrays["user_ids"], item_ids=arrays["item_ids"],
            user_factors=model.user_factors_, item_factors=model.item_factors_, item_bias=bias,
            seen=(arrays["seen_indptr"], arrays["seen_indices"]), algorithm=self.family.name,
            **describe)
