"""NPSVOR's trainer: ordinal events (reviews) -> ``[features | hashed text]`` rows -> NPSVOR ->
a predicted rating per item, the items ranked by ``predict_score``, and the model itself for
on-demand lookups.

Rows are events (an item's many reviews are many instances); each row's instance id is a hash
of its event id, so a warm refit maps the previous duals onto the same reviews whatever else
arrived (:func:`pipeline.training.trainers.npsvor_data.ordinal`). An item's published rating is the
prediction for its latest event.

Evaluation on the held-out events: MAE (the gate's default, lower is better), MSE, accuracy,
and ``rating_ndcg``, the NDCG of the whole held-out list ordered by ``predict_score`` with the
true rating as gain. The trivial models the gate compares with are constant ratings (the
training majority, the rounded mean and the median: the best constant for MAE) and the best
single feature (a monotone map from one column to a rating, fitted by isotonic regression).

Challenger ``"linear_ordinal"`` (:class:`TunedLinearOrdinal`): the better on a validation part
of the training events of scikit-learn's LinearSVR (rounded and clipped to the rating range)
and mord's LogisticAT, each over ``ORDINAL_C``.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from pipeline.training.trainers import WARM_PREFIX, Challenger, Trainer, npsvor_tuning
from pipeline.training.trainers.npsvor_data import OrdinalData, ordinal
from pipeline.training.tuning import (
    grid_search,
    neighbours,
    skipped,
    validation_mask,
)

N_CANDIDATE_FEATURES = 20   # columns of largest |correlation| tried for the best single feature

# the linear_ordinal challenger's grid (6 settings): C of LinearSVR and 1/alpha of LogisticAT
# (the same trade-off: sum of the losses + ½‖w‖²/C) at sklearn's and mord's default 1 and a
# decade either side; a warm run tries the last estimator at the last C and its neighbours
ORDINAL_C = (0.1, 1.0, 10.0)
ORDINAL_DEFAULT = {"estimator": "LinearSVR", "C": 1.0}   # when validation cannot choose
SVR_EPSILON = 0.1          # the NPSVOR paper's SVR (ratings are integers: a tenth is slack)
# mord's LogisticAT runs scipy's L-BFGS-B to its 1000-iteration cap (tol 1e-12), a pass over
# X per iteration: on Treebank (bench/npsvor_text.py, 60k non-zeros in the tuning rows) its
# three fits took 1.4, 5.8 and 14.3 s and the whole challenger 30 s, against NPSVOR's 0.15 s.
# Above this many non-zeros in the tuning rows it is skipped (noted in ``tried``; ~2 minutes
# of fits at the cap), as it is without mord (a dev dependency only)
LOGISTIC_AT_MAX_NNZ = 200_000


class _RoundedSVR:
    """LinearSVR (epsilon-insensitive, liblinear's dual) on the ratings minus their training
    mean (liblinear regularises the intercept); the rating is the output rounded and clipped
    to the training range, the score the output itself."""

    def __init__(self, C: float):
        self.C = C

    def fit(self, X, y):
        from sklearn.svm import LinearSVR

        self.mean_, self.lo_, self.hi_ = float(np.mean(y)), int(y.min()), int(y.max())
        self.model_ = LinearSVR(C=self.C, epsilon=SVR_EPSILON, dual=True,
                                max_iter=5000).fit(X, y - self.mean_)
        return self

    def predict_score(self, X):
        return self.model_.predict(X) + self.mean_

    def predict(self, X):
        return np.clip(np.rint(self.predict_score(X)), self.lo_, self.hi_).astype(np.int64)


class _LogisticAT:
    """mord's LogisticAT (all-threshold ordinal logistic regression) on the training ratings
    numbered 0..K-1 in order (it needs contiguous labels; a rating absent from the training
    events is skipped over); score: the expected rating under the model."""

    def __init__(self, C: float):
        self.C = C

    def fit(self, X, y):
        import mord

        self.classes_ = np.unique(y)
        with warnings.catch_warnings():   # mord passes scipy's deprecated ``disp`` option
            warnings.filterwarnings("ignore", category=DeprecationWarning,
                                    message=".*L-BFGS-B.*")
            self.model_ = mord.LogisticAT(alpha=1.0 / self.C).fit(
                X, np.searchsorted(self.classes_, y))
        return self

    def predict_score(self, X):
        return self.model_.predict_proba(X) @ self.classes_.astype(np.float64)

    def predict(self, X):
        return self.classes_[np.clip(self.model_.predict(X), 0, len(self.classes_) - 1)]


ESTIMATORS = {"LinearSVR": _RoundedSVR, "LogisticAT": _LogisticAT}


class TunedLinearOrdinal:
    """The ``"linear_ordinal"`` challenger: LinearSVR (rounded) or LogisticAT, whichever does
    better on a validation split of the training events.

    ``fit`` carves a validation part out of the events by a stable hash of ``ids``
    (:func:`~pipeline.training.tuning.validation_mask`, ``seed + 1``), fits both
    estimators at every C of ``ORDINAL_C`` on the rest, scores each by ``metric`` on the
    validation part, and refits the best on all events. With ``warm`` (a previous
    ``warm_state()``) it tries only the last estimator, at the last C and its neighbours. Only
    the columns with a non-zero in the training events enter (the hashed text space is 2**20
    wide; its used columns are the vocabulary). LogisticAT is skipped without mord or above
    ``LOGISTIC_AT_MAX_NNZ``; without validation events the fit is at ``ORDINAL_DEFAULT``; with
    one training rating every prediction is that rating. ``tried_`` says which.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 3)); y = np.digitize(X[:, 0], [-0.5, 0.5]) + 1
    >>> model = TunedLinearOrdinal(metric="mae", higher_is_better=False).fit(X, y)
    >>> len(model.tried_), float(np.mean(model.predict(X) == y)) > 0.8
    (6, True)
    """

    def __init__(self, *, metric: str = "mae", higher_is_better: bool = False, seed: int = 0,
                 warm: dict | None = None):
        self.metric, self.higher_is_better = metric, higher_is_better
        self.seed, self.warm = seed, warm

    def settings(self) -> list[dict]:
        if self.warm and "C" in self.warm and str(self.warm.get("estimator")) in ESTIMATORS:
            return [{"estimator": str(self.warm["estimator"]), "C": C}
                    for C in neighbours(ORDINAL_C, float(self.warm["C"]))]
        return [{"estimator": name, "C": C} for name in ESTIMATORS for C in ORDINAL_C]

    def _logistic_at_refused(self, nnz: int) -> str | None:
        try:
            import mord  # noqa: F401
        except ImportError:
            return "mord is not installed"
        if nnz > LOGISTIC_AT_MAX_NNZ:
            return (f"{nnz} non-zeros in the tuning events > LOGISTIC_AT_MAX_NNZ = "
                    f"{LOGISTIC_AT_MAX_NNZ} (L-BFGS over every pass would take minutes)")
        return None

    def fit(self, X, y, ids=None):
        from scipy.sparse import csr_matrix

        X = csr_matrix(X)
        y = np.asarray(y).astype(np.int64)
        ids = np.arange(len(y)) if ids is None else np.asarray(ids)
        self.columns_ = np.unique(X.indices)
        Xc = X[:, self.columns_]
        Xc.indices = Xc.indices.astype(np.int32)   # liblinear refuses int64 indices
        Xc.indptr = Xc.indptr.astype(np.int32)
        self.model_, self.best_, self.constant_ = None, None, None
        if len(np.unique(y)) < 2:
            self.constant_ = int(y[0]) if len(y) else 0
            self.tried_ = [skipped(ORDINAL_DEFAULT, f"training events have one rating "
                                   f"({len(y)} events): it is every prediction")]
            return self
        val = validation_mask(ids, self.seed)
        tune = ~val
        settings, self.tried_ = [], []
        refused = self._logistic_at_refused(int(Xc[tune].nnz))
        for params in self.settings():
            if params["estimator"] == "LogisticAT" and refused:
                self.tried_.append(skipped(params, refused))
            else:
                settings.append(params)
        if not val.any() or len(np.unique(y[tune])) < 2:
            self.best_ = dict(ORDINAL_DEFAULT)
            self.tried_ = [skipped(self.best_, f"{int(val.sum())} validation events, "
                                   f"{len(np.unique(y[tune]))} ratings in the rest: fitted at "
                                   "the default")]
        else:
            def score(model):
                Xv = Xc[val]
                return ordinal_metrics(y[val], model.predict(Xv),
                                       model.predict_score(Xv)).get(self.metric)

            self.best_, tried = grid_search(
                settings, lambda p: ESTIMATORS[p["estimator"]](p["C"]).fit(Xc[tune], y[tune]),
                score, self.higher_is_better)
            self.tried_ = tried + self.tried_
            self.best_ = self.best_ or dict(ORDINAL_DEFAULT)
        # the final fit's warnings (no convergence) reach the run's log as the model's do
        self.model_ = ESTIMATORS[self.best_["estimator"]](self.best_["C"]).fit(Xc, y)
        return self

    def _rows(self, X):
        from scipy.sparse import csr_matrix

        return csr_matrix(X)[:, self.columns_]

    def predict(self, X):
        if self.model_ is None:
            return np.full(X.shape[0], self.constant_, dtype=np.int64)
        return self.model_.predict(self._rows(X))

    def predict_score(self, X):
        if self.model_ is None:
            return np.full(X.shape[0], float(self.constant_))
        return self.model_.predict_score(self._rows(X))

    def warm_state(self) -> dict:
        if self.best_ is None:
            return {}
        return {"estimator": np.array(self.best_["estimator"]),
                "C": np.array(float(self.best_["C"]))}


def ordinal_metrics(y, ratings, scores) -> dict:
    """MAE, MSE and accuracy of predicted ``ratings``, and the NDCG of ``scores`` (gain = the
    true rating) over the whole list; {} for an empty list."""
    from solvers import metrics

    if len(y) == 0:
        return {}
    return {"mae": metrics.mae(y, ratings), "mse": metrics.mse(y, ratings),
            "accuracy": metrics.accuracy(y, ratings),
            "rating_ndcg": metrics.rating_ndcg(y, scores)}


def metric_score(metric: str):
    """``score(fitted, X, y)``: ``metric`` of a fitted model's ratings and scores on rows."""
    def score(fitted, X, y):
        return ordinal_metrics(y, fitted.predict(X), fitted.predict_score(X)).get(metric)
    return score


