"""NPSVOR's dataset: ordinal events (reviews) -> ``[features | hashed text]`` rows and ratings,
one row per event, with a stable random split by event (:func:`ordinal`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest.store import EventStore
from pipeline.training.arrays import csr_from_arrays, csr_to_arrays, id_codes
from pipeline.training.datasets import (
    Window,
    event_ids,
    latest_per_key,
    stable_split,
    window_tables,
)


@dataclass
class OrdinalData:
    """NPSVOR's inputs: one row per review (ordinal event), ``[features | hashed text]``.

    ``ids`` are the rows' stable instance ids (:func:`~pipeline.training.datasets.event_ids`),
    which key the duals for warm starts; ``latest`` holds, for every item in the window, the
    row of its latest event: the row whose prediction is published as the item's rating."""

    X: object                         # scipy.sparse.csr_matrix float32 (rows, n_features + text)
    y: np.ndarray                     # int64 ratings
    ids: np.ndarray                   # int64 stable instance id of each row
    item_ids: np.ndarray              # str, the items of the window
    row_item: np.ndarray              # index into item_ids of each row
    latest: np.ndarray                # row of each item's latest event, in item_ids order
    test_mask: np.ndarray
    n_features: int                   # numeric feature columns; text starts after them
    text_features: int
    window: Window | None
    stats: dict = field(default_factory=dict)

    def to_arrays(self) -> dict:
        """The dataset bundle's arrays: X (:func:`csr_to_arrays`), ``y``, ``ids``, the items
        (``item_ids``, ``row_item``, ``latest``), ``test_mask`` and the two widths."""
        return {**csr_to_arrays(self.X), "y": self.y, "ids": self.ids,
                "item_ids": self.item_ids, "row_item": self.row_item, "latest": self.latest,
                "test_mask": self.test_mask, "n_features": np.array(self.n_features),
                "text_features": np.array(self.text_features)}

    @classmethod
    def from_arrays(cls, arrays: dict) -> OrdinalData:
        """The dataset of a bundle's arrays (no window or stats)."""
        return cls(X=csr_from_arrays(arrays), y=arrays["y"], ids=arrays["ids"],
                   item_ids=arrays["item_ids"], row_item=arrays["row_item"],
                   latest=arrays["latest"], test_mask=arrays["test_mask"],
                   n_features=int(arrays["n_features"]),
                   text_features=int(arrays["text_features"]), window=None)


def ordinal(store: EventStore, *, window=None, test_fraction: float = 0.2, seed: int = 0,
            n_features: int | None = None, max_features: int = 2**20,
            text_features: int = 2**20, levels: int = 10) -> OrdinalData:
    """NPSVOR inputs from ordinal events (reviews: item, label, features and/or text).

    One row per event, not per item: an item may have many reviews, each a training instance
    with its own rating. An event re-sent with the same ``event_id`` counts once (the latest by
    ts, then offset). Rows are :func:`pipeline.features.feature_rows` of the events, the same
    function the lookup uses on a request: numeric features in columns ``0..n_features-1``
    (the highest index + 1, at least ``n_features``, the previous run's, so it never shrinks,
    and at most ``max_features``; values of a higher index are left out and counted), then
    ``text_features`` columns of hashed uni- and bigrams (0: text is ignored).

    The held-out split is by event, by a stable hash of its instance id, so an event stays on
    its side as data grows. The item's published rating is the prediction for its *latest*
    event's features and text (what the item looks like now), not an average over its reviews.

    Labels outside ``1..levels`` are left out and counted (``stats["labels_out_of_range"]``,
    with a warning): one stray label (1e9) must neither size an allocation nor stop every
    retrain while it stays in the window.
    """
    from pipeline.features import feature_rows

    columns = {"ordinal": ["ts", "offset", "event_id", "item", "label", "feature_index",
                           "feature_value", "text"]}
    tables, win = window_tables(store, ["ordinal"], window or {}, columns, key="item")
    t = tables["ordinal"]
    ids = event_ids(t.column("event_id"))
    keep = latest_per_key(ids, t.column("ts").to_numpy(), t.column("offset").to_numpy())
    t, ids = t.take(pa.array(keep)), ids[keep]
    label = t.column("label").to_numpy()
    in_range = (label >= 1) & (label <= int(levels))
    out_of_range = int((~in_range).sum())
    if out_of_range:
        t, ids = t.filter(pa.array(in_range)), ids[in_range]
    lengths = pc.fill_null(pc.list_value_length(t.column("feature_index")), 0)
    top = pc.max(pc.list_flatten(t.column("feature_index"))).as_py() if t.num_rows else None
    width = min(max(0 if top is None else top + 1, n_features or 0), int(max_features))
    X, dropped = feature_rows(t.column("feature_index").to_pylist(),
                              t.column("feature_value").to_pylist(), width,
                              t.column("text").to_pylist() if text_features else None,
                              int(text_features))
    codes, uniques = id_codes(t.column("item"))
    item_of_row = codes.astype(np.int64)
    latest = latest_per_key(item_of_row, t.column("ts").to_numpy(),
                             t.column("offset").to_numpy())
    latest = latest[np.argsort(item_of_row[latest], kind="stable")]
    y = t.column("label").to_numpy().astype(np.int64)
    test = stable_split(ids, test_fraction, seed) if test_fraction > 0 else \
        np.zeros(len(ids), bool)
    labels, counts = np.unique(y, return_counts=True)
    with_text = int(pc.sum(pc.invert(pc.is_null(t.column("text")))).as_py() or 0)
    stats = {"reviews": int(len(y)), "resent": int(win.n_events - len(y)),
             "items": int(len(uniques)), "test": int(test.sum()),
             "labels": {int(k): int(c) for k, c in zip(labels, counts)},
             "with_text": with_text,
             "with_features": int(pc.sum(pc.greater(lengths, 0)).as_py() or 0),
             "features": width, "text_features": int(text_features),
             "feature_values_over_max_features": dropped,
             "empty_rows": int((np.diff(X.indptr) == 0).sum())}
    warnings = []
    if with_text and not text_features:
        warnings.append(f"{with_text:,} events carry text, but text_features is 0: their "
                        "text is ignored")
    if out_of_range:
        stats["labels_out_of_range"] = out_of_range
        warnings.append(f"{out_of_range:,} events have a label outside 1..{levels} "
                        "(params.levels): left out")
    if warnings:
        stats["warning"] = "; ".join(warnings)
    return OrdinalData(X=X, y=y, ids=ids, item_ids=uniques.astype(str), row_item=item_of_row,
                       latest=latest, test_mask=test, n_features=width,
                       text_features=int(text_features), window=win, stats=stats)
