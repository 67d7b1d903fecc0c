"""The event streams of ``rankstream demo`` (:mod:`pipeline.cli.demo`): ratings (synthetic, or
a MovieLens ``u.data``), outcomes, reviews (synthetic, or a reviews file) and judgments
(synthetic, or a LETOR 4.0 file), each written as two files, the first 90% by time and the next
2% (:func:`streams`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _split_stream(events: list, first: float, step: float):
    n = len(events)
    cut, nxt = int(n * first), int(n * (first + step))
    return events[:cut], events[cut:nxt]


def _movielens_stream(path: Path, out: Path):
    lines = [ln for ln in path.read_text(encoding="latin-1").splitlines() if ln.strip()]
    ts = np.array([int(ln.split("\t")[3]) if len(ln.split("\t")) > 3 else 0 for ln in lines])
    ordered = [lines[i] for i in np.argsort(ts, kind="stable")]
    initial, fresh = _split_stream(ordered, 0.9, 0.02)
    (out / "ratings-0.data").write_text("\n".join(initial) + "\n")
    (out / "ratings-1.data").write_text("\n".join(fresh) + "\n")
    return out / "ratings-0.data", out / "ratings-1.data", "movielens", len(lines)


def _synthetic_stream(out: Path, args):
    from pipeline.ingest import synthetic

    ratings = synthetic.rating_events(n_users=args.users, n_items=args.items, per_user=60,
                                      seed=args.seed)
    initial, fresh = _split_stream(ratings, 0.9, 0.02)
    return (synthetic.write_jsonl(initial, out / "ratings-0.jsonl"),
            synthetic.write_jsonl(fresh, out / "ratings-1.jsonl"), None, len(ratings))


def read_reviews(path: Path) -> list[dict]:
    """Ordinal events from a reviews file: one review per line, ``item<TAB>rating<TAB>text``
    (the text may hold more tabs), lines in time order, ratings integers >= 1 (consecutive,
    e.g. 1-5); blank lines are skipped. A malformed line stops the demo, naming it."""
    from pipeline.ingest.synthetic import BASE_TS

    events = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("\t", 2)
        if len(parts) != 3:
            raise SystemExit(f"{path}:{n}: {len(parts)} tab-separated fields, expected 3 "
                             "(item, rating, text)")
        item, rating, text = parts
        if not (rating.strip().isdigit() and int(rating) >= 1):
            raise SystemExit(f"{path}:{n}: rating is {rating!r}, expected an integer >= 1")
        events.append({"event_id": f"review{n}", "ts": BASE_TS + len(events) * 1000,
                       "item": item.strip(), "label": int(rating), "text": text})
    if not events:
        raise SystemExit(f"{path}: no reviews found")
    return events


def _reviews_stream(out: Path, args):
    """The reviews as a stream: (first 90% file, next 2% file, the next 2% itself, source)."""
    from pipeline.ingest import synthetic

    if args.reviews:
        events, source = read_reviews(Path(args.reviews)), f"reviews file {args.reviews}"
    else:
        events = synthetic.ordinal_events(n_items=600, n_reviews=6000, seed=args.seed)
        source = "synthetic: 6000 reviews of 600 items, text and 4 features"
    initial, fresh = _split_stream(events, 0.9, 0.02)
    return (synthetic.write_jsonl(initial, out / "reviews-0.jsonl"),
            synthetic.write_jsonl(fresh, out / "reviews-1.jsonl"), fresh, source, len(events))


def _read_letor(path: Path, limit: int) -> list[tuple]:
    """``(query, doc, label, {index: value})`` rows of a LETOR 4.0 file (``label qid:Q 1:v 2:v
    ... #docid = D ...``; feature k becomes index k - 1, zeros left out), whole queries in file
    order until ``limit`` rows are reached. A malformed line stops the demo, naming it."""
    import gzip

    rows, queries = [], set()
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="ascii") as fh:
        for n, line in enumerate(fh, start=1):
            body, _, comment = line.partition("#")
            parts = body.split()
            if not parts:
                continue
            if len(parts) < 2 or not parts[1].startswith("qid:") or not parts[0].isdigit():
                raise SystemExit(f"{path}:{n}: expected 'label qid:Q k:v ...', got "
                                 f"{line[:60]!r}")
            query = parts[1][4:]
            if query not in queries and len(rows) >= limit:
                break
            queries.add(query)
            try:
                features = {str(int(k) - 1): float(v) for k, _, v in
                            (tok.partition(":") for tok in parts[2:]) if float(v) != 0.0}
            except ValueError:
                raise SystemExit(f"{path}:{n}: a feature is not 'index:value'") from None
            doc = comment.split("docid =")[1].split()[0] if "docid =" in comment else f"l{n}"
            rows.append((query, doc, int(parts[0]), features))
    if not rows:
        raise SystemExit(f"{path}: no judgments found")
    return rows


def _judgments_stream(out: Path, args):
    """The judgments as a stream (rows shuffled in time, seeded): (first 90% file, next 2%
    file, source, count)."""
    from pipeline.ingest import synthetic

    if args.letor:
        rows = _read_letor(Path(args.letor), args.judgments or 10**9)
        order = np.random.default_rng(args.seed).permutation(len(rows))
        events = [{"event_id": f"letor{pos}", "ts": synthetic.BASE_TS + pos * 1000,
                   "query": rows[i][0], "doc": rows[i][1], "label": rows[i][2],
                   "features": rows[i][3]} for pos, i in enumerate(order)]
        source = (f"LETOR file {args.letor}: {len(rows):,} judgments of "
                  f"{len({r[0] for r in rows})} queries")
    else:
        n_queries = max((args.judgments or 3000) // 15, 10)
        events = synthetic.judgment_events(n_queries=n_queries, docs_per_query=15,
                                           seed=args.seed)
        source = (f"synthetic: {n_queries} queries x 15 docs, 10 features, relevance "
                  "x2 - 2|x0 - x1| + noise")
    initial, fresh = _split_stream(events, 0.9, 0.02)
    return (synthetic.write_jsonl(initial, out / "judgments-0.jsonl"),
            synthetic.write_jsonl(fresh, out / "judgments-1.jsonl"), source, len(events))


def streams(home: Path, args) -> dict:
    """Every event kind's stream written as files: ``{kind: (first 90%, next 2%)}``, and what
    the report says about them (``sources``, ``counts``, the ratings' ``fmt``, the fresh
    ``unseen`` reviews)."""
    from pipeline.ingest import synthetic

    out = home / "events"
    out.mkdir(parents=True)
    if args.ratings:
        r0, r1, fmt, n_ratings = _movielens_stream(Path(args.ratings), out)
        source = f"MovieLens-style file {args.ratings}"
    else:
        r0, r1, fmt, n_ratings = _synthetic_stream(out, args)
        source = f"synthetic: {args.users} users x {args.items} items, planted rank-6 tastes"
    outcomes = synthetic.outcome_events(n_items=5000, seed=args.seed)
    o0, o1 = _split_stream(outcomes, 0.9, 0.02)
    v0, v1, unseen, review_source, n_reviews = _reviews_stream(out, args)
    j0, j1, judgment_source, n_judgments = _judgments_stream(out, args)
    return {"files": {"rating": (r0, r1),
                      "outcome": (synthetic.write_jsonl(o0, out / "outcomes-0.jsonl"),
                                  synthetic.write_jsonl(o1, out / "outcomes-1.jsonl")),
                      "ordinal": (v0, v1), "judgment": (j0, j1)},
            "fmt": fmt, "unseen": unseen,
            "sources": {"ratings": source, "reviews": review_source,
                        "judgments": judgment_source},
            "counts": {"ratings": n_ratings, "outcomes": len(outcomes), "reviews": n_reviews,
                       "judgments": n_judgments}}
