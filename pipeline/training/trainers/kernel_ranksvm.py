"""Kernel RankSVM's trainer: judgment events -> per-query rows -> KernelRankSVM -> every known
query's docs ranked, plus the support set for scoring new candidates on demand.

Dataset (:func:`judgments`): one row per judged (query, doc), the
latest judgment winning; stable instance ids ``query index · 2**32 + doc index`` key β, so a
retrain warm-starts from the β of every (query, doc) it kept (new ones start at 0). Whole
queries are held out by a stable hash of the query.

Evaluation on the held-out queries (:mod:`solvers.metrics`): NDCG@k with LETOR's gain
2^label − 1 and discount 1/log2(max(2, r)); queries without a relevant doc (label > 0) count
as 0 in ``ndcg@k`` and ``map`` (LETOR's convention, so the numbers compare with LETOR's
tables) and are left out of ``ndcg_relevant@k``; ``pairwise_accuracy`` over the held-out
within-query pairs (ties count as errors). The trivial model the gate compares with is the best
single feature: the feature and sign that rank the *training* queries best by the gate metric,
scored on the held-out ones.

Artifact (``query_docs``): per query in the window, its judged docs with the model's scores
(published as the query's list, ranked); the fallback list for unknown queries ranks docs by
their mean model score over the queries they were judged for (docs known from earlier windows
only come last); the scorer is :meth:`pipeline.serving.scorers.Scorer.of` the model (support
vectors, β, kernel), so ``TopK.rank`` scores candidates exactly as ``decision_function`` does.

Challenger ``"linear"`` (:class:`TunedLinearRankSVM`): the same solver with a linear kernel, C
tuned over ``LINEAR_C_FACTORS`` times the config's C on a validation part of the training
queries; published the same way, its scorer collapsed to the one weight vector w = Σ β_s x_s.
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
from pipeline.training.tuning import grid_search, neighbours, skipped, validation_mask

MAX_BASELINE_FEATURES = 50   # single features tried as the trivial ranker (both signs)

# the linear challenger's grid: the config's C times these (4 fits; the model itself is not
# tuned). The loss is summed over pairs and xᵀx' of m standardised features is ~m times an rbf
# kernel value (≤ 1), so a linear ranker's best C sits lower than an rbf's: the grid reaches
# two decades below. A warm run tries the last C and its neighbours (at most 3 fits)
LINEAR_C_FACTORS = (0.01, 0.1, 1.0, 10.0)
# config parameters the linear challenger does not take over from the model's
LINEAR_DROPPED = ("C", "kernel", "gamma", "degree", "coef0", "keep_gram", "verbose")


@dataclass
class JudgmentData:
    """Kernel RankSVM's inputs: one row per judged (query, doc), the latest judgment of it.

    ``instance`` is the row's stable instance id ``query index · 2**32 + doc index`` (indices of
    the extended-never-renumbered id maps), which keys β for warm starts; ``test_mask`` marks
    the rows of held-out queries."""

    queries: IdMap | None
    docs: IdMap | None
    X: object                         # scipy.sparse.csr_matrix (rows, n_features)
    label: np.ndarray                 # int32 relevance grades >= 0
    query: np.ndarray                 # query index of each row
    doc: np.ndarray                   # doc index of each row
    instance: np.ndarray              # int64 stable instance id
    test_mask: np.ndarray
    window: Window | None
    stats: dict = field(default_factory=dict)

    def to_arrays(self) -> dict:
        """The dataset bundle's arrays: the id maps, X (:func:`csr_to_arrays`), ``label``,
        ``query``, ``doc``, ``instance`` and ``test_mask``."""
        return {"query_ids": self.queries.ids, "doc_ids": self.docs.ids,
                **csr_to_arrays(self.X), "label": self.label, "query": self.query,
                "doc": self.doc, "instance": self.instance, "test_mask": self.test_mask}

    @classmethod
    def from_arrays(cls, arrays: dict) -> JudgmentData:
        """The dataset of a bundle's arrays (no id maps, window or stats: the arrays keep
        ``query_ids`` and ``doc_ids`` as they are)."""
        return cls(queries=None, docs=None, X=csr_from_arrays(arrays), label=arrays["label"],
                   query=arrays["query"], doc=arrays["doc"], instance=arrays["instance"],
                   test_mask=arrays["test_mask"], window=None)


def instance_ids(query: np.ndarray, doc: np.ndarray) -> np.ndarray:
    """Stable id of a (query index, doc index) pair: ``query · 2**32 + doc`` (int64).

    >>> instance_ids(np.array([0, 2]), np.array([5, 1])).tolist()
    [5, 8589934593]
    """
    return query.astype(np.int64) * np.int64(2**32) + doc.astype(np.int64)


def judgments(store: EventStore, *, window=None, queries: IdMap | None = None,
              docs: IdMap | None = None, test_fraction: float = 0.2, seed: int = 0,
              n_features: int | None = None, max_features: int = 1024) -> JudgmentData:
    """Kernel RankSVM inputs from judgment events.

    One row per (query, doc): a judgment re-sent for the same pair replaces the earlier one
    (the latest by ts, then offset, wins; ``stats["replaced"]`` counts them). The held-out
    split is by *query*: a stable hash of the query index puts a ``test_fraction`` of the
    queries, with all their docs, in the test set, so a query stays on its side as data grows
    and the evaluation measures ranking for queries the model never saw.

    Features are the events' (sparse or dense) features; the width is the highest index + 1,
    at least ``n_features`` (the previous run's, so the width never shrinks) and at most
    ``max_features``: feature values of a higher index are left out and counted (the kernel
    works on dense rows, so a stray index 10**6 must not make X 10**6 wide).
    """
    columns = {"judgment": ["ts", "offset", "query", "doc", "label", "feature_index",
                            "feature_value"]}
    tables, win = window_tables(store, ["judgment"], window or {}, columns, key="query")
    t = tables["judgment"]
    queries, q = id_indices(queries or IdMap(), t.column("query"))
    docs, d = id_indices(docs or IdMap(), t.column("doc"))
    instance = instance_ids(q, d)
    keep = latest_per_key(instance, t.column("ts").to_numpy(), t.column("offset").to_numpy())
    t = t.take(pa.array(keep))
    X = features_csr(t, max_features=max_features)
    stored = int(pc.sum(pc.list_value_length(t.column("feature_index"))).as_py() or 0)
    width = min(max(X.shape[1], n_features or 0), max_features)
    if X.shape[1] < width:
        X.resize((X.shape[0], width))
    label = t.column("label").to_numpy().astype(np.int32)
    q, d, instance = q[keep], d[keep], instance[keep]
    test = stable_split(q, test_fraction, seed) if test_fraction > 0 else \
        np.zeros(len(q), bool)
    stats = {"judgments": int(len(q)), "replaced": int(win.n_events - len(q)),
             "queries": int(np.unique(q).size), "test_queries": int(np.unique(q[test]).size),
             "docs": int(np.unique(d).size), "test": int(test.sum()),
             "train_queries_with_pairs": queries_with_pairs(q[~test], label[~test]),
             "features": int(X.shape[1]), "feature_values_over_max_features": stored - X.nnz}
    return JudgmentData(queries=queries, docs=docs, X=X.tocsr(), label=label, query=q, doc=d,
                        instance=instance, test_mask=test, window=win, stats=stats)


def queries_with_pairs(query: np.ndarray, label: np.ndarray) -> int:
    """How many queries have two docs with different labels (at least one preference pair).

    >>> queries_with_pairs(np.array([0, 0, 1, 1, 2]), np.array([1, 0, 2, 2, 1]))
    1
    """
    if len(query) == 0:
        return 0
    pairs = np.unique(np.column_stack([query, label]), axis=0)
    _, levels = np.unique(pairs[:, 0], return_counts=True)
    return int((levels >= 2).sum())


def query_metrics(query, label, scores, k: int) -> dict:
    """The family's metrics of ``scores`` on the rows of some queries; {} when no query there
    has two docs of different labels (nothing a ranker can get right or wrong)."""
    from solvers.metrics import query_average_precision, query_ndcg, query_pairwise_accuracy

    if len(query) == 0 or queries_with_pairs(query, label) == 0:
        return {}
    out = {f"ndcg@{k}": query_ndcg(query, label, scores, k),
           f"ndcg_relevant@{k}": query_ndcg(query, label, scores, k, no_relevant="skip"),
           "map": query_average_precision(query, label, scores),
           "pairwise_accuracy": query_pairwise_accuracy(query, label, scores)}
    return {name: float(v) for name, v in out.items() if np.isfinite(v)}


def _within_query_correlation(X: np.ndarray, query: np.ndarray, label: np.ndarray):
    """Correlation of each column with the label after centering both within each query (what
    a single feature can say about the ranking inside a query)."""
    _, g = np.unique(query, return_inverse=True)
    counts = np.bincount(g).astype(np.float64)
    Xc = X - (np.stack([np.bincount(g, weights=X[:, j]) for j in range(X.shape[1])], 1)
              / counts[:, None])[g]
    yc = label - (np.bincount(g, weights=label) / counts)[g]
    norm = np.sqrt((Xc * Xc).sum(0) * (yc @ yc))
    return np.divide(Xc.T @ yc, norm, out=np.zeros(X.shape[1]), where=norm > 0)


class TunedLinearRankSVM:
    """The ``"linear"`` challenger: ``KernelRankSVM(kernel="linear")`` with the model's other
    solver parameters (loss, solver, tol, approximation...), C tuned on validation queries.

    ``fit`` holds out validation queries by a stable hash of the query index
    (:func:`~pipeline.training.tuning.validation_mask`, ``seed + 1``), fits C in
    ``C * LINEAR_C_FACTORS`` on the other queries (one estimator: Q is computed once and kept,
    β warm-started along the grid), scores each by ``metric`` on the validation queries, and
    refits at the best C on all queries (only Q's validation rows are new; β from the best
    C's fit). With ``warm`` (a previous ``warm_state()``) it tries the last C and its
    neighbours. Without a scorable validation query the fit is at the config's C; without a
    training pair every score is 0. ``tried_`` says which.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(400, 4)); query = np.repeat(np.arange(40), 10)
    >>> label = (X[:, 0] + 0.3 * rng.normal(size=400) > 0.5).astype(int)
    >>> model = TunedLinearRankSVM(params={"n_threads": 1}, metric="ndcg@10", k=10)
    >>> model = model.fit(X, label, query)
    >>> len(model.tried_), model.best_ in [t["params"] for t in model.tried_]
    (4, True)
    """

    def __init__(self, *, params: dict, metric: str, k: int, higher_is_better: bool = True,
                 seed: int = 0, warm: dict | None = None):
        self.params, self.metric, self.k = dict(params), metric, int(k)
        self.higher_is_better, self.seed, self.warm = higher_is_better, seed, warm

    def grid(self) -> tuple:
        C = float(self.params.get("C", 1.0))
        grid = tuple(C * f for f in LINEAR_C_FACTORS)
        return neighbours(grid, float(self.warm["C"])) if self.warm and "C" in self.warm \
            else grid

    def fit(self, X, label, query, ids=None):
        from solvers import KernelRankSVM

        X, label, query = np.asarray(X), np.asarray(label), np.asarray(query)
        ids = np.arange(len(label)) if ids is None else np.asarray(ids)
        default = {"C": float(self.params.get("C", 1.0))}
        self.model_, self.best_ = None, None
        if queries_with_pairs(query, label) == 0:
            self.tried_ = [skipped(default, "no training query has two docs of different "
                                   "labels: every score is 0")]
            return self
        model = KernelRankSVM(**{k: v for k, v in self.params.items()
                                 if k not in LINEAR_DROPPED}, kernel="linear", keep_gram=True)
        val = validation_mask(query, self.seed)
        tune = ~val
        with_pairs = (queries_with_pairs(query[tune], label[tune]),
                      queries_with_pairs(query[val], label[val]))
        states = {}
        if min(with_pairs) == 0:
            self.best_ = default
            self.tried_ = [skipped(default, f"queries with a pair: {with_pairs[0]} to fit, "
                                   f"{with_pairs[1]} to validate: fitted at the config's C")]
        else:
            def fit(params):
                last = states[list(states)[-1]] if states else None
                model.set_params(C=params["C"]).fit(X[tune], label[tune], query[tune],
                                                    ids=ids[tune], warm_start=last)
                states[params["C"]] = model.warm_state()
                return model

            def score(fitted):
                return query_metrics(query[val], label[val], fitted.decision_function(X[val]),
                                     self.k).get(self.metric)

            self.best_, self.tried_ = grid_search([{"C": C} for C in self.grid()], fit, score,
                                                  self.higher_is_better)
            self.best_ = self.best_ or default
        # the final fit's warnings (no convergence) reach the run's log as the model's do
        self.model_ = model.set_params(C=self.best_["C"]).fit(
            X, label, query, ids=ids, warm_start=states.get(self.best_["C"]))
        return self

    def decision_function(self, X):
        if self.model_ is None:
            return np.zeros(len(X))
        return self.model_.decision_function(X)

    def scorer(self):
        """The on-demand scorer, the support set collapsed to w = Σ β_s x_s (a linear kernel's
        Σ β_s x_sᵀx = wᵀx: one row instead of every support instance); None without a model."""
        from pipeline.serving.plugins import class_path
        from pipeline.serving.scorers import Scorer

        m = self.model_
        if m is None:
            return None
        w = np.asarray(m.dual_coef_) @ np.asarray(m.support_vectors_)
        return Scorer.linear(w, estimator=class_path(type(m)))

    def warm_state(self) -> dict:
        return {} if self.best_ is None else {"C": np.array(float(self.best_["C"]))}


class KernelRankSVMTrainer(Trainer):
    id_maps = ("query_ids", "doc_ids")

    def build(self, store, cfg, previous: dict | None) -> tuple[dict, dict]:
        ev = cfg.evaluation
        n_features = int(previous["n_features"]) if previous and "n_features" in previous \
            else None
        data = judgments(
            store, window=cfg.window, queries=idmap(previous, "query_ids"),
            docs=idmap(previous, "doc_ids"), test_fraction=float(ev["fraction"]),
            seed=int(ev["seed"]), n_features=n_features,
            max_features=int(self.family.dataset_param(cfg.params, "max_features")))
        return data.to_arrays(), {"window": data.window.describe(), "stats": data.stats,
                                  "n_train": int((~data.test_mask).sum())}

    # ------------------------------------------------------------------ fitting

    def fit_model(self, model, arrays: dict, warm: dict | None, cfg) -> None:
        data = JudgmentData.from_arrays(arrays)
        train = ~data.test_mask
        query, label = data.query[train], data.label[train]
        if queries_with_pairs(query, label) == 0:
            held = np.unique(data.query[~train]).size
            raise ValueError(
                f"no query of the training split has two docs with different labels: "
                f"{np.unique(query).size} training queries, {int(train.sum())} judgments "
                f"({held} more queries held out for evaluation); a ranker learns from docs of "
                "different relevance judged for the same query")
        X = data.X[train].toarray()
        model.fit(X, label, query, ids=data.instance[train], warm_start=warm)

    def fit_info(self, model, learned: dict) -> dict:
        return {"n_pairs": int(model.n_pairs_), "n_support": int(len(model.dual_coef_)),
                "n_cg_iter": int(model.n_cg_iter_), "objective": float(model.objective_),
                "converged": bool(model.converged_)}

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, model, arrays: dict, cfg) -> dict:
        data = JudgmentData.from_arrays(arrays)
        test = data.test_mask
        if not test.any():
            return {}
        scores = model.decision_function(data.X[test].toarray())
        return query_metrics(data.query[test], data.label[test], scores,
                             int(cfg.evaluation["k"]))

    def holdout_unit(self, arrays: dict, cfg) -> str | None:
        return "queries" if cfg.metric == f"ndcg@{int(cfg.evaluation['k'])}" else None

    def per_unit_holdout(self, candidate, arrays: dict, cfg) -> np.ndarray:
        """Each held-out query's NDCG@k (0 for a query with no relevant doc, as the mean
        counts it) of ``candidate``: a fitted ranker, or one score per row of the window."""
        from solvers.metrics import query_ndcg

        data = JudgmentData.from_arrays(arrays)
        test = data.test_mask
        if not test.any() or queries_with_pairs(data.query[test], data.label[test]) == 0:
            return np.zeros(0)
        scores = (candidate[test] if isinstance(candidate, np.ndarray)
                  else candidate.decision_function(data.X[test].toarray()))
        return query_ndcg(data.query[test], data.label[test], scores,
                          int(cfg.evaluation["k"]), per_query=True)[2]

    def baselines(self, arrays: dict, cfg) -> dict:
        """``best_feature``: the single feature, with its sign, whose values rank the training
        queries' docs best by the gate metric (among the MAX_BASELINE_FEATURES of largest
        within-query correlation with the label), scored on the held-out queries."""
        data = JudgmentData.from_arrays(arrays)
        X, test = data.X.toarray(), data.test_mask
        train, k = ~test, int(cfg.evaluation["k"])
        query, label = data.query, data.label.astype(np.float64)
        if queries_with_pairs(query[train], label[train]) == 0 or X.shape[1] == 0:
            return {}
        corr = _within_query_correlation(X[train], query[train], label[train])
        sign = 1.0 if self.family.higher_is_better(cfg.metric) else -1.0
        best, best_value = None, -np.inf
        for j in np.argsort(-np.abs(corr))[:MAX_BASELINE_FEATURES]:
            if corr[j] == 0:
                break   # the rest say nothing about the order inside a query
            for s in (1.0, -1.0):
                value = query_metrics(query[train], label[train], s * X[train, j],
                                      k).get(cfg.metric)
                if value is not None and sign * value > best_value:
                    best, best_value = (int(j), s), sign * value
        if best is None:
            return {}
        scores = best[1] * X[:, best[0]]
        found = query_metrics(query[test], label[test], scores[test], k)
        found.update(feature=best[0], sign=int(best[1]))
        return {"best_feature": (found, scores.astype(np.float32))}

    # ------------------------------------------------------------------ artifacts

    def _query_docs(self, arrays: dict, scores: np.ndarray, **kwargs):
        """Every query of the window with its docs and ``scores`` (one per row); the fallback
        ranks docs by their mean score over their judged rows (docs outside the window last)."""
        from pipeline.serving.artifact import ModelArtifact

        query, doc = arrays["query"], arrays["doc"]
        n_queries, n_docs = len(arrays["query_ids"]), len(arrays["doc_ids"])
        order = np.lexsort((doc, query))
        indptr = np.r_[0, np.cumsum(np.bincount(query, minlength=n_queries))]
        seen = np.bincount(doc, minlength=n_docs)
        mean = np.bincount(doc, weights=scores, minlength=n_docs) / np.maximum(seen, 1)
        floor = float(scores.min()) - 1.0 if len(scores) else 0.0
        fallback = np.where(seen > 0, mean, floor)
        return ModelArtifact.query_docs(query_ids=arrays["query_ids"],
                                        doc_ids=arrays["doc_ids"], indptr=indptr,
                                        docs=doc[order], scores=scores[order],
                                        fallback_scores=fallback, **kwargs)

    def artifact(self, model, arrays: dict, cfg, **describe):
        from pipeline.serving.scorers import Scorer

        scores = model.decision_function(csr_from_arrays(arrays).toarray())
        return self._query_docs(arrays, scores, scorer=Scorer.of(model),
                                algorithm=self.family.name, **describe)

    def trivial_artifact(self, scores, arrays: dict, **describe):
        """The best feature's ranking of every query's docs, and its scorer (the feature with
        its sign, a linear scorer: a query the run never saw is ranked by it too)."""

        scorer = feature_scorer(describe.get("metrics"), arrays)
        return self._query_docs(arrays, np.asarray(scores, dtype=np.float64), scorer=scorer,
                                **describe)

    def item_ids(self, arrays: dict):
        return arrays["doc_ids"][arrays["doc"]]

    def checkpoint(self, fitted, arrays: dict) -> dict:
        """The id maps, β keyed by instance id and the feature width (kept by the next run)."""
        return {**super().checkpoint(fitted, arrays),
                "n_features": np.array(int(arrays["X_shape"][1]))}

    # ------------------------------------------------------------------ challenger

    def challenger(self, fitted, arrays: dict, cfg, warm: dict | None) -> Challenger:
        """``"linear"``: :class:`TunedLinearRankSVM` on the training queries (validation by the
        query index), scored on the held-out queries like the model, published as query_docs
        with its (collapsed) linear scorer."""
        started = time.perf_counter()
        data = JudgmentData.from_arrays(arrays)
        X, test = data.X.toarray(), data.test_mask
        train, k = ~test, int(cfg.evaluation["k"])
        query, label = data.query, data.label
        tuned = TunedLinearRankSVM(
            params=self.family.estimator_params(cfg.params), metric=cfg.metric, k=k,
            higher_is_better=self.family.higher_is_better(cfg.metric),
            seed=int(cfg.evaluation["seed"]), warm=warm,
        ).fit(X[train], label[train], query[train], ids=data.instance[train])
        scores = tuned.decision_function(X)
        metrics = query_metrics(query[test], label[test], scores[test], k) if test.any() else {}
        artifact = self._query_docs(arrays, scores, scorer=tuned.scorer())
        return Challenger(name="linear", metrics=metrics, artifact=artifact, tried=tuned.tried_,
                          fit_seconds=time.perf_counter() - started, warm=tuned.warm_state(),
                          evaluated=scores)
