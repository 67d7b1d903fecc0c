"""NPSVOR's trainer: ordinal events (reviews) -> ``[features | hashed text]`` rows -> NPSVOR ->
a predicted rating per item, the items ranked by ``predict_score``, and the model itself for
on-demand lookups.

Rows are events (an item's many reviews are many instances); each row's instance id is a hash
of its event id, so a warm refit maps the previous duals onto the same reviews whatever else
arrived (:func:`pipeline.training.datasets.ordinal`). An item's published rating is the
prediction for its latest event.

Evaluation on the held-out events: MAE (the gate's default, lower is better), MSE, accuracy,
and ``rating_ndcg``, the NDCG of the whole held-out list ordered by ``predict_score`` with the
true rating as gain. The trivial models the gate compares with are constant ratings (the
training majority, the rounded mean and the median: the best constant for MAE) and the best
single feature (a monotone map from one column to a rating, fitted by isotonic regression).
"""

from __future__ import annotations

import numpy as np

from pipeline.training import datasets
from pipeline.training.trainers import Trainer

N_CANDIDATE_FEATURES = 20   # columns of largest |correlation| tried for the best single feature


def _matrix(arrays: dict):
    from scipy.sparse import csr_matrix

    return csr_matrix((arrays["X_data"], arrays["X_indices"], arrays["X_indptr"]),
                      shape=tuple(arrays["X_shape"]))


def ordinal_metrics(y, ratings, scores) -> dict:
    """MAE, MSE and accuracy of predicted ``ratings``, and the NDCG of ``scores`` (gain = the
    true rating) over the whole list; {} for an empty list."""
    from solvers import metrics

    if len(y) == 0:
        return {}
    return {"mae": metrics.mae(y, ratings), "mse": metrics.mse(y, ratings),
            "accuracy": metrics.accuracy(y, ratings),
            "rating_ndcg": metrics.rating_ndcg(y, scores)}


