"""``rankstream demo``: the whole pipeline on embedded defaults, with nothing started by hand.

Events (synthetic with planted structure, or a MovieLens ``u.data`` via ``--ratings``) arrive as
a stream: the first 90% by time is ingested through the embedded file source into the event
store; AltSVM (ratings), TopPush (outcomes) and NPSVOR (reviews: synthetic, or ``--reviews``)
are trained, evaluated, gated and published to a private redis-server; top-K lookups are
answered (and new reviews rated and ranked on demand); then a fresh 2% of events arrives and
every model retrains warm-started from its checkpoint, next to a cold fit on the same data for
comparison (for reviews: MAE warm vs cold). Prints a short report and writes it as JSON.

The query ranker (kernel RankSVM on judgments: synthetic with a planted non-linear relevance,
or a LETOR 4.0 file via ``--letor``) is trained and published the same way; the report sets its
NDCG@10 on held-out queries beside its family's linear challenger's (trained and gated by the
retrain loop) and the best single feature's, and shows a query's precomputed list next to its
docs re-ranked from the published support set. The streams are made in :mod:`.demo_streams`.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np

from pipeline.cli import demo_streams
from pipeline.cli.demo_streams import read_reviews as _read_reviews  # noqa: F401 (tests)


def add_arguments(parser) -> None:
    parser.add_argument("--ratings", help="a MovieLens-style u.data file (user item rating ts, "
                        "tab separated) instead of the synthetic ratings")
    parser.add_argument("--reviews", help="reviews to rate instead of the synthetic ones: a "
                        "text file of 'item<TAB>rating<TAB>text' lines in time order, ratings "
                        "integers >= 1 (see demo_streams.read_reviews)")
    parser.add_argument("--letor", help="a LETOR 4.0 file ('label qid:Q 1:v ... #docid = D', "
                        ".txt or .txt.gz, e.g. MQ2008's Fold1/train.txt.gz) instead of the "
                        "synthetic judgments")
    parser.add_argument("--judgments", type=int, help="judgments of the query ranker "
                        "(default 3000 synthetic ones, or all of the --letor file; of a file, "
                        "whole queries in file order)")
    parser.add_argument("--home", default=".rankstream/demo",
                        help="working directory, wiped at the start if the demo made it; a "
                        "non-empty directory it did not make is refused (default %(default)s)")
    parser.add_argument("--report", help="JSON report path (default HOME/report.json)")
    parser.add_argument("--users", type=int, default=1500, help="synthetic users")
    parser.add_argument("--items", type=int, default=800, help="synthetic items")
    parser.add_argument("--seed", type=int, default=0)


DEMO_MODELS = Path(__file__).with_name("demo_models.toml")


def demo_models() -> dict:
    """The demo's model configs (:data:`DEMO_MODELS`, validated like dags/models.toml)."""
    from pipeline.training.config import load_models

    return load_models(DEMO_MODELS)


def _warm_up() -> float:
    """Compile (or load from numba's cache) the solvers' kernels, so fit times are fit times."""
    import solvers

    return sum(solvers.warm_up().values())


def _review_lookups(url: str, unseen: list) -> dict:
    """The published reviews model rates and ranks reviews it has not seen (the fresh ones,
    before they are ingested), and serves its best-rated items."""
    from pipeline.serving.lookup import TopK

    shown = unseen[:3]
    with TopK(url) as topk:
        best = topk.recommend("reviews", None, k=5)
        rated = [(e, topk.predict_rating("reviews", features=e.get("features"),
                                         text=e.get("text"))) for e in shown]
        ranked = topk.rank("reviews", [(e["event_id"], {"features": e.get("features"),
                                                        "text": e.get("text")})
                                       for e in unseen[:20]], k=5)
    label = {e["event_id"]: e["label"] for e in unseen}
    return {"best_items": [(i, round(s, 3)) for i, s in best.items],
            "rated": [{"text": (e.get("text") or "")[:60], "true": e["label"],
                       "predicted": p.rating, "score": round(p.score, 3)} for e, p in rated],
            "ranked": [(i, round(s, 3), label[i]) for i, s in ranked.items],
            "ranked_from": min(20, len(unseen))}


