"""Models that score candidates given in a request, as published with a version.

A lookup that re-ranks a search stack's candidates, or rates a new item from its text, cannot
use precomputed lists: it needs the model itself. Two kinds, each rebuilt as the solver's own
estimator holding only what prediction reads, so serving computes what the trainer evaluated:

``ordinal_linear`` (NPSVOR)
    p hyperplanes f_k(x) = w_kᵀx + b_k over ``[features | text]`` rows
    (:func:`pipeline.features.feature_rows`). Only the columns with a non-zero weight are
    stored (their indices and a float32 p x c block), so a 2**20-column text model costs what
    its vocabulary costs. Rating: ``NPSVOR.predict`` (r_new or r_old); score:
    ``NPSVOR.predict_score`` (the rating made continuous).
``kernel`` (KernelRankSVM)
    Support vectors (float32 s x m), their β and the kernel; score Σ_s β_s K(x_s, x).

On the wire a scorer is an ``.npz`` (read with ``allow_pickle=False``) whose ``params`` entry is
a JSON object as UTF-8 bytes.

Examples
--------
>>> import numpy as np
>>> from solvers import NPSVOR
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(200, 3)); y = np.digitize(X[:, 0], [-0.5, 0.5]) + 1
>>> s = Scorer.ordinal(NPSVOR(random_state=0).fit(X, y), n_features=3)
>>> s = Scorer.from_bytes(s.to_bytes(), "example")
>>> rows = s.rows([{"0": 2.0}, [-2.0, 0.0, 0.0]])
>>> s.predict_rating(rows).tolist()
[3, 1]
"""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import scipy.sparse as sp

from pipeline.features import feature_rows
from pipeline.ingest.validate import check_features
from pipeline.serving.layout import LayoutError

__all__ = ["Scorer"]

KINDS = ("ordinal_linear", "kernel")


