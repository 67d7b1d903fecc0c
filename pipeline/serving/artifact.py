"""A trained model as plain arrays, independent of the solver that made it: what
:func:`pipeline.serving.publish.publish` takes. Saved as ``manifest.json`` + ``arrays.npz``
(no pickle).

Its ``kind`` is one of the serving shapes registered in :mod:`pipeline.serving.artifact_kinds`
(``user_item``, ``global_list``, ``query_docs``, ``predicted_ratings``), which checks the
fields the kind needs; the class methods build the four shipped ones.

``predicted_ratings`` and ``query_docs`` may carry a :class:`~pipeline.serving.scorers.Scorer`:
the model itself, for lookups that score candidates given in the request.

Examples
--------
>>> import numpy as np
>>> art = ModelArtifact.user_item(user_ids=["ann", "bob"], item_ids=[10, 11, 12],
...                               user_factors=np.ones((2, 4)), item_factors=np.eye(3, 4),
...                               seen=([0, 1, 1], [2]), algorithm="AltSVM")
>>> art.kind, art.n_keys, art.rank
('user_item', 2, 4)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from pipeline.serving.artifact_kinds import floats, kind_of
from pipeline.serving.layout import key_of
from pipeline.serving.scorers import Scorer
from solvers.persist import read_bundle, write_bundle

FORMAT = "rankstream.artifact"
ARTIFACT_FORMAT = 1
_ARRAYS = ("item_ids", "key_ids", "user_factors", "item_factors", "item_bias", "seen_indptr",
           "seen_indices", "precompute", "list_indptr", "list_items", "list_scores",
           "item_scores", "fallback_scores")


def _ids(name: str, values) -> np.ndarray:
    """Normalise ids: integers -> int64, anything else -> unicode strings; must be unique."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind in "iu":
        arr = arr.astype(np.int64)
    elif arr.dtype.kind == "U":
        pass
    elif arr.dtype.kind in "OS":
        arr = np.array([x.decode() if isinstance(x, bytes) else str(x) for x in arr.tolist()],
                       dtype=str)
    else:
        raise ValueError(f"{name} must be integers or strings, got dtype {arr.dtype}")
    if arr.dtype.kind == "U" and len(arr) and (arr == "").any():
        raise ValueError(f"{name} contains an empty string")
    if len(np.unique(arr)) != len(arr):
        raise ValueError(f"{name} has {len(arr) - len(np.unique(arr))} duplicate ids")
    return arr


FOLD_IN_METHODS = ("pairwise", "least_squares")   # solvers.fold_in's two problems