def _lookups(url: str, users: list, n: int = 2000) -> dict:
    from pipeline.serving.lookup import TopK

    with TopK(url) as topk:
        samples = {u: topk.recommend("movies", u, k=5) for u in users[:3]}
        ads = topk.recommend("ads", None, k=5)
        times = []
        for i in range(n):
            t = time.perf_counter()
            topk.recommend("movies", users[i % len(users)], k=10)
            times.append(time.perf_counter() - t)
        cold = topk.recommend("movies", "someone-new", k=3)
    times = np.array(times) * 1e6
    return {"samples": {u: [(i, round(s, 3)) for i, s in r.items] for u, r in samples.items()},
            "unknown_user": {"source": cold.source, "items": [i for i, _ in cold.items]},
            "ads_top5": [(i, round(s, 3)) for i, s in ads.items],
            "latency_us": {"p50": round(float(np.percentile(times, 50)), 1),
                           "p99": round(float(np.percentile(times, 99)), 1), "n": n}}


def _dataset_arrays(summary: dict) -> dict:
    """The arrays of the dataset a run's summary trained on."""
    from pipeline.training.run_types import DATASET_FORMAT
    from solvers.persist import read_bundle

    return read_bundle(Path(summary["dataset"]["run_dir"]) / "dataset", fmt=DATASET_FORMAT)[1]


def _challenged(cfg):
    """The query ranker's config gated against its family's first challenger (the same
    solver with a linear kernel), trained and scored beside it by the retrain loop."""
    from dataclasses import replace

    if cfg.gate["challenger"] != "none" or not cfg.family.challengers:
        return cfg
    return replace(cfg, gate={**cfg.gate, "challenger": cfg.family.challengers[0]})


def _query_ranker(url: str, summary: dict, cfg, n: int = 200) -> dict:
    """The query ranker against its linear challenger (tuned on the same split by the retrain
    loop) and the best single feature on the held-out queries; one held-out query's
    precomputed list next to its docs re-ranked by ``TopK.rank`` from the published support
    set, with that call's latency."""
    from pipeline.serving.lookup import TopK
    from pipeline.training.arrays import csr_from_arrays
    from pipeline.training.run_types import Decision

    arrays = _dataset_arrays(summary)
    X, test = csr_from_arrays(arrays).toarray(), arrays["test_mask"]
    query, label, k = arrays["query"], arrays["label"], int(cfg.evaluation["k"])
    ndcg = f"ndcg@{k}"
    best = summary["train"]["baselines"].get("best_feature", {})
    linear = summary["train"].get("challenger") or {}
    out = {"held_out_queries": int(np.unique(query[test]).size), "metric": ndcg,
           "kernel": summary["train"]["metrics"].get(ndcg),
           "linear": linear.get("metrics", {}).get(ndcg),
           "linear_fit_seconds": linear.get("fit_seconds"),
           "best_feature": best.get(ndcg), "feature": best.get("feature"),
           "feature_sign": best.get("sign"), "support": summary["train"]["n_support"]}
    if summary["decision"] != Decision.PUBLISHED:
        return out
    # the held-out query with the most docs among those with a relevant one
    relevant = np.bincount(query[test], weights=label[test] > 0, minlength=query.max() + 1)
    docs = np.bincount(query[test], minlength=query.max() + 1)
    qi = int(np.argmax(np.where(relevant > 0, docs, 0)))
    rows = np.flatnonzero(query == qi)
    qid = str(arrays["query_ids"][qi])
    doc_ids = arrays["doc_ids"][arrays["doc"][rows]].tolist()
    grade = dict(zip(doc_ids, label[rows].tolist()))
    # the docs' features in the training file's numbering (a LETOR file's start at 1: the
    # version's scorer reads a dense list from its feature_base, see pipeline/training/steps)
    base = int(X.shape[1] > 0 and not X[:, 0].any())
    candidates = [(d, x) for d, x in zip(doc_ids, X[rows, base:].tolist())]
    with TopK(url) as topk:
        listed = topk.recommend("search", qid, k=5)
        ranked = topk.rank("search", candidates, k=5, query=qid)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            topk.rank("search", candidates, k=10, query=qid)
            times.append(time.perf_counter() - t)
        unknown = topk.recommend("search", "a query nobody judged", k=3)
    times = np.array(times) * 1e6
    out.update(query=qid, candidates=len(rows),
               precomputed=[(d, round(s, 3), grade[d]) for d, s in listed.items],
               rank_source=ranked.source,
               scored=[(d, round(s, 3), grade[d]) for d, s in ranked.items],
               unknown_query={"source": unknown.source, "docs": [d for d, _ in unknown.items]},
               rank_latency_us={"p50": round(float(np.percentile(times, 50)), 1),
                                "p99": round(float(np.percentile(times, 99)), 1), "n": n})
    return out