class Scorer:
    """An on-demand scoring model: ``kind``, JSON ``params`` and named arrays."""

    def __init__(self, kind: str, params: dict, arrays: dict):
        if kind not in KINDS:
            raise ValueError(f"scorer kind is {kind!r}, expected one of {KINDS}")
        self.kind, self.params, self.arrays = kind, dict(params), dict(arrays)
        self._model = None

    # ------------------------------------------------------------------ from a fitted model
    @classmethod
    def ordinal(cls, model, n_features: int, text_features: int = 0) -> Scorer:
        """From a fitted ``solvers.NPSVOR`` trained on ``feature_rows(..., n_features,
        text_features=...)`` rows."""
        coef = np.asarray(model.coef_)
        expected = int(n_features) + int(text_features)
        if coef.shape[1] != expected:
            raise ValueError(f"the model has {coef.shape[1]} features, n_features + "
                             f"text_features is {expected}")
        columns = np.flatnonzero((coef != 0).any(axis=0)).astype(np.int64)
        return cls("ordinal_linear",
                   {"n_features": int(n_features), "text_features": int(text_features),
                    "predictor": model.predictor},
                   {"columns": columns, "coef": coef[:, columns].astype(np.float32),
                    "intercept": np.asarray(model.intercept_, dtype=np.float64),
                    "classes": np.asarray(model.classes_, dtype=np.int64)})

    @classmethod
    def kernel(cls, model) -> Scorer:
        """From a fitted ``solvers.KernelRankSVM`` (only its support instances)."""
        return cls("kernel",
                   {"n_features": int(model.n_features_in_), "text_features": 0,
                    "kernel": model.kernel, "gamma": float(model.gamma_),
                    "degree": int(model.degree), "coef0": float(model.coef0)},
                   {"support_vectors": np.asarray(model.support_vectors_, dtype=np.float32),
                    "dual_coef": np.asarray(model.dual_coef_, dtype=np.float64)})

    # ------------------------------------------------------------------ wire format
    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        params = np.frombuffer(json.dumps({"kind": self.kind, **self.params}).encode(),
                               dtype=np.uint8)
        np.savez(buf, params=params, **self.arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> Scorer:
        """Decode :meth:`to_bytes`; :class:`LayoutError` naming ``where`` if it is not one."""
        try:
            with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in npz.files}
            params = json.loads(arrays.pop("params").tobytes().decode())
            return cls(params.pop("kind"), params, arrays)
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as err:
            raise LayoutError(f"{where} does not hold a scorer ({type(err).__name__}: "
                              f"{err})") from None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    # ------------------------------------------------------------------ scoring
    def rows(self, candidates) -> sp.csr_matrix:
        """Feature rows of candidates, each a features list or ``{index: value}`` map (as in
        events), a text (str), or ``{"features": ..., "text": ...}``; a bad one raises
        ``ValueError`` naming it."""
        dense = self._dense_rows(candidates)
        if dense is not None:
            return dense
        indices, values, texts = [], [], []
        for n, c in enumerate(candidates):
            features, text = c, None
            if isinstance(c, str):
                features, text = None, c
            elif isinstance(c, dict) and ("features" in c or "text" in c):
                features, text = c.get("features"), c.get("text")
            if text is not None and not self.params["text_features"]:
                raise ValueError(f"candidate {n} has text; this model takes no text")
            ix, vs = self._features(n, features)
            indices.append(ix)
            values.append(vs)
            texts.append(text)
        return feature_rows(indices, values, self.params["n_features"], texts,
                            self.params["text_features"])[0]

    def _dense_rows(self, candidates):
        """The rows at once when every candidate is a features list (or 1-D array) of finite
        numbers, all of one length ≤ n_features (a search stack's re-ranking call), else None
        (each candidate then goes through :meth:`_features`)."""
        if not candidates or self.params["text_features"] or not all(
                isinstance(c, (list, np.ndarray)) for c in candidates):
            return None
        try:
            X = np.asarray(candidates, dtype=np.float32)
        except (TypeError, ValueError):
            return None
        if X.ndim != 2 or X.shape[1] > self.params["n_features"] or not np.isfinite(X).all():
            return None
        X = sp.csr_matrix(X)
        X.resize((X.shape[0], self.params["n_features"]))
        return X

    def _features(self, n: int, features):
        """(indices, values) of one candidate's features; a dense list or array of finite
        numbers takes a vectorised path, anything else (or a bad value, for the message that
        names it) the event validator's."""
        if features is None:
            return None, None
        if isinstance(features, (list, np.ndarray)):
            try:
                values = np.asarray(features, dtype=np.float64)
            except (TypeError, ValueError):
                values = None
            if values is not None and values.ndim == 1 and np.isfinite(values).all() \
                    and values.size <= self.params["n_features"]:
                return np.arange(values.size), values
            features = features.tolist() if isinstance(features, np.ndarray) else features
        return check_features(f"candidate {n}", features, self.params["n_features"] - 1)

    def score(self, X) -> np.ndarray:
        """Ranking score per row (higher is better)."""
        if self.kind == "kernel":
            return self._estimator().decision_function(X.toarray() if sp.issparse(X) else X)
        return self._estimator().predict_score(self._columns(X))

    def predict_rating(self, X) -> np.ndarray:
        if self.kind != "ordinal_linear":
            raise ValueError(f"a {self.kind} scorer predicts no rating")
        return self._estimator().predict(self._columns(X))

    def _columns(self, X):
        return sp.csr_matrix(X)[:, self.arrays["columns"]]

    def _estimator(self):
        """The solver's estimator with only the fitted attributes prediction reads: the one
        whose ``scorer_kind`` is this scorer's kind rebuilds itself (``from_scorer``)."""
        if self._model is None:
            from solvers import scorer_estimator

            self._model = scorer_estimator(self.kind).from_scorer(self.params, self.arrays)
        return self._model