class NPSVORTrainer(Trainer):
    id_maps = ()    # instance ids are hashes of event ids: nothing to extend

    def build(self, store, cfg, previous: dict | None) -> tuple[dict, dict]:
        ev, param = cfg.evaluation, lambda name: self.family.dataset_param(cfg.params, name)
        data = datasets.ordinal(
            store, window=cfg.window, test_fraction=float(ev["fraction"]), seed=int(ev["seed"]),
            n_features=int(previous["n_features"]) if previous and "n_features" in previous
            else None, max_features=int(param("max_features")),
            text_features=int(param("text_features")))
        X = data.X
        arrays = {"X_data": X.data, "X_indices": X.indices, "X_indptr": X.indptr,
                  "X_shape": np.array(X.shape), "y": data.y, "ids": data.ids,
                  "item_ids": data.item_ids, "row_item": data.row_item,
                  "latest": data.latest, "test_mask": data.test_mask,
                  "n_features": np.array(data.n_features),
                  "text_features": np.array(data.text_features)}
        return arrays, {"window": data.window.describe(), "stats": data.stats,
                        "n_train": int((~data.test_mask).sum())}

    # ------------------------------------------------------------------ fitting

    def fit_model(self, model, arrays: dict, warm: dict | None, cfg) -> None:
        """Fit on the training events, the duals of events seen before taken over by id."""
        train = ~arrays["test_mask"]
        model.fit(_matrix(arrays)[train], arrays["y"][train], ids=arrays["ids"][train],
                  warm_start=warm)

    def fit_info(self, model) -> dict:
        return {"converged": model.converged_,
                "n_iter_per_rank": [int(n) for n in model.n_iter_per_rank_],
                "rank_seconds_max": float(np.max(model.rank_fit_seconds_))}

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, model, arrays: dict, cfg) -> dict:
        test = arrays["test_mask"]
        if not test.any():
            return {}
        X = _matrix(arrays)[test]
        return ordinal_metrics(arrays["y"][test], model.predict(X), model.predict_score(X))

    def baselines(self, arrays: dict, cfg) -> dict:
        """Constant ratings from the training events, ``majority`` (the most frequent rating),
        ``mean`` (the mean rating, rounded) and ``median`` (the lower median: the constant of
        least training MAE), and ``best_feature`` (see :meth:`best_feature`), each scored on
        the held-out events like the model. Returns {name: (metrics, one continuous predicted
        rating per published item)}."""
        y, test = arrays["y"], arrays["test_mask"]
        train = ~test
        if not train.any():
            return {}
        ytr, yte = y[train], y[test]
        lowest = int(ytr.min())
        constants = {"majority": lowest + int(np.argmax(np.bincount(ytr - lowest))),
                     "mean": int(np.floor(ytr.mean() + 0.5)),
                     "median": int(np.sort(ytr)[(len(ytr) - 1) // 2])}
        n_items = len(arrays["latest"])
        out = {}
        for name, rating in constants.items():
            same = np.full(len(yte), float(rating))
            out[name] = (ordinal_metrics(yte, same, same),
                         np.full(n_items, rating, dtype=np.float32))
        found = self.best_feature(arrays, cfg)
        if found is not None:
            out["best_feature"] = found
        return out

    def best_feature(self, arrays: dict, cfg):
        """The single column (a numeric feature or a hashed n-gram) that predicts the rating
        best through a monotone map: among the ``N_CANDIDATE_FEATURES`` training columns of
        largest |Pearson correlation| with the rating, an isotonic regression of the rating on
        the column (increasing or decreasing by the correlation's sign), rounded and clipped
        to the training ratings, chosen by the gate metric on the training events and scored
        on the held-out ones. None when no column varies."""
        from sklearn.isotonic import IsotonicRegression

        X, y, test = _matrix(arrays), arrays["y"].astype(np.float64), arrays["test_mask"]
        train = ~test
        Xt, yt = X[train].tocsc(), y[train]
        n = Xt.shape[0]
        mean_x = np.asarray(Xt.sum(axis=0)).ravel() / n
        var_x = np.asarray(Xt.multiply(Xt).sum(axis=0)).ravel() / n - mean_x**2
        cov = Xt.T @ (yt - yt.mean()) / n
        var_y = yt.var()
        usable = var_x > 1e-12
        if not usable.any() or var_y == 0:
            return None
        corr = np.zeros(X.shape[1])
        corr[usable] = cov[usable] / np.sqrt(var_x[usable] * var_y)
        candidates = np.argsort(-np.abs(corr))[:N_CANDIDATE_FEATURES]
        candidates = candidates[np.abs(corr[candidates]) > 0]
        lo, hi = float(yt.min()), float(yt.max())
        sign = 1.0 if self.family.higher_is_better(cfg.metric) else -1.0
        best, best_value = None, -np.inf
        for j in candidates:
            column = Xt[:, j].toarray().ravel()
            iso = IsotonicRegression(increasing=bool(corr[j] > 0), y_min=lo, y_max=hi,
                                     out_of_bounds="clip").fit(column, yt)
            fitted = iso.predict(column)
            value = ordinal_metrics(yt, np.rint(fitted), fitted).get(cfg.metric)
            if value is not None and sign * value > best_value:
                best, best_value = (int(j), iso), sign * value
        if best is None:
            return None
        j, iso = best
        column = X[:, j].toarray().ravel()
        scores = iso.predict(column)
        found = ordinal_metrics(y[test], np.rint(scores[test]), scores[test])
        found["feature"] = j
        n_features = int(arrays["n_features"])
        found["column"] = (f"feature {j}" if j < n_features
                           else f"hashed text column {j - n_features}")
        return found, scores[arrays["latest"]].astype(np.float32)

    # ------------------------------------------------------------------ publishing

    def item_ids(self, arrays: dict):
        return arrays["item_ids"][arrays["row_item"][arrays["latest"]]]

    def artifact(self, model, arrays: dict, cfg, **describe):
        """Every item's predicted rating from its latest event, the list ranked by
        ``predict_score``, and the model (weights over the columns it uses) for lookups that
        rate or rank new items from their features or text."""
        from pipeline.serving.artifact import ModelArtifact
        from pipeline.serving.scorers import Scorer

        X = _matrix(arrays)[arrays["latest"]]
        scorer = Scorer.ordinal(model, n_features=int(arrays["n_features"]),
                                text_features=int(arrays["text_features"]))
        return ModelArtifact.predicted_ratings(
            item_ids=self.item_ids(arrays), ratings=model.predict(X),
            scores=model.predict_score(X), scorer=scorer, algorithm=self.family.name,
            **describe)

    def trivial_artifact(self, scores, arrays: dict, **describe):
        """A trivial model as predicted ratings: its continuous rating per item, rounded."""
        from pipeline.serving.artifact import ModelArtifact

        y = arrays["y"][~arrays["test_mask"]]
        ratings = np.clip(np.rint(scores), y.min(), y.max()) if len(y) else np.rint(scores)
        return ModelArtifact.predicted_ratings(item_ids=self.item_ids(arrays), ratings=ratings,
                                               scores=scores, **describe)

    def checkpoint(self, model, arrays: dict) -> dict:
        """The warm state (duals per event hash and rank) and the numeric feature width, which
        the next run keeps (the text columns start after it)."""
        return {**super().checkpoint(model, arrays), "n_features": arrays["n_features"]}