def _say_query_ranker(say, qr: dict, source: str) -> None:
    feature = (f"(x{qr['feature']}{'' if qr['feature_sign'] > 0 else ', reversed'})"
               if qr["feature"] is not None else "(none)")
    def value(v):
        return "n/a" if v is None else f"{v:.4f}"

    say(f"   query ranker ({source}): {qr['metric']} on {qr['held_out_queries']} held-out "
        f"queries: RBF kernel {value(qr['kernel'])}, linear challenger {value(qr['linear'])}, "
        f"best single feature {feature} {value(qr['best_feature'])}")
    if "query" not in qr:
        return
    say(f"   query {qr['query']}: precomputed top 5 (doc, label) "
        + ", ".join(f"{d} ({g})" for d, _, g in qr["precomputed"]))
    say(f"   its {qr['candidates']} docs re-ranked from the {qr['support']:,} support vectors "
        "(TopK.rank): " + ", ".join(f"{d} ({g})" for d, _, g in qr["scored"])
        + f"; p50 {qr['rank_latency_us']['p50']:.0f} us, p99 "
        f"{qr['rank_latency_us']['p99']:.0f} us")
    say(f"   an unknown query gets the {qr['unknown_query']['source']} list (docs by mean "
        "score): " + ", ".join(qr["unknown_query"]["docs"]))


MARKER = ".rankstream-demo"   # in a working directory the demo made: it may wipe it
# what an earlier demo (before the marker) left: such a directory is the demo's too
EARLIER_DEMO = {"checkpoints", "events", "locks", "report.json", "runs", "store",
                "dead-letter"}


def fresh_home(home: Path) -> None:
    """Make ``home`` an empty working directory marked as the demo's. An existing directory
    is wiped only when it carries the marker (the demo made it) or holds exactly what an
    earlier demo left (its report, store and runs, nothing else); a non-empty directory
    otherwise, or a file, is refused: the demo deletes nothing it did not make."""
    if home.exists():
        if not home.is_dir():
            raise ValueError(f"--home {home} is a file, not a directory: give a new or empty "
                             "directory")
        names = {p.name for p in home.iterdir()}
        earlier = {"report.json", "store", "runs"} <= names <= EARLIER_DEMO
        if (home / MARKER).is_file() or earlier:
            shutil.rmtree(home)
        elif names:
            raise ValueError(f"--home {home} holds files the demo did not make; it deletes "
                             "nothing it did not make: give a new or empty directory")
    home.mkdir(parents=True, exist_ok=True)
    (home / MARKER).write_text("made by `rankstream demo`, which wipes this directory when it "
                               "runs again\n")


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _ingest(streams: dict, part: int, settings) -> int:
    """Ingest part ``part`` (0: the first 90%, 1: the fresh 2%) of every stream; the events."""
    from pipeline.ingest.files import ingest_files

    return sum(sum(ingest_files([files[part]], kind, settings=settings, progress=False,
                                **({"fmt": streams["fmt"]} if kind == "rating" else {}))
                   .events.values()) for kind, files in streams["files"].items())


def _answer_lookups(url: str, report: dict, models: dict, streams: dict, say) -> None:
    """Step 3: the published models answer (top-K lists, new reviews, re-ranked queries)."""
    from pipeline.training.run_types import Decision

    users = [str(u) for u in _dataset_arrays(report["initial"]["movies"])["user_ids"][:50]]
    lk = report["lookups"] = _lookups(url, users)
    say(f"3. top-K lookups from Redis: p50 {lk['latency_us']['p50']:.0f} us, p99 "
        f"{lk['latency_us']['p99']:.0f} us over {lk['latency_us']['n']} calls")
    for user, items in lk["samples"].items():
        say(f"   user {user}: " + ", ".join(f"{i} ({s:.2f})" for i, s in items))
    say(f"   a new user gets the {lk['unknown_user']['source']} list: "
        f"{', '.join(map(str, lk['unknown_user']['items']))}")
    say("   ads, best candidates: " + ", ".join(f"{i}" for i, _ in lk["ads_top5"]))
    if report["initial"]["reviews"].get("decision") == Decision.PUBLISHED:
        rv = report["review_lookups"] = _review_lookups(url, streams["unseen"])
        say(f"   reviews ({streams['sources']['reviews']}), best-rated items: "
            + ", ".join(f"{i} ({s:.2f})" for i, s in rv["best_items"]))
        for r in rv["rated"]:
            say(f"   a new review rated {r['predicted']} (true {r['true']}): {r['text']!r}")
        say(f"   {rv['ranked_from']} new reviews ranked, top 5 (true ratings): "
            + ", ".join(str(t) for _, _, t in rv["ranked"]))
    if report["initial"]["search"].get("train"):
        qr = report["query_ranker"] = _query_ranker(url, report["initial"]["search"],
                                                    models["search"])
        _say_query_ranker(say, qr, streams["sources"]["judgments"])


