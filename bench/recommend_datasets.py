"""Recommenders on every rating data set present, through the product, side by side.

Protocol of the quality targets: each data set's (user, item) rows are split 80/20 by a stable
random hash; the 80% is ingested into a fresh event store and the shipped ``movies`` config of
``dags/models.toml``, unedited, is run by the retrain loop (dataset, tuning, fit, ALS
challenger, gate, publish to an embedded redis-server). Then every user with a relevant
held-out item (rating at least the config's threshold as the run resolved it; every
interaction) is scored on their top-10 over the items they did not meet in the 80%:

* ``served``: what lookups answer (``TopK.recommend_many`` against the embedded Redis);
* ``AltSVM``, ``ALS (challenger)``, ``blend``: the run's own artifacts (the challenger is ALS
  tuned on the run's validation split with AltSVM's caps, then refit on all of the 80%);
* ``EASE (challenger)``: the run's EASE artifact (skipped over ``tune.ease_max_items`` items);
* ``BPR``: implicit's, coordinate-searched on the same validation split with the same caps,
  refit on all of the 80%;
* the peers a user would tune in ten lines, each refit on all of the 80% at its choice:
  ``grid ALS`` (implicit's ALS, the 24-point grid ``GRID_ALS`` of factors x regularization x
  alpha on the binary met matrix, 15 iterations, chosen on the run's validation split) and
  ``grid EASE`` (λ from ``GRID_EASE`` on the same split; skipped over ``--ease-max-items``);
* ``popularity``: items by how many users met them relevantly in the 80%.

The targets: served P@10 >= 1.0x the better of grid ALS and grid EASE ("best peer"), >= 1.5x
popularity; AltSVM's own ratio to the best peer is reported, not a target.

Data sets (``../shared/data``): MovieLens 100K ratings, Last.fm 2K play counts as
interactions; ``--ratings FILE`` adds any ``user,item,rating[,ts]`` CSV (or ``userId,movieId,
rating,timestamp``) or MovieLens ``u.data``, e.g. a held-out set.

    .venv/bin/python bench/recommend_datasets.py [--data movielens,lastfm] [--ratings FILE]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DATA = REPO.parent / "shared" / "data"
BPR_AXES = {"factors": [32, 64, 128], "learning_rate": [0.003, 0.01, 0.03],
            "regularization": [0.0001, 0.001, 0.01], "iterations": [50, 100, 200]}
BPR_START = {"factors": 64, "learning_rate": 0.01, "regularization": 0.001, "iterations": 100}
K = 10
GRID_ALS = [{"factors": f, "regularization": r, "alpha": a}
            for f in (32, 64, 128) for r in (0.1, 1.0, 10.0, 100.0) for a in (1.0, 10.0)]
GRID_EASE = (50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0)


def movielens() -> list[dict]:
    rows = []
    with open(DATA / "movielens-100k" / "u.data") as fh:
        for line in fh:
            user, item, rating, ts = line.split("\t")
            rows.append({"kind": "rating", "user": user, "item": item,
                         "rating": float(rating), "ts": int(ts) * 1000})
    return rows


def lastfm() -> list[dict]:
    """Play counts as interactions (a user listened to an artist); no timestamps: the row
    order stands in for time."""
    rows = []
    with gzip.open(DATA / "hetrec-lastfm-2k" / "user_artists.dat.gz", "rt") as fh:
        reader = csv.reader(fh, delimiter="\t")
        next(reader)
        for n, (user, artist, _plays) in enumerate(reader):
            rows.append({"kind": "interaction", "user": user, "item": artist,
                         "ts": 1_300_000_000_000 + n * 1000})
    return rows


def ratings_file(path: str):
    def load() -> list[dict]:
        rows = []
        with open(path, newline="") as fh:
            for n, row in enumerate(csv.DictReader(fh)):
                ts = row.get("ts") or row.get("timestamp") or n + 1
                rows.append({"kind": "rating", "user": row.get("user") or row["userId"],
                             "item": row.get("item") or row["movieId"],
                             "rating": float(row["rating"]), "ts": int(float(ts)) * 1000})
        return rows
    return load


def outer_split(rows: list[dict], fraction: float = 0.2) -> np.ndarray:
    """Held-out mask: a stable hash of (user, item) (the same rows in every run)."""
    from pipeline.training.datasets import event_ids, stable_split

    keys = event_ids([f"{r['user']}\x00{r['item']}" for r in rows])
    return stable_split(keys, fraction, seed=7)


def bpr(trainer, arrays, cfg, caps) -> tuple[tuple, float, int]:
    """implicit's BPR on the relevant rows, coordinate-searched on the run's validation split
    with the challenger's caps, refit on every ingested row: factors, that fit's seconds and
    the settings tried."""
    from implicit.cpu.bpr import BayesianPersonalizedRanking
    from threadpoolctl import threadpool_limits

    from pipeline.training.datasets import TEST, TRAIN, VALIDATION
    from pipeline.training.trainers.als import interactions
    from pipeline.training.tuning import coordinate_search

    relevant = trainer._relevant(arrays, cfg)

    def fit(params, parts):
        m = BayesianPersonalizedRanking(factors=params["factors"],
                                        learning_rate=params["learning_rate"],
                                        regularization=params["regularization"],
                                        iterations=params["iterations"], random_state=0)
        with threadpool_limits(1, "blas"):
            m.fit(interactions(arrays, relevant, parts, "relevant"), show_progress=False)
        return (np.asarray(m.user_factors, np.float32), np.asarray(m.item_factors, np.float32),
                None)

    best, tried = coordinate_search(
        BPR_AXES, BPR_START, lambda p: trainer.topk_metrics(
            fit(p, (TRAIN,)), arrays, cfg, VALIDATION).get(cfg.metric), **caps)
    t = time.perf_counter()
    factors = fit(best["params"], (TRAIN, VALIDATION, TEST))
    seconds = time.perf_counter() - t
    return factors, seconds, len(tried)


def grid_peers(trainer, arrays, cfg, ease_max_items: int) -> dict:
    """The plain grid-tuned ALS and EASE (see the module): {label: (factors, info)}."""
    from pipeline.training.datasets import TEST, TRAIN, VALIDATION
    from pipeline.training.trainers.als import fit_als, interactions
    from pipeline.training.trainers.ease import ease_weights

    def met(parts):
        return interactions(arrays, None, parts, "met")

    def val(factors):
        return trainer.topk_metrics(factors, arrays, cfg, VALIDATION).get(cfg.metric) or 0.0

    out = {}
    t = time.perf_counter()
    X_train, X_all = met((TRAIN,)), met((TRAIN, VALIDATION, TEST))
    scored = [(val((*fit_als(X_train, p, iterations=15, seed=0), None)), n)
              for n, p in enumerate(GRID_ALS)]
    best = GRID_ALS[max(scored)[1]]
    out["grid ALS"] = ((*fit_als(X_all, best, iterations=15, seed=0), None),
                       {"chosen": best, "seconds": time.perf_counter() - t})
    n_items = len(arrays["item_ids"])
    if n_items <= ease_max_items:
        t = time.perf_counter()
        dense = np.asarray(X_train.toarray(), np.float32)
        scored = [(val((dense, ease_weights(X_train, lam).T, None)), lam) for lam in GRID_EASE]
        lam = max(scored)[1]
        out["grid EASE"] = ((np.asarray(X_all.toarray(), np.float32),
                             np.ascontiguousarray(ease_weights(X_all, lam).T), None),
                            {"chosen": {"lambda": lam}, "seconds": time.perf_counter() - t})
    return out


def topk_of(factors: tuple, arrays: dict, users: np.ndarray) -> np.ndarray:
    """Top-K item indices of ``users`` (indices) over the items each did not meet."""
    from scipy.sparse import csr_matrix

    from solvers.topk import user_topk

    U, V, b = factors
    met = csr_matrix((np.ones(len(arrays["met_user"])), (arrays["met_user"], arrays["met_item"])),
                     shape=(len(arrays["user_ids"]), len(arrays["item_ids"])))[users]
    return user_topk(U[users], V, K, item_bias=b, seen_indptr=met.indptr,
                     seen_indices=met.indices)[0]


def score_lists(lists: dict, held: dict) -> dict:
    """Mean precision@K and NDCG@K of ``{user: [item id, ...]}`` against ``held`` positives."""
    discount = 1.0 / np.log2(np.arange(2, K + 2))
    p, n = [], []
    for user, positives in held.items():
        got = [1.0 if i in positives else 0.0 for i in lists.get(user, [])[:K]]
        got += [0.0] * (K - len(got))
        p.append(sum(got) / K)
        n.append(float(np.dot(got, discount)) / discount[:min(K, len(positives))].sum())
    return {"P@10": float(np.mean(p)), "NDCG@10": float(np.mean(n))}


def run_one(name: str, rows: list[dict], cfg_path: Path, keep: bool = False,
            ease_max_items: int = 12_000) -> dict:
    from pipeline.ingest.files import ingest_files
    from pipeline.ingest.synthetic import write_jsonl
    from pipeline.serving.artifact import ModelArtifact
    from pipeline.serving.embedded_redis import EmbeddedRedis
    from pipeline.serving.lookup import TopK
    from pipeline.settings import Settings
    from pipeline.training import retrain
    from pipeline.training.config import load_models
    from pipeline.training.datasets import TRAIN, VALIDATION
    from pipeline.training.run_types import DATASET_FORMAT
    from pipeline.training.trainers.als import interactions
    from solvers.persist import read_bundle

    cfg = load_models(cfg_path)["movies"]
    held_mask = outer_split(rows)
    for n, r in enumerate(rows):
        r["event_id"] = f"{name}:{n}"
    home = Path(tempfile.mkdtemp(prefix=f"rs-bench-{name}-", dir=Path.home()))
    try:
        settings = Settings(home=home)
        kept = [r for r, h in zip(rows, held_mask) if not h]
        kept.sort(key=lambda r: r["ts"])
        cut = int(len(kept) * 0.98)
        ingest_files([write_jsonl(kept[:cut], home / "in-0.jsonl")], settings=settings,
                     progress=False)
        models = {"movies": cfg}
        with EmbeddedRedis() as server:
            t = time.perf_counter()
            first = retrain.run("movies", models, settings=settings, redis_url=server.url)
            total = time.perf_counter() - t
            # the last 2% by time arrive: a warm retrain (what users get from here on), and a
            # cold one of the same data for the ratio
            ingest_files([write_jsonl(kept[cut:], home / "in-1.jsonl")], settings=settings,
                         progress=False)
            summary = retrain.run("movies", models, settings=settings, redis_url=server.url)
            cold = retrain.run("movies", models, settings=settings, redis_url=server.url,
                               cold=True, publish=False)
            timings = {"first": total, "warm": summary["seconds"], "cold": cold["seconds"],
                       "first_decision": first["decision"]}
            tuned = first["train"]    # the first run tuned; the warm one reused its choice
            run_dir = Path(summary["dataset"]["run_dir"])
            _, arrays = read_bundle(run_dir / "dataset", fmt=DATASET_FORMAT)
            relevance = float(arrays["relevance"])
            held: dict = {}
            for r, h in zip(rows, held_mask):
                if h and not (r.get("rating", np.inf) < relevance):
                    held.setdefault(r["user"], set()).add(r["item"])
            known = set(arrays["user_ids"].tolist())
            held = {u: p for u, p in held.items() if u in known}
            users = sorted(held)
            with TopK(server.url, namespace=settings.namespace) as topk:
                answers = topk.recommend_many("movies", users, k=K)
            lists = {"served": {a.user: [i for i, _ in a.items] for a in answers}}
            sources = sorted({a.source for a in answers})
            empty = sum(1 for a in answers if not a.items)
        index = {u: j for j, u in enumerate(arrays["user_ids"].tolist())}
        user_idx = np.array([index[u] for u in users])
        item_ids = arrays["item_ids"]
        gate = summary["gate"]
        tr = summary["train"]
        ch = tr.get("challenger", {})
        blend_dir = "blend-" + (ch.get("blend") or {}).get("name", "als")
        for label, where in (("AltSVM", "artifact"), ("ALS (challenger)", "challenger-als"),
                             ("EASE (challenger)", "challenger-ease"), ("blend", blend_dir)):
            d = run_dir / where
            if not d.is_dir() and gate["publishes"] == ("model" if where == "artifact"
                                                        else where):
                d = Path(summary["publish"]["checkpoint"]) / "artifact"   # published
            if d.is_dir():
                art = ModelArtifact.load(d)
                top = topk_of((art.user_factors, art.item_factors, art.item_bias), arrays,
                              user_idx)
                lists[label] = {u: [item_ids[i] for i in t if i >= 0]
                                for u, t in zip(users, top)}
        trainer = cfg.family.new_trainer()
        caps = {"max_settings": int(cfg.tune.get("max_settings", 12)),
                "budget_seconds": float(cfg.tune.get("budget_seconds", 30))}
        bpr_factors, bpr_seconds, bpr_tried = bpr(trainer, arrays, cfg, caps)
        top = topk_of(bpr_factors, arrays, user_idx)
        lists["BPR"] = {u: [item_ids[i] for i in t if i >= 0] for u, t in zip(users, top)}
        peers = grid_peers(trainer, arrays, cfg, ease_max_items)
        for label, (factors, _) in peers.items():
            top = topk_of(factors, arrays, user_idx)
            lists[label] = {u: [item_ids[i] for i in t if i >= 0] for u, t in zip(users, top)}
        liked = trainer._relevant(arrays, cfg)
        pop = np.bincount(arrays["met_item"][liked], minlength=len(item_ids)).astype(np.float32)
        top = topk_of((np.ones((len(index), 1), np.float32), pop[:, None], None), arrays,
                      user_idx)
        lists["popularity"] = {u: [item_ids[i] for i in t if i >= 0]
                               for u, t in zip(users, top)}
        # fit seconds at the chosen settings, on the same rows (TRAIN + VALIDATION)
        first_ch = tuned.get("challenger", {})   # a warm run may skip ALS (standing.py)
        chosen = next(t["chosen"] for c in (ch, first_ch) for t in c.get("tried", [])
                      if "chosen" in t)
        from pipeline.training.trainers.als import ITERATIONS, fit_als
        X = interactions(arrays, liked, (TRAIN, VALIDATION), chosen["input"])
        t = time.perf_counter()
        fit_als(X, chosen, iterations=ITERATIONS, seed=0)
        als_fit = time.perf_counter() - t
        return {"name": name, "scores": {k: score_lists(v, held) for k, v in lists.items()},
                "served": gate["publishes"], "sources": sources, "empty": empty,
                "n_users": len(users), "decision": summary["decision"],
                "reason": summary.get("reason"), "train_seconds": total, "timings": timings,
                "altsvm_final_fit": tr["fit_seconds"] - (tr.get("tuning") or {}).get(
                    "seconds", 0.0),
                "altsvm_fit_total": tr["fit_seconds"], "als_fit": als_fit,
                "bpr_fit": bpr_seconds, "bpr_tried": bpr_tried, "tuning": tuned.get("tuning"),
                "als_tried": len([t for t in first_ch.get("tried", []) if "params" in t]),
                "als_chosen": chosen, "stats": summary["dataset"]["stats"],
                "window": summary["dataset"]["window"].get("warning"),
                "blend": ch.get("blend"), "others": ch.get("others", []),
                "peers": {k: v[1] for k, v in peers.items()}}
    finally:
        if not keep:
            shutil.rmtree(home, ignore_errors=True)


def report(r: dict) -> None:
    st = r["stats"]
    print(f"\n== {r['name']}: {st['users']} users, {st['items']} items, {st['met']} met rows "
          f"ingested (80%), relevance >= {st['relevance']:g}; {r['n_users']} users scored")
    if r["window"]:
        print(f"   WARNING {r['window']}")
    t = r["tuning"] or {}
    print(f"   AltSVM tuner: {len(t.get('tried', []))} settings in {t.get('seconds', 0):.1f} s, "
          f"chose {t.get('choice')} reg_ratio {t.get('reg_ratio')}")
    print(f"   ALS: {r['als_tried']} settings, chose {r['als_chosen']}; BPR: {r['bpr_tried']} "
          f"settings; blend {(r['blend'] or {}).get('name')} weight "
          f"{(r['blend'] or {}).get('weight')}")
    for other in r["others"]:
        print(f"   {other['name']}: {other.get('skipped') or other['tried'][-1]}")
    for label, info in r["peers"].items():
        print(f"   {label}: chose {info['chosen']} in {info['seconds']:.1f} s")
    print(f"   {'lists':<18} {'P@10':>7} {'NDCG@10':>8}")
    for name, m in r["scores"].items():
        print(f"   {name:<18} {m['P@10']:>7.4f} {m['NDCG@10']:>8.4f}")
    sc = r["scores"]
    pop = sc["popularity"]["P@10"]
    peer_name = max((k for k in ("grid ALS", "grid EASE") if k in sc),
                    key=lambda k: sc[k]["P@10"])
    peer = sc[peer_name]["P@10"]
    print(f"   served: {r['served']} (sources {r['sources']}, {r['empty']} empty answers); "
          f"{r['decision']}: {r['reason']}")
    print(f"   targets P@10: served/best peer ({peer_name}) {sc['served']['P@10'] / peer:.3f} "
          f"(>= 1.0)  served/popularity {sc['served']['P@10'] / pop:.2f} (>= 1.5)  "
          f"[AltSVM/best peer {sc['AltSVM']['P@10'] / peer:.3f}: reported]")
    final = r["altsvm_final_fit"]
    print(f"   fit s: AltSVM final {final:.2f} (tuning and all {r['altsvm_fit_total']:.1f})  "
          f"ALS {r['als_fit']:.2f}  BPR {r['bpr_fit']:.2f}  AltSVM/ALS "
          f"{final / r['als_fit']:.1f}x (<= 3)")
    tm = r["timings"]
    print(f"   `train movies`: first run {tm['first']:.1f} s (<= 45, {tm['first_decision']}); "
          f"after 2% more events warm {tm['warm']:.1f} s vs cold {tm['cold']:.1f} s: "
          f"{tm['warm'] / tm['cold']:.2f}x (<= 0.3)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="movielens,lastfm",
                    help="comma-separated of movielens, lastfm; empty ('') for --ratings alone")
    ap.add_argument("--ratings", help="an extra user,item,rating[,ts] CSV or u.data file")
    ap.add_argument("--config", default=str(REPO / "dags" / "models.toml"))
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--keep", action="store_true", help="keep each run's home (~/rs-bench-*)")
    ap.add_argument("--ease-max-items", type=int, default=12_000,
                    help="the grid EASE peer is skipped over this many items")
    args = ap.parse_args(argv)
    sets = {"movielens": movielens, "lastfm": lastfm}
    names = [n for n in args.data.split(",") if n]
    unknown = [n for n in names if n not in sets]
    if unknown:
        ap.error(f"--data {','.join(unknown)}: expected some of {', '.join(sets)} (or '' with "
                 "--ratings)")
    todo = [(n, sets[n]) for n in names]
    if args.ratings:
        todo.append((Path(args.ratings).name, ratings_file(args.ratings)))
    results = []
    for name, load in todo:
        if load in (movielens, lastfm) and not DATA.is_dir():
            print(f"{name}: {DATA} is absent; skipped")
            continue
        r = run_one(name, load(), Path(args.config), keep=args.keep,
                    ease_max_items=args.ease_max_items)
        report(r)
        results.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