class NPSVORTrainer(Trainer):
    id_maps = ()    # instance ids are hashes of event ids: nothing to extend

    def build(self, store, cfg, previous: dict | None) -> tuple[dict, dict]:
        ev, param = cfg.evaluation, lambda name: self.family.dataset_param(cfg.params, name)
        data = ordinal(
            store, window=cfg.window, test_fraction=float(ev["fraction"]), seed=int(ev["seed"]),
            n_features=int(previous["n_features"]) if previous and "n_features" in previous
            else None, max_features=int(param("max_features")),
            text_features=int(param("text_features")), levels=int(param("levels")))
        return data.to_arrays(), {"window": data.window.describe(), "stats": data.stats,
                                  "n_train": int((~data.test_mask).sum())}

    # ------------------------------------------------------------------ fitting

    def fit_model(self, model, arrays: dict, warm: dict | None, cfg) -> dict:
        """Fit on the training events, the duals of events seen before taken over by id;
        with a ``tune`` table, at the C1 and loss chosen on a validation part of them
        (:mod:`.npsvor_tuning`), or the last run's choice while the data grew little."""
        data = OrdinalData.from_arrays(arrays)
        train = ~data.test_mask
        X, y, ids = data.X[train], data.y[train], data.ids[train]
        learned = {}
        if cfg.tune:
            learned["tuning"] = npsvor_tuning.tune(
                model, X, y, ids, cfg, metric_score(cfg.metric),
                self.family.higher_is_better(cfg.metric), warm)
        model.fit(X, y, ids=ids, warm_start=warm)
        return learned

    def fit_info(self, model, learned: dict) -> dict:
        info = {"converged": model.converged_,
                "n_iter_per_rank": [int(n) for n in model.n_iter_per_rank_],
                "rank_seconds_max": float(np.max(model.rank_fit_seconds_)),
                "C1": float(model.C1), "loss": model.loss}
        tuning = learned.get("tuning")
        if tuning is not None:
            info["tuning"] = {**{k: tuning[k] for k in ("source", "choice", "tried")},
                              "validation": tuning["validation"],
                              "seconds": round(tuning["seconds"], 3)}
        return info

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, model, arrays: dict, cfg) -> dict:
        data = OrdinalData.from_arrays(arrays)
        test = data.test_mask
        if not test.any():
            return {}
        X = data.X[test]
        return ordinal_metrics(data.y[test], model.predict(X), model.predict_score(X))

    def holdout_unit(self, arrays: dict, cfg) -> str | None:
        return "events" if cfg.metric == "mae" else None

    def per_unit_holdout(self, candidate, arrays: dict, cfg) -> np.ndarray:
        """Each held-out event's absolute error of ``candidate``'s rating: a fitted model's,
        or one continuous rating per event, rounded (as :meth:`baselines` scores them)."""
        data = OrdinalData.from_arrays(arrays)
        test = data.test_mask
        ratings = (np.rint(candidate[test]) if isinstance(candidate, np.ndarray)
                   else candidate.predict(data.X[test]))
        return np.abs(data.y[test] - ratings).astype(np.float64)

    def baselines(self, arrays: dict, cfg) -> dict:
        """Constant ratings from the training events, ``majority`` (the most frequent rating),
        ``mean`` (the mean rating, rounded) and ``median`` (the lower median: the constant of
        least training MAE), and ``best_feature`` (see :meth:`best_feature`), each scored on
        the held-out events like the model. Returns {name: (metrics, one continuous predicted
        rating per event; :meth:`trivial_artifact` publishes each item's latest)}."""
        y, test = arrays["y"], arrays["test_mask"]
        train = ~test
        if not train.any():
            return {}
        ytr, yte = y[train], y[test]
        lowest = int(ytr.min())
        constants = {"majority": lowest + int(np.argmax(np.bincount(ytr - lowest))),
                     "mean": int(np.floor(ytr.mean() + 0.5)),
                     "median": int(np.sort(ytr)[(len(ytr) - 1) // 2])}
        out = {}
        for name, rating in constants.items():
            same = np.full(len(yte), float(rating))
            out[name] = (ordinal_metrics(yte, same, same),
                         np.full(len(y), rating, dtype=np.float32))
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

        data = OrdinalData.from_arrays(arrays)
        X, y, test = data.X, data.y.astype(np.float64), data.test_mask
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
        found["column"] = (f"feature {j}" if j < data.n_features
                           else f"hashed text column {j - data.n_features}")
        return found, scores.astype(np.float32)

    # ------------------------------------------------------------------ publishing

    def item_ids(self, arrays: dict):
        return arrays["item_ids"][arrays["row_item"][arrays["latest"]]]

    def artifact(self, model, arrays: dict, cfg, **describe):
        """Every item's predicted rating from its latest event, the list ranked by
        ``predict_score``, and the model (weights over the columns it uses) for lookups that
        rate or rank new items from their features or text."""
        from pipeline.serving.artifact import ModelArtifact
        from pipeline.serving.scorers import Scorer

        data = OrdinalData.from_arrays(arrays)
        X = data.X[data.latest]
        scorer = Scorer.of(model, n_features=data.n_features, text_features=data.text_features)
        return ModelArtifact.predicted_ratings(
            item_ids=self.item_ids(arrays), ratings=model.predict(X),
            scores=model.predict_score(X), scorer=scorer, algorithm=self.family.name,
            **describe)

    def trivial_artifact(self, scores, arrays: dict, **describe):
        """A trivial model as predicted ratings: its continuous rating of each item's latest
        event, rounded."""
        from pipeline.serving.artifact import ModelArtifact

        scores = np.asarray(scores)[arrays["latest"]]
        y = arrays["y"][~arrays["test_mask"]]
        ratings = np.clip(np.rint(scores), y.min(), y.max()) if len(y) else np.rint(scores)
        return ModelArtifact.predicted_ratings(item_ids=self.item_ids(arrays), ratings=ratings,
                                               scores=scores, **describe)

    def checkpoint(self, fitted, arrays: dict) -> dict:
        """The warm state (duals per event hash and rank), the numeric feature width, which
        the next run keeps (the text columns start after it), and the tuner's choice."""
        tuning = fitted.learned.get("tuning")
        tuned = npsvor_tuning.checkpoint_arrays(tuning) if tuning else {}
        return {**super().checkpoint(fitted, arrays), "n_features": arrays["n_features"],
                **{WARM_PREFIX + k: v for k, v in tuned.items()}}

    # ------------------------------------------------------------------ challenger

    def challenger(self, fitted, arrays: dict, cfg, warm: dict | None) -> Challenger:
        """``"linear_ordinal"``: :class:`TunedLinearOrdinal` on the training events (validation
        split by the event hash), scored on the held-out events like the model; published as
        predicted ratings (each item's rating and score from its latest event) *without a
        scorer*: the ``ordinal_linear`` scorer rebuilds an NPSVOR (p hyperplanes and its
        r_new/r_old rule), which neither LinearSVR's single rounded hyperplane nor
        LogisticAT's thresholds are, so a version served by this challenger answers its lists
        but refuses on-demand ``rate``/``rank`` lookups (as any version without a scorer)."""
        from pipeline.serving.artifact import ModelArtifact

        started = time.perf_counter()
        data = OrdinalData.from_arrays(arrays)
        X, y, test = data.X, data.y, data.test_mask
        train = ~test
        tuned = TunedLinearOrdinal(
            metric=cfg.metric, higher_is_better=self.family.higher_is_better(cfg.metric),
            seed=int(cfg.evaluation["seed"]), warm=warm,
        ).fit(X[train], y[train], ids=data.ids[train])
        metrics = {}
        if test.any():
            Xt = X[test]
            metrics = ordinal_metrics(y[test], tuned.predict(Xt), tuned.predict_score(Xt))
        latest = X[data.latest]
        artifact = ModelArtifact.predicted_ratings(
            item_ids=self.item_ids(arrays), ratings=tuned.predict(latest),
            scores=tuned.predict_score(latest))
        return Challenger(name="linear_ordinal", metrics=metrics, artifact=artifact,
                          tried=tuned.tried_, fit_seconds=time.perf_counter() - started,
                          warm=tuned.warm_state(), evaluated=tuned.predict(X))