def _warm_vs_cold(name: str, models: dict, settings, url: str) -> dict:
    """Retrain ``name`` warm (published) and cold (not published) on the same data."""
    from pipeline.training import retrain

    warm = retrain.run(name, models, settings=settings, redis_url=url)
    cold = retrain.run(name, models, settings=settings, redis_url=url, cold=True,
                       publish=False)
    w, c, metric = warm["train"], cold["train"], models[name].metric
    return {"warm_seconds": w["fit_seconds"], "cold_seconds": c["fit_seconds"],
            "speedup": round(c["fit_seconds"] / max(w["fit_seconds"], 1e-9), 2),
            "warm_iterations": w["n_iter"], "cold_iterations": c["n_iter"],
            f"warm_{metric}": w["metrics"].get(metric),
            f"cold_{metric}": c["metrics"].get(metric), "decision": warm["decision"],
            "version": (warm.get("publish") or {}).get("version")}


def _say_retrain(say, name: str, entry: dict, metric: str) -> None:
    say(f"   {name}: warm {entry['warm_seconds']:.2f} s / {entry['warm_iterations']} "
        f"it vs cold {entry['cold_seconds']:.2f} s / {entry['cold_iterations']} it "
        f"({entry['speedup']:.1f}x); {metric} warm {entry[f'warm_{metric}']:.4f} "
        f"cold {entry[f'cold_{metric}']:.4f}; {entry['decision']}"
        + (f" as v{entry['version']}" if entry["version"] else ""))


def run(args) -> int:
    from pipeline.cli.demo_fresh import show_fresh
    from pipeline.cli.train import format_summary
    from pipeline.serving.embedded_redis import EmbeddedRedis
    from pipeline.settings import Settings
    from pipeline.training import retrain

    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # unwinds: the embedded Redis stops
    started = time.perf_counter()
    home = Path(args.home)
    try:
        fresh_home(home)
    except ValueError as err:
        print(f"rankstream demo: {err}", file=sys.stderr)
        return 2
    settings = Settings(home=home)
    models = demo_models()
    models["search"] = _challenged(models["search"])
    say = print
    say(f"rankstream demo: working directory {home}\n")
    streams = demo_streams.streams(home, args)
    source = streams["sources"]["ratings"]
    report: dict = {"source": source, "events": streams["counts"]}
    t = time.perf_counter()
    report["ingest_initial"] = {"events": _ingest(streams, 0, settings),
                                "seconds": round(time.perf_counter() - t, 2)}
    say(f"1. ingested the first 90% of the stream: {report['ingest_initial']['events']:,} "
        f"events in {report['ingest_initial']['seconds']:.2f} s ({source})")
    say("   compiling the solvers' kernels, or loading them from numba's cache (the first run "
        "on a machine compiles: about two minutes; infra/setup.sh does it ahead)", flush=True)
    jit = _warm_up()
    report["jit_warm_up_seconds"] = round(jit, 2)
    with EmbeddedRedis() as server:
        url = server.url
        say(f"2. embedded redis-server at {url}; solvers compiled or loaded from numba's "
            f"cache in {jit:.1f} s; training:")
        report["initial"] = {}
        for name in models:
            summary = retrain.run(name, models, settings=settings, redis_url=url)
            report["initial"][name] = summary
            say("   " + format_summary(summary).replace("\n", "\n   "))
        _answer_lookups(url, report, models, streams, say)
        report["fresh"] = show_fresh(url, settings, models, list(report["lookups"]["samples"]),
                                     say)
        t = time.perf_counter()
        _ingest(streams, 1, settings)
        say(f"5. a fresh 2% of events arrived (ingested in {time.perf_counter() - t:.2f} s); "
            "retraining warm vs cold:")
        report["retrain"] = {}
        for name in models:
            report["retrain"][name] = _warm_vs_cold(name, models, settings, url)
            _say_retrain(say, name, report["retrain"][name], models[name].metric)
    report["seconds"] = round(time.perf_counter() - started, 1)
    path = Path(args.report) if args.report else home / "report.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    say(f"\ndone in {report['seconds']:.1f} s; report: {path}")
    say(f"each run's page: rankstream report MODEL --home {home}  (e.g. movies; "
        "runs/MODEL/*/report.html)")
    return 0
