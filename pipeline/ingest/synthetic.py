"""Realistic synthetic events with known structure, for the demo and tests.

* Ratings from planted low-rank preferences: user u rates item i as a 1-5 star quantization of
  ``U_u · V_i + b_i + noise``; which items a user rates is drawn with popularity skew
  (Zipf-like) *and* taste (probability ∝ popularity · exp(``choice`` · score)), as in MovieLens,
  where people mostly watch what they expect to like. A model that recovers the structure ranks
  each user's held-out items well, and beats "everyone gets the most popular items".
* Outcomes from a planted linear scorer: item features are sparse non-negative (like tf-idf or
  counts); the label is 1 when ``w · x + noise`` lands in the top few percent, so positives are
  rare, as clicks and conversions are.
* Reviews (ordinal events) from planted item quality: review ratings 1-5 scatter around each
  item's quality; the review text is drawn from a vocabulary that depends on the review's own
  rating (with negated praise such as "not good" in poor reviews, so bigrams matter), and each
  item has a few numeric features, one of them a noisy view of its quality. A model of text and
  features beats every constant rating and the best single feature.
* Judgments from a planted non-linear relevance (``x_2 − 2|x_0 − x_1|``): graded labels of a
  query's docs that a kernel ranker can learn and a linear one cannot fully.

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


def judgment_events(n_queries=200, docs_per_query=15, n_features=10, n_docs=None, seed=0,
                    start=0, id_prefix="", noise=0.3) -> list[dict]:
    """Judgment events (query, doc, label 0/1/2, dense features) with a planted *non-linear*
    relevance, ts increasing and queries interleaved in time.

    Each (query, doc) row has features x ~ N(0, I) and relevance
    ``r = x_2 − 2 |x_0 − x_1| + noise``; the label is 0, 1 or 2 by the 70% and 90% quantiles of
    r over all rows (so a few queries have no relevant doc, as in LETOR). No linear function of
    x can use ``|x_0 − x_1|`` (it is even in x_0 − x_1, which is symmetric about 0): the best
    linear ranker and the best single feature only get the ``x_2`` part, a kernel ranker gets
    both. Docs come from a pool of ``n_docs`` (default a third of the rows), so a doc is judged
    for several queries; deterministic by ``seed``.

    Examples
    --------
    >>> events = judgment_events(n_queries=3, docs_per_query=4, n_features=3)
    >>> len(events), sorted(events[0])
    (12, ['doc', 'event_id', 'features', 'label', 'query', 'ts'])
    """
    if n_features < 3:
        raise ValueError(f"n_features is {n_features}; the planted relevance needs at least 3")
    rng = np.random.default_rng(seed)
    n = n_queries * docs_per_query
    n_docs = max(docs_per_query, n // 3) if n_docs is None else int(n_docs)
    if n_docs < docs_per_query:
        raise ValueError(f"n_docs is {n_docs}, less than docs_per_query {docs_per_query}")
    X = rng.normal(size=(n, n_features))
    r = X[:, 2] - 2.0 * np.abs(X[:, 0] - X[:, 1]) + rng.normal(scale=noise, size=n)
    labels = np.digitize(r, np.quantile(r, [0.7, 0.9]))
    docs = np.concatenate([rng.choice(n_docs, size=docs_per_query, replace=False)
                           for _ in range(n_queries)])
    order = rng.permutation(n)       # queries interleaved in time
    events = []
    for pos, row in enumerate(order):
        seq = start + pos
        events.append({"event_id": f"{id_prefix}j{seq}", "ts": BASE_TS + seq * 1000,
                       "query": f"{id_prefix}q{row // docs_per_query}",
                       "doc": f"{id_prefix}d{docs[row]}", "label": int(labels[row]),
                       "features": [round(float(v), 5) for v in X[row]]})
    return events


# review words by rating level 1..5, and words that carry no sentiment
_SENTIMENT = (
    ("awful", "terrible", "useless", "broke", "worst", "refund", "horrible", "waste"),
    ("disappointing", "poor", "flimsy", "mediocre", "cheap", "annoying", "overpriced", "meh"),
    ("okay", "average", "decent", "fine", "acceptable", "fair", "ordinary", "adequate"),
    ("good", "nice", "solid", "pleased", "reliable", "comfortable", "recommend", "happy"),
    ("excellent", "amazing", "perfect", "superb", "love", "outstanding", "brilliant", "best"),
)
_FILLER = ("the", "it", "this", "product", "was", "is", "and", "i", "for", "with", "my",
           "delivery", "box", "color", "size", "price", "bought", "after", "week", "use")


def _review_text(rng, rating: int) -> str:
    """A review of ``rating`` stars: filler words and sentiment words of levels near it;
    praise is negated ("not good") in reviews of 1-2 stars."""
    words = []
    for _ in range(int(rng.integers(6, 16))):
        if rng.random() < 0.6:
            words.append(_FILLER[int(rng.integers(len(_FILLER)))])
            continue
        level = int(np.clip(rating - 1 + rng.choice([-1, 0, 0, 0, 1]), 0, 4))
        if rating <= 2 and rng.random() < 0.3:   # "not good": bigrams tell it from praise
            words += ["not", _SENTIMENT[3 + int(rng.integers(2))][int(rng.integers(8))]]
        else:
            words.append(_SENTIMENT[level][int(rng.integers(8))])
    return " ".join(words)


def ordinal_events(n_items=600, n_reviews=6000, n_features=4, text=True, features=True,
                   seed=0, start=0, id_prefix="") -> list[dict]:
    """Review events (item, label 1-5, ``features`` and/or ``text``), ts increasing.

    Item i has a quality q_i ~ N(0, 1); a review's rating is ``round(3 + 1.2 (q_i + 0.6 e))``
    clipped to 1..5 (e ~ N(0, 1)), so items differ and reviews of one item scatter. Its text
    comes from :func:`_review_text` of that rating; its features are the item's: feature 0 is
    ``q_i`` plus noise (a brand score, say), feature 1 noise, feature 2 ``−q_i / 2`` plus noise,
    feature 3 a 0/1 category (up to ``n_features``). Items are reviewed with a Zipf-like skew.

    Examples
    --------
    >>> events = ordinal_events(n_items=20, n_reviews=50, seed=1)
    >>> sorted(events[0]), 1 <= events[0]["label"] <= 5
    (['event_id', 'features', 'item', 'label', 'text', 'ts'], True)
    """
    if not (text or features):
        raise ValueError("ordinal events need text or features; both are off")
    rng = np.random.default_rng(seed)
    quality = rng.normal(size=n_items)
    X = np.column_stack([quality + rng.normal(scale=0.7, size=n_items),
                         rng.normal(size=n_items),
                         -0.5 * quality + rng.normal(scale=0.7, size=n_items),
                         (rng.random(n_items) < 0.5).astype(float)])[:, :n_features]
    popularity = 1.0 / np.arange(1, n_items + 1) ** 0.7
    items = rng.choice(n_items, size=n_reviews, p=rng.permutation(popularity)
                       / popularity.sum())
    ratings = np.clip(np.round(3 + 1.2 * (quality[items] + 0.6 * rng.normal(size=n_reviews))),
                      1, 5).astype(int)
    events = []
    for k, (i, r) in enumerate(zip(items.tolist(), ratings.tolist())):
        e = {"event_id": f"{id_prefix}v{start + k}", "ts": BASE_TS + (start + k) * 1000,
             "item": f"p{i}", "label": r}
        if features:
            e["features"] = {str(j): round(float(X[i, j]), 4) for j in range(X.shape[1])
                             if X[i, j] != 0}
        if text:
            e["text"] = _review_text(rng, r)
        events.append(e)
    return events


def write_jsonl(events: list[dict], path) -> Path:
    """Write events as JSON lines (one event per line, with its ``kind``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for e in events:
            fh.write(json.dumps(e, ensure_ascii=False, separators=(",", ":")) + "\n")
    return path
