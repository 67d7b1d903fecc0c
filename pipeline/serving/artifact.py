"""A trained model as plain arrays, independent of the solver that made it: what
:func:`pipeline.serving.publish.publish` takes. Saved as ``manifest.json`` + ``arrays.npz``
(no pickle).

A :class:`ModelArtifact` holds what every model has (its item ids, an optional on-demand
:class:`~pipeline.serving.scorers.Scorer`, how a new user is folded in, and what describes it)
and, as ``data``, the fields of its ``kind``: a small dataclass of the serving shape registered
in :mod:`pipeline.serving.artifact_kinds` (``user_item``, ``global_list``, ``query_docs``,
``predicted_ratings``), which builds and checks it. Build one with :meth:`ModelArtifact.of`
(``ModelArtifact.user_item(...)`` and the other shipped kinds' names are shorthands for it).
Reading a field of the kind's data on the artifact (``art.item_factors``) gives it, or None
where the kind has no such field.

Examples
--------
>>> import numpy as np
>>> art = ModelArtifact.user_item(user_ids=["ann", "bob"], item_ids=[10, 11, 12],
...                               user_factors=np.ones((2, 4)), item_factors=np.eye(3, 4),
...                               seen=([0, 1, 1], [2]), algorithm="AltSVM")
>>> art.kind, art.n_keys, art.rank, type(art.data).__name__, art.list_scores
('user_item', 2, 4, 'UserItemData', None)
>>> ModelArtifact.of("global_list", item_ids=["a", "b"], scores=[0.1, 0.9]).item_scores
array([0.1, 0.9], dtype=float32)
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from pipeline.serving.artifact_kinds import kind_of, payload_fields
from pipeline.serving.item_queries import FOLD_INS, fold_in_method
from pipeline.serving.scorers import Scorer
from pipeline.serving.version_listing import check_watermark
from solvers.persist import read_bundle, write_bundle

FORMAT = "rankstream.artifact"
ARTIFACT_FORMAT = 1
SPARSE = ".csr_"   # a sparse field F is stored as F.csr_data, F.csr_indices, F.csr_indptr, ...


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


class _Shorthand:
    """``ModelArtifact.<kind>(**given)`` is ``ModelArtifact.of("<kind>", **given)``."""

    def __set_name__(self, owner, name):
        self.kind = name

    def __get__(self, obj, owner):
        return functools.partial(owner.of, self.kind)


@dataclass(eq=False)
class ModelArtifact:
    """Plain arrays of a trained model plus what describes it; build with :meth:`of`.

    Attributes
    ----------
    kind : str
        A serving shape registered in :mod:`pipeline.serving.artifact_kinds`.
    item_ids : ndarray
        Ids of items (or docs), int64 or str; list entries index into it.
    data : dataclass
        The kind's own fields (its ``payload``, e.g. ``UserItemData``).
    scorer : Scorer or None
        The on-demand scoring model, for lookups that score candidates given in the request.
    fold_in : dict
        How a user the model has not met gets a factor from a few of their items at request
        time (an artifact with item factors): ``{"method": NAME, ...its settings}``, NAME one
        of :data:`pipeline.serving.item_queries.FOLD_INS` (``pairwise``: ``reg``, ``loss``,
        ``per_item``; ``least_squares``: ``reg``, ``alpha``) or a ``module:Class`` fold-in;
        empty: no fold-in (such a user gets the fallback list).
    algorithm, params, metrics, trained_at
        Description copied into the published version's meta hash.
    served_as : str
        What users are served: ``"model"`` (the trained model), ``"trivial"`` (a trivial list
        published because the model did not beat it), ``"challenger-NAME"`` or ``"blend-NAME"``
        (the gate's challenger, or a blend with it, published because the model lost to it).
        Lookups report it as their ``source``.
    watermark : dict or None
        ``{"<topic>/<partition>": next_offset}``: the event-store offsets the model learned
        from (the refresher re-applies every event after them); None: not known.
    healed_at : str
        When this artifact was published again because Redis had lost the model (a UTC ISO
        time; "" for a plain publish). Kept in the version's meta, not in a saved artifact.
    """

    kind: str
    item_ids: np.ndarray
    data: object = None
    scorer: Scorer | None = None
    fold_in: dict = field(default_factory=dict)
    algorithm: str = ""
    params: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    trained_at: str | None = None
    served_as: str = "model"
    watermark: dict | None = None
    healed_at: str = ""

    user_item = _Shorthand()
    global_list = _Shorthand()
    predicted_ratings = _Shorthand()
    query_docs = _Shorthand()

    @classmethod
    def of(cls, kind: str, **given) -> ModelArtifact:
        """An artifact of ``kind``: the keywords its :class:`ArtifactKind` ``build`` takes
        (see :mod:`pipeline.serving.artifact_kinds`), and the describing fields (``scorer``,
        ``fold_in``, ``algorithm``, ``params``, ``metrics``, ``trained_at``, ``served_as``,
        ``watermark``).

        Examples
        --------
        >>> ModelArtifact.of("query_docs", query_ids=["q1"], doc_ids=["d1", "d2"],
        ...                  indptr=[0, 2], docs=[1, 0], scores=[0.3, 0.7]).n_keys
        1
        """
        describe = {k: given.pop(k) for k in _DESCRIBE if k in given}
        item_ids, data = kind_of(kind).build(**given)
        return cls(kind, item_ids, data, **describe)

    def __post_init__(self):
        self.validate()

    def __getattr__(self, name):
        # only called for names that are no attribute: a field of the kind's data, or None
        # where another kind has such a field (readers such as the publisher ask any kind)
        data = self.__dict__.get("data")
        if data is not None and name in getattr(type(data), "__dataclass_fields__", ()):
            return getattr(data, name)
        if name in payload_fields():
            return None
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Check shapes, dtypes and the fields the kind needs; normalise arrays in place."""
        shape = kind_of(self.kind)
        self.item_ids = _ids("item_ids", self.item_ids)
        if len(self.item_ids) == 0:
            raise ValueError("item_ids is empty")
        if not isinstance(self.data, shape.payload):
            raise ValueError(f"a {self.kind} artifact's data is a {type(self.data).__name__}, "
                             f"expected a {shape.payload.__name__}")
        for name in shape.needs:
            if getattr(self.data, name) is None:
                raise ValueError(f"a {self.kind} artifact needs {name}")
        if getattr(self.data, "key_ids", None) is not None:
            self.data.key_ids = _ids("key_ids", self.data.key_ids)
        shape.validate(self)
        if self.scorer is not None and not isinstance(self.scorer, Scorer):
            raise ValueError(f"scorer is a {type(self.scorer).__name__}, expected a "
                             "pipeline.serving.scorers.Scorer")
        if not isinstance(self.params, dict) or not isinstance(self.metrics, dict):
            raise ValueError("params and metrics must be dicts")
        json.dumps([self.params, self.metrics, self.fold_in])  # must be JSON-serialisable
        if self.watermark is not None:
            self.watermark = check_watermark(self.watermark)
        if self.fold_in:
            try:
                if not self.rank:
                    raise ValueError("the artifact has no item factors")
                fold_in_method(self.fold_in.get("method")).check(self.fold_in)
            except ValueError as err:
                raise ValueError(f"fold_in is {self.fold_in!r:.80}, expected a method of "
                                 f"{tuple(FOLD_INS)} (or module:Class) on an artifact with "
                                 f"item factors: {err}") from None

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    @property
    def n_keys(self) -> int:
        """Number of users (``user_item``) or queries (``query_docs``); 0 for global lists."""
        keys = getattr(self.data, "key_ids", None)
        return 0 if keys is None else len(keys)

    @property
    def rank(self) -> int:
        factors = getattr(self.data, "item_factors", None)
        return 0 if factors is None else factors.shape[1]

    # ------------------------------------------------------------------ persistence
    def save(self, path) -> Path:
        """Write the artifact as a bundle at ``path`` (:mod:`solvers.persist`: ``manifest.json``
        + ``arrays.npz``, atomically, nothing pickled): the item ids and the kind's arrays
        under their field names.

        Examples
        --------
        >>> import tempfile, os
        >>> art = ModelArtifact.global_list(item_ids=[1, 2], scores=[0.5, 0.1])
        >>> d = art.save(os.path.join(tempfile.mkdtemp(), "m"))
        >>> ModelArtifact.load(d).item_ids.tolist()
        [1, 2]
        """
        arrays = {"item_ids": self.item_ids}
        for f in fields(self.data):
            value = getattr(self.data, f.name)
            if sp.issparse(value):      # sparse factors: their CSR arrays
                arrays.update({f.name + SPARSE + part: np.asarray(getattr(value, part))
                               for part in ("data", "indices", "indptr")})
                arrays[f.name + SPARSE + "shape"] = np.array(value.shape, np.int64)
            elif value is not None:
                arrays[f.name] = value
        if self.scorer is not None:
            arrays["scorer"] = np.frombuffer(self.scorer.to_bytes(), dtype=np.uint8)
        manifest = {"format": FORMAT, "format_version": ARTIFACT_FORMAT,
                    "kind": self.kind, "algorithm": self.algorithm, "params": self.params,
                    "metrics": self.metrics, "trained_at": self.trained_at,
                    "served_as": self.served_as, "fold_in": self.fold_in,
                    "watermark": self.watermark,
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
        payload = kind_of(manifest["kind"]).payload
        scorer = arrays.get("scorer")
        if scorer is not None:
            scorer = Scorer.from_bytes(scorer.tobytes(), f"{path}: scorer")
        for f in fields(payload):
            if f.name + SPARSE + "shape" in arrays:
                parts = [arrays[f.name + SPARSE + p] for p in ("data", "indices", "indptr")]
                arrays[f.name] = sp.csr_matrix(tuple(parts),
                                               shape=tuple(arrays[f.name + SPARSE + "shape"]))
        data = payload(**{f.name: arrays[f.name] for f in fields(payload) if f.name in arrays})
        return cls(kind=manifest["kind"], item_ids=arrays["item_ids"], data=data, scorer=scorer,
                   algorithm=manifest.get("algorithm", ""),
                   params=manifest.get("params", {}), metrics=manifest.get("metrics", {}),
                   trained_at=manifest.get("trained_at"),
                   served_as=manifest.get("served_as", "model"),
                   fold_in=manifest.get("fold_in", {}),
                   watermark=manifest.get("watermark"))


_DESCRIBE = tuple(f.name for f in fields(ModelArtifact) if f.name not in ("kind", "item_ids",
                                                                           "data"))
