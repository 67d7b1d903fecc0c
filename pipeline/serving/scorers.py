"""Models that score candidates given in a request, as published with a version.

A lookup that re-ranks a search stack's candidates, or rates a new item from its text, cannot
use precomputed lists: it needs the model itself. A :class:`Scorer` is that model as plain
arrays, rebuilt at request time as the estimator that made it, holding only what prediction
reads, so serving computes what the trainer evaluated.

How a kind of scorer is stored and scored is a :class:`ScorerKind`, registered by name in
:data:`SCORER_KINDS`. The design, in two names a scorer records (in its ``params``):

``kind``
    Named by the estimator (its class attribute ``scorer_kind``) and looked up in
    :data:`SCORER_KINDS`: the shipped kinds are registered below, and a name of the form
    ``module:Class`` (a plugin's own :class:`ScorerKind` subclass) is imported and registered
    on first use, so a serving process needs no registration step for it.
``estimator``
    ``module:Class`` of the estimator that made it, imported at request time and asked to
    rebuild itself (``from_scorer``). A plugin family's estimator, which is no entry of
    ``solvers.ESTIMATORS``, is found the same way as a shipped one. (A scorer published
    before this field existed is rebuilt by the shipped estimator whose ``scorer_kind`` it
    is.)

Serving thus never asks the training registry (the layers import downwards only): the
published version says which code scores it.

``ordinal_linear`` (:class:`LinearRater`)
    p hyperplanes f_k(x) = w_kᵀx + b_k over ``[features | text]`` rows
    (:func:`pipeline.features.feature_rows`). Only the columns with a non-zero weight are
    stored (their indices and a float32 p x c block), so a 2**20-column text model costs what
    its vocabulary costs. Rating: the estimator's ``predict``; score: its ``predict_score``
    (the rating made continuous).
``kernel`` (:class:`KernelExpansion`)
    Support vectors (float32 s x m), their β and the kernel; score Σ_s β_s K(x_s, x).

On the wire a scorer is an ``.npz`` (read with ``allow_pickle=False``) whose ``params`` entry is
a JSON object as UTF-8 bytes.

Examples
--------
>>> import numpy as np
>>> from solvers import NPSVOR
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(200, 3)); y = np.digitize(X[:, 0], [-0.5, 0.5]) + 1
>>> s = Scorer.of(NPSVOR(random_state=0).fit(X, y), n_features=3)
>>> s = Scorer.from_bytes(s.to_bytes(), "example")
>>> s.kind, s.params["estimator"]
('ordinal_linear', 'solvers.npsvor:NPSVOR')
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
from pipeline.serving.layout import LayoutError
from pipeline.serving.plugins import add_entry, class_path, named_class, registered
from pipeline.value_checks import check_features

__all__ = ["SCORER_KINDS", "Scorer", "ScorerKind", "register_scorer_kind",
           "scorer_kind"]


class ScorerKind:
    """How one kind of request-time model is stored and scored.

    ``pack`` turns a fitted estimator into ``(params, arrays)``; the estimator class rebuilds
    a predict-only model from them (``from_scorer``); ``inputs`` turns request rows (a CSR
    matrix) into what that model takes; ``score`` ranks (higher is better) and, for a kind
    with ``rates``, ``rate`` predicts a rating. The defaults fit an estimator that stores
    everything itself: ``model.scorer_state(**context)`` packs and ``decision_function``
    scores.
    """

    name = ""
    rates = False

    def pack(self, model, **context) -> tuple[dict, dict]:
        return model.scorer_state(**context)

    def inputs(self, X, arrays: dict):
        return X

    def score(self, model, X) -> np.ndarray:
        return np.asarray(model.decision_function(X), dtype=np.float64)

    def rate(self, model, X) -> np.ndarray:
        return np.asarray(model.predict(X))


class LinearRater(ScorerKind):
    """``ordinal_linear``: from an estimator with ``coef_`` (p x n), ``intercept_``,
    ``classes_`` and ``predictor``; only the columns with a non-zero weight are kept."""

    name = "ordinal_linear"
    rates = True

    def pack(self, model, *, n_features: int, text_features: int = 0):
        coef = np.asarray(model.coef_)
        expected = int(n_features) + int(text_features)
        if coef.shape[1] != expected:
            raise ValueError(f"the model has {coef.shape[1]} features, n_features + "
                             f"text_features is {expected}")
        columns = np.flatnonzero((coef != 0).any(axis=0)).astype(np.int64)
        return ({"n_features": int(n_features), "text_features": int(text_features),
                 "predictor": model.predictor},
                {"columns": columns, "coef": coef[:, columns].astype(np.float32),
                 "intercept": np.asarray(model.intercept_, dtype=np.float64),
                 "classes": np.asarray(model.classes_, dtype=np.int64)})

    def inputs(self, X, arrays):
        return sp.csr_matrix(X)[:, arrays["columns"]]

    def score(self, model, X):
        return model.predict_score(X)


class KernelExpansion(ScorerKind):
    """``kernel``: from an estimator with ``support_vectors_``, ``dual_coef_`` and its kernel
    (``kernel``, ``gamma_``, ``degree``, ``coef0``); scored on dense rows."""

    name = "kernel"

    def pack(self, model):
        return ({"n_features": int(model.n_features_in_), "text_features": 0,
                 "kernel": model.kernel, "gamma": float(model.gamma_),
                 "degree": int(model.degree), "coef0": float(model.coef0)},
                {"support_vectors": np.asarray(model.support_vectors_, dtype=np.float32),
                 "dual_coef": np.asarray(model.dual_coef_, dtype=np.float64)})

    def inputs(self, X, arrays):
        return X.toarray() if sp.issparse(X) else X


SCORER_KINDS: dict[str, ScorerKind] = {}


def register_scorer_kind(entry: ScorerKind) -> ScorerKind:
    """Add a scorer kind to :data:`SCORER_KINDS`; its name must be new."""
    return add_entry(SCORER_KINDS, entry.name, entry, "scorer kind")


for _kind in (LinearRater(), KernelExpansion()):
    register_scorer_kind(_kind)


def scorer_kind(name) -> ScorerKind:
    """The registered scorer kind ``name`` (or the ``module:Class`` it names)."""
    return registered(SCORER_KINDS, name, ScorerKind, "scorer kind")


class Scorer:
    """An on-demand scoring model: ``kind``, JSON ``params`` and named arrays."""

    def __init__(self, kind: str, params: dict, arrays: dict):
        self.spec = scorer_kind(kind)
        self.kind, self.params, self.arrays = kind, dict(params), dict(arrays)
        self.params.setdefault("text_features", 0)
        if "n_features" not in self.params:
            raise ValueError(f"a {kind} scorer's params lack n_features")
        self._model = None

    # ------------------------------------------------------------------ from a fitted model
    @classmethod
    def of(cls, model, *, kind: str | None = None, estimator: str | None = None,
           **context) -> Scorer:
        """The scorer of a fitted estimator: its kind is the estimator's ``scorer_kind`` (or
        ``kind``), packed with ``context`` (e.g. ``n_features``); ``estimator``
        (``module:Class``, default the model's class) is what rebuilds it at request time."""
        kind = kind or getattr(type(model), "scorer_kind", "")
        params, arrays = scorer_kind(kind).pack(model, **context)
        return cls(kind, {**params, "estimator": estimator or class_path(type(model))}, arrays)

    @classmethod
    def ordinal(cls, model, n_features: int, text_features: int = 0) -> Scorer:
        """:meth:`of` a fitted ordinal rater (``ordinal_linear``)."""
        return cls.of(model, kind="ordinal_linear", n_features=n_features,
                      text_features=text_features)

    @classmethod
    def kernel(cls, model) -> Scorer:
        """:meth:`of` a fitted kernel ranker (``kernel``: only its support instances)."""
        return cls.of(model, kind="kernel")

    @classmethod
    def linear(cls, w, estimator: str = "solvers.kernel_ranksvm:KernelRankSVM") -> Scorer:
        """The linear scorer ``s(x) = wᵀx``: a ``kernel`` expansion with one support vector
        ``w`` of weight 1 under the linear kernel (a linear model of any family, a single
        feature with its sign, a kernel model collapsed to ``Σ β_s x_s``).

        >>> s = Scorer.linear(np.array([0.0, -1.0, 2.0]))
        >>> s.score(s.rows([[1.0, 1.0, 1.0], {"2": 3.0}])).tolist()
        [1.0, 6.0]
        """
        w = np.asarray(w, dtype=np.float64).ravel()
        return cls("kernel", {"n_features": int(len(w)), "kernel": "linear", "gamma": 1.0,
                              "degree": 1, "coef0": 0.0, "estimator": estimator},
                   {"support_vectors": w[None, :].astype(np.float32),
                    "dual_coef": np.ones(1)})

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
        base = self._dense_base(X.shape[1])
        X = sp.csr_matrix(X)
        if base:      # position p is feature p + 1, as the training file numbered them
            X = sp.hstack([sp.csr_matrix((X.shape[0], base)), X], format="csr")
        X.resize((X.shape[0], self.params["n_features"]))
        return X

    def _dense_base(self, length: int, n: int | None = None) -> int:
        """The column of a dense list's first value: 0, or 1 for a model whose training file
        numbered its features from 1 (SVMlight, LIBSVM, LETOR: ``feature_base`` 1), whose
        dense lists must then hold exactly one value per feature (a list one short read as
        0-based scores every document with the wrong weights)."""
        base = int(self.params.get("feature_base", 0))
        width = self.params["n_features"] - base
        if base and length != width:
            who = "a candidate" if n is None else f"candidate {n}"
            raise ValueError(f"{who} lists {length} features; the model numbers its {width} "
                             f"features from {base} as its training file did: give {width} "
                             f"values (features {base}..{width + base - 1}), or an "
                             "{index: value} map in the file's numbering")
        return base

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
                return np.arange(values.size) + self._dense_base(values.size, n), values
            features = features.tolist() if isinstance(features, np.ndarray) else features
        return check_features(f"candidate {n}", features, self.params["n_features"] - 1,
                              "the model's highest feature index")

    def score(self, X) -> np.ndarray:
        """Ranking score per row (higher is better)."""
        return self.spec.score(self._estimator(), self.spec.inputs(X, self.arrays))

    def predict_rating(self, X) -> np.ndarray:
        if not self.spec.rates:
            raise ValueError(f"a {self.kind} scorer predicts no rating")
        return self.spec.rate(self._estimator(), self.spec.inputs(X, self.arrays))

    def _estimator(self):
        """The estimator with only the fitted attributes prediction reads, rebuilt by the
        class the scorer names (``from_scorer``); a scorer without one, by the shipped
        estimator whose ``scorer_kind`` is its kind."""
        if self._model is None:
            from solvers._base import Estimator

            path = self.params.get("estimator")
            if path:
                cls = named_class(path, Estimator, "the scorer's estimator")
            else:
                from solvers import scorer_estimator

                cls = scorer_estimator(self.kind)
            self._model = cls.from_scorer(self.params, self.arrays)
        return self._model