@dataclass(eq=False)
class ModelArtifact:
    """Plain arrays of a trained model plus what describes it; build with the class methods.

    Attributes
    ----------
    kind : str
        A serving shape registered in :mod:`pipeline.serving.artifact_kinds`.
    item_ids : ndarray
        Ids of items (or docs), int64 or str; list entries index into it.
    key_ids : ndarray or None
        User ids (``user_item``) or query ids (``query_docs``).
    user_factors, item_factors, item_bias : ndarray or None
        float32 U (n_keys x rank), V (n_items x rank), b (n_items,).
    seen_indptr, seen_indices : ndarray or None
        CSR of the item indices each user has already seen (excluded from their lists).
    precompute : ndarray or None
        bool mask over users: which get a precomputed list (default all); the others are
        scored on demand by the lookup client from their factor.
    list_indptr, list_items, list_scores : ndarray or None
        CSR of each query's candidate docs and their scores (``query_docs``).
    item_scores : ndarray or None
        Score (``global_list``) or predicted rating (``predicted_ratings``) per item.
    fallback_scores : ndarray or None
        Per-item scores of the list served to unknown users/queries. ``user_item`` defaults
        to the scores of the mean user factor. For ``predicted_ratings``: the ranking score
        the published list is ordered by (default the predicted ratings).
    scorer : Scorer or None
        The on-demand scoring model (``predicted_ratings``, ``query_docs``).
    algorithm, params, metrics, trained_at
        Description copied into the published version's meta hash.
    served_as : str
        What users are served: ``"model"`` (the trained model), ``"trivial"`` (a trivial list
        published because the model did not beat it), ``"challenger-NAME"`` or ``"blend-NAME"``
        (the gate's challenger, or a blend with it, published because the model lost to it).
        Lookups report it as their ``source``.
    fold_in : dict
        How a user the model has not met gets a factor from a few of their items at request
        time (:mod:`solvers.fold_in`): ``{"method": "pairwise", "reg", "loss", "per_item"}``,
        ``{"method": "least_squares", "reg", "alpha"}``, or empty (no fold-in: such a user
        gets the fallback list).
    """

    kind: str
    item_ids: np.ndarray
    key_ids: np.ndarray | None = None
    user_factors: np.ndarray | None = None
    item_factors: np.ndarray | None = None
    item_bias: np.ndarray | None = None
    seen_indptr: np.ndarray | None = None
    seen_indices: np.ndarray | None = None
    precompute: np.ndarray | None = None
    list_indptr: np.ndarray | None = None
    list_items: np.ndarray | None = None
    list_scores: np.ndarray | None = None
    item_scores: np.ndarray | None = None
    fallback_scores: np.ndarray | None = None
    scorer: Scorer | None = None
    algorithm: str = ""
    params: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    trained_at: str | None = None
    served_as: str = "model"
    fold_in: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def user_item(cls, *, user_ids, item_ids, user_factors, item_factors, item_bias=None,
                  seen=None, precompute=None, fallback_scores=None, **describe) -> ModelArtifact:
        """User x item factor model (AltSVM). ``seen``: a scipy CSR matrix (users x items) or
        an ``(indptr, indices)`` pair; ``precompute``: bool mask or list of user ids that get a
        precomputed list (default: all users).

        Examples
        --------
        >>> import numpy as np
        >>> ModelArtifact.user_item(user_ids=[1], item_ids=[5, 6], user_factors=[[1.0]],
        ...                         item_factors=[[1.0], [2.0]]).n_items
        2
        """
        if seen is not None and hasattr(seen, "indptr"):
            seen = (seen.indptr, seen.indices)
        art = cls("user_item", item_ids, key_ids=user_ids, user_factors=user_factors,
                  item_factors=item_factors, item_bias=item_bias,
                  seen_indptr=None if seen is None else seen[0],
                  seen_indices=None if seen is None else seen[1],
                  fallback_scores=fallback_scores, **describe)
        if precompute is not None:
            mask = np.asarray(precompute)
            if mask.dtype != bool:
                wanted = set(key_of(u) for u in mask.tolist())
                mask = np.array([key_of(u) in wanted for u in art.key_ids.tolist()], dtype=bool)
            art.precompute = mask
            art.validate()
        return art

    @classmethod
    def global_list(cls, *, item_ids, scores, **describe) -> ModelArtifact:
        """One score per candidate item (TopPush): one ranked list for everyone.

        Examples
        --------
        >>> ModelArtifact.global_list(item_ids=["a", "b"], scores=[0.1, 0.9]).kind
        'global_list'
        """
        return cls("global_list", item_ids, item_scores=scores, **describe)

    @classmethod
    def predicted_ratings(cls, *, item_ids, ratings, scores=None, scorer=None,
                          **describe) -> ModelArtifact:
        """One predicted rating per item (NPSVOR): the published list ranks items by
        ``scores`` (a continuous ranking score; default the ratings themselves).

        Examples
        --------
        >>> ModelArtifact.predicted_ratings(item_ids=[1, 2], ratings=[3, 5]).n_items
        2
        """
        return cls("predicted_ratings", item_ids, item_scores=ratings, fallback_scores=scores,
                   scorer=scorer, **describe)

    @classmethod
    def query_docs(cls, *, query_ids, doc_ids, indptr, docs, scores, fallback_scores=None,
                   scorer=None, **describe) -> ModelArtifact:
        """Per query a list of candidate docs (indices into ``doc_ids``) with scores, in CSR
        form (kernel RankSVM); each query's list is ranked by score when published.

        Examples
        --------
        >>> ModelArtifact.query_docs(query_ids=["q1"], doc_ids=["d1", "d2"], indptr=[0, 2],
        ...                          docs=[1, 0], scores=[0.3, 0.7]).n_keys
        1
        """
        return cls("query_docs", doc_ids, key_ids=query_ids, list_indptr=indptr,
                   list_items=docs, list_scores=scores, fallback_scores=fallback_scores,
                   scorer=scorer, **describe)

    def __post_init__(self):
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Check shapes, dtypes and the fields each kind needs; normalise arrays in place."""
        shape = kind_of(self.kind)
        self.item_ids = _ids("item_ids", self.item_ids)
        n_items = len(self.item_ids)
        if n_items == 0:
            raise ValueError("item_ids is empty")
        for name in shape.needs:
            if getattr(self, name) is None:
                raise ValueError(f"a {self.kind} artifact needs {name}")
        if self.key_ids is not None:
            self.key_ids = _ids("key_ids", self.key_ids)
        shape.validate(self)
        if self.item_scores is not None:
            self.item_scores = floats("item_scores", self.item_scores, (n_items,))
        if self.fallback_scores is not None:
            self.fallback_scores = floats("fallback_scores", self.fallback_scores, (n_items,))
        if self.scorer is not None and not isinstance(self.scorer, Scorer):
            raise ValueError(f"scorer is a {type(self.scorer).__name__}, expected a "
                             "pipeline.serving.scorers.Scorer")
        if not isinstance(self.params, dict) or not isinstance(self.metrics, dict):
            raise ValueError("params and metrics must be dicts")
        json.dumps([self.params, self.metrics, self.fold_in])  # must be JSON-serialisable
        if self.fold_in and (self.fold_in.get("method") not in FOLD_IN_METHODS
                             or self.item_factors is None):
            raise ValueError(f"fold_in is {self.fold_in!r:.80}, expected a method of "
                             f"{FOLD_IN_METHODS} on an artifact with item factors")

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    @property
    def n_keys(self) -> int:
        """Number of users (``user_item``) or queries (``query_docs``); 0 for global lists."""
        return 0 if self.key_ids is None else len(self.key_ids)

    @property
    def rank(self) -> int:
        return 0 if self.item_factors is None else self.item_factors.shape[1]

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> Path:
        """Write the artifact as a bundle at ``path`` (:mod:`solvers.persist`: ``manifest.json``
        + ``arrays.npz``, atomically, nothing pickled).

        Examples
        --------
        >>> import tempfile, os
        >>> art = ModelArtifact.global_list(item_ids=[1, 2], scores=[0.5, 0.1])
        >>> d = art.save(os.path.join(tempfile.mkdtemp(), "m"))
        >>> ModelArtifact.load(d).item_ids.tolist()
        [1, 2]
        """
        arrays = {n: getattr(self, n) for n in _ARRAYS if getattr(self, n) is not None}
        if self.scorer is not None:
            arrays["scorer"] = np.frombuffer(self.scorer.to_bytes(), dtype=np.uint8)
        manifest = {"format": FORMAT, "format_version": ARTIFACT_FORMAT,
                    "kind": self.kind, "algorithm": self.algorithm, "params": self.params,
                    "metrics": self.metrics, "trained_at": self.trained_at,
                    "served_as": self.served_as, "fold_in": self.fold_in,
                    "arrays": {n: [str(a.dtype), list(a.shape)] for n, a in arrays.items()}}
        return write_bundle(path, arrays, manifest)

    @classmethod
    def load(cls, path) -> ModelArtifact:
        """Read an artifact written by :meth:`save` (``allow_pickle=False``)."""
        manifest, arrays = read_bundle(path, fmt=FORMAT, version=ARTIFACT_FORMAT)
        missing = set(manifest["arrays"]) - set(arrays)
        if missing:
            raise ValueError(f"{path}/arrays.npz lacks arrays {sorted(missing)} named in the "
                             "manifest")
        known = {f.name for f in fields(cls)}
        if "scorer" in arrays:
            arrays["scorer"] = Scorer.from_bytes(arrays["scorer"].tobytes(), f"{path}: scorer")
        return cls(kind=manifest["kind"], algorithm=manifest.get("algorithm", ""),
                   params=manifest.get("params", {}), metrics=manifest.get("metrics", {}),
                   trained_at=manifest.get("trained_at"),
                   served_as=manifest.get("served_as", "model"),
                   fold_in=manifest.get("fold_in", {}),
                   **{n: a for n, a in arrays.items() if n in known})
