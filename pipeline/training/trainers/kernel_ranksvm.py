"""Kernel RankSVM's trainer: judgment events -> per-query rows -> KernelRankSVM -> every known
query's docs ranked, plus the support set for scoring new candidates on demand.

Dataset (:func:`pipeline.training.datasets.judgments`): one row per judged (query, doc), the
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
only come last); the scorer is :meth:`pipeline.serving.scorers.Scorer.kernel` (support vectors,
β, kernel), so ``TopK.rank`` scores candidates exactly as ``decision_function`` does.
"""

from __future__ import annotations

import numpy as np

from pipeline.training import datasets
from pipeline.training.trainers import Trainer, idmap

MAX_BASELINE_FEATURES = 50   # single features tried as the trivial ranker (both signs)


def feature_matrix(arrays: dict):
    """The dataset's features as a CSR matrix (rows as ``arrays["label"]``)."""
    from scipy.sparse import csr_matrix

    return csr_matrix((arrays["X_data"], arrays["X_indices"], arrays["X_indptr"]),
                      shape=tuple(arrays["X_shape"]))


def query_metrics(query, label, scores, k: int) -> dict:
    """The family's metrics of ``scores`` on the rows of some queries; {} when no query there
    has two docs of different labels (nothing a ranker can get right or wrong)."""
    from solvers.metrics import query_average_precision, query_ndcg, query_pairwise_accuracy

    if len(query) == 0 or datasets.queries_with_pairs(query, label) == 0:
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


class KernelRankSVMTrainer(Trainer):
    id_maps = ("query_ids", "doc_ids")

    def build(self, store, cfg, previous: dict | None) -> tuple[dict, dict]:
        ev = cfg.evaluation
        n_features = int(previous["n_features"]) if previous and "n_features" in previous \
            else None
        data = datasets.judgments(
            store, window=cfg.window, queries=idmap(previous, "query_ids"),
            docs=idmap(previous, "doc_ids"), test_fraction=float(ev["fraction"]),
            seed=int(ev["seed"]), n_features=n_features,
            max_features=int(self.family.dataset_param(cfg.params, "max_features")))
        X = data.X
        arrays = {"query_ids": data.queries.ids, "doc_ids": data.docs.ids,
                  "X_data": X.data, "X_indices": X.indices, "X_indptr": X.indptr,
                  "X_shape": np.array(X.shape), "label": data.label, "query": data.query,
                  "doc": data.doc, "instance": data.instance, "test_mask": data.test_mask}
        return arrays, {"window": data.window.describe(), "stats": data.stats,
                        "n_train": int((~data.test_mask).sum())}

    # ------------------------------------------------------------------ fitting

    def fit_model(self, model, arrays: dict, warm: dict | None, cfg) -> None:
        train = ~arrays["test_mask"]
        query, label = arrays["query"][train], arrays["label"][train]
        if datasets.queries_with_pairs(query, label) == 0:
            held = np.unique(arrays["query"][~train]).size
            raise ValueError(
                f"no query of the training split has two docs with different labels: "
                f"{np.unique(query).size} training queries, {int(train.sum())} judgments "
                f"({held} more queries held out for evaluation); a ranker learns from docs of "
                "different relevance judged for the same query")
        X = feature_matrix(arrays)[train].toarray()
        model.fit(X, label, query, ids=arrays["instance"][train], warm_start=warm)

    def fit_info(self, model) -> dict:
        return {"n_pairs": int(model.n_pairs_), "n_support": int(len(model.dual_coef_)),
                "n_cg_iter": int(model.n_cg_iter_), "objective": float(model.objective_),
                "converged": bool(model.converged_)}

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, model, arrays: dict, cfg) -> dict:
        test = arrays["test_mask"]
        if not test.any():
            return {}
        scores = model.decision_function(feature_matrix(arrays)[test].toarray())
        return query_metrics(arrays["query"][test], arrays["label"][test], scores,
                             int(cfg.evaluation["k"]))

    def baselines(self, arrays: dict, cfg) -> dict:
        """``best_feature``: the single feature, with its sign, whose values rank the training
        queries' docs best by the gate metric (among the MAX_BASELINE_FEATURES of largest
        within-query correlation with the label), scored on the held-out queries."""
        X, test = feature_matrix(arrays).toarray(), arrays["test_mask"]
        train, k = ~test, int(cfg.evaluation["k"])
        query, label = arrays["query"], arrays["label"].astype(np.float64)
        if datasets.queries_with_pairs(query[train], label[train]) == 0 or X.shape[1] == 0:
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

        scores = model.decision_function(feature_matrix(arrays).toarray())
        return self._query_docs(arrays, scores, scorer=Scorer.kernel(model),
                                algorithm=self.family.name, **describe)

    def trivial_artifact(self, scores, arrays: dict, **describe):
        """The best feature's ranking of every query's docs (no on-demand scorer)."""
        return self._query_docs(arrays, np.asarray(scores, dtype=np.float64), **describe)

    def item_ids(self, arrays: dict):
        return arrays["doc_ids"][arrays["doc"]]

    def checkpoint(self, model, arrays: dict) -> dict:
        """The id maps, β keyed by instance id and the feature width (kept by the next run)."""
        return {**super().checkpoint(model, arrays),
                "n_features": np.array(int(arrays["X_shape"][1]))}
