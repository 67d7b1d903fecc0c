"""Realistic synthetic events with known structure, for the demo and tests.

* Ratings from planted low-rank preferences: user u rates item i as a 1-5 star quantization of
  ``U_u · V_i + b_i + noise``; which items a user rates is drawn with popularity skew
  (Zipf-like) *and* taste (probability ∝ popularity · exp(``choice`` · score)), as in MovieLens,
  where people mostly watch what they expect to like. A model that recovers the structure ranks
  each user's held-out items well, and beats "everyone gets the most popular items".
* Outcomes from a planted linear scorer: item features are sparse non-negative (like tf-idf or
  counts); the label is 1 when ``w · x + noise`` lands in the top few percent, so positives are
  rare, as clicks and conversions are.

Every event is a JSON-able dict of the event schemas in ``pipeline.ingest.events``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

BASE_TS = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms


def rating_events(n_users=1500, n_items=800, per_user=60, rank=6, seed=0, start=0,
                  id_prefix="", choice=1.0) -> list[dict]:
    """``n_users * per_user`` rating events (user, item, rating 1-5, ts increasing);
    ``choice`` is how strongly taste decides which items a user rates (0: popularity only)."""
    rng = np.random.default_rng(seed)
    U = rng.normal(size=(n_users, rank))
    V = rng.normal(size=(n_items, rank)) / np.sqrt(rank)
    bias = rng.normal(scale=0.7, size=n_items)
    popularity = 1.0 / np.arange(1, n_items + 1) ** 0.8
    popularity = rng.permutation(popularity / popularity.sum())
    events = []
    seq = start
    for u in range(n_users):
        taste = U[u] @ V.T + bias
        p = popularity * np.exp(choice * (taste - taste.max()))
        items = rng.choice(n_items, size=min(per_user, n_items), replace=False, p=p / p.sum())
        score = taste[items] + rng.normal(scale=0.5, size=len(items))
        stars = np.clip(np.round(3 + 1.2 * (score - score.mean()) / (score.std() + 1e-9)), 1, 5)
        for i, r in zip(items, stars):
            events.append({"event_id": f"{id_prefix}r{seq}", "ts": BASE_TS + seq * 1000,
                           "user": f"u{u}", "item": f"m{i}", "rating": float(r)})
            seq += 1
    order = rng.permutation(len(events))  # interleave users in time, keep ts increasing
    for pos, idx in enumerate(order):
        events[idx]["ts"] = BASE_TS + (start + pos) * 1000
    return [events[i] for i in np.argsort([e["ts"] for e in events])]


def outcome_events(n_items=4000, n_features=50, density=0.2, positive_rate=0.05, seed=0,
                   start=0, id_prefix="") -> list[dict]:
    """Outcome events (item, label 0/1, sparse features) from a planted linear scorer."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=n_features)
    X = rng.random((n_items, n_features)) * (rng.random((n_items, n_features)) < density)
    score = X @ w + rng.normal(scale=0.3, size=n_items)
    labels = (score >= np.quantile(score, 1 - positive_rate)).astype(int)
    events = []
    for k in range(n_items):
        nz = np.flatnonzero(X[k])
        events.append({"event_id": f"{id_prefix}o{start + k}", "ts": BASE_TS + (start + k) * 1000,
                       "item": f"c{start + k}", "label": int(labels[k]),
                       "features": {str(j): round(float(X[k, j]), 6) for j in nz}})
    return events


def write_jsonl(events: list[dict], path) -> Path:
    """Write events as JSON lines (one event per line, with its ``kind``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for e in events:
            fh.write(json.dumps(e, ensure_ascii=False, separators=(",", ":")) + "\n")
    return path
