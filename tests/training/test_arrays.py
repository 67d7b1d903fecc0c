"""Event tables to solver arrays: numeric columns, sparse features, id codes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipeline.ingest.local_store import LocalEventStore
from pipeline.ingest.validate import validate_rows
from pipeline.training.arrays import features_csr, id_codes, to_numpy
from tests.ingest.factory import make_event


@pytest.fixture
def store(tmp_path):
    return LocalEventStore(tmp_path / "store", tmp_path / "dead-letter")


def test_numpy_columns_csr_and_id_codes(store):
    rng = random.Random(1)
    events = [make_event("judgment", i, rng) for i in range(50)]
    tables, bad = validate_rows(events, np.arange(50))
    assert not bad
    store.write("j", 0, 0, 49, tables)
    table = store.read("judgment")
    arrays = to_numpy(table)
    assert arrays["label"].dtype == np.int32 and arrays["ts"].dtype == np.int64
    assert len(arrays["feature_indptr"]) == 51
    matrix = features_csr(table, n_features=5000)
    assert matrix.shape == (50, 5000)
    for i, event in enumerate(events):
        features = event["features"]
        dense = (dict(enumerate(features)) if isinstance(features, list)
                 else {int(k): v for k, v in features.items()})
        row = matrix.getrow(i)
        assert dict(zip(row.indices.tolist(), row.data.tolist())) == dense
    codes, ids = id_codes(table.column("query"))
    assert (ids[codes] == table.column("query").to_numpy(zero_copy_only=False)).all()
    with pytest.raises(ValueError, match="feature index"):
        features_csr(table, n_features=3)
