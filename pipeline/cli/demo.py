"""``rankstream demo``: the whole pipeline on embedded defaults, with nothing started by hand.

Events (synthetic with planted structure, or a MovieLens ``u.data`` via ``--ratings``) arrive as
a stream: the first 90% by time is ingested through the embedded file source into the event
store; AltSVM (ratings) and TopPush (outcomes) are trained, evaluated, gated and published to a
private redis-server; top-K lookups are answered; then a fresh 2% of events arrives and both
models retrain warm-started from their checkpoints, next to a cold fit on the same data for
comparison. Prints a short report and writes it as JSON.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import numpy as np


def add_arguments(parser) -> None:
    parser.add_argument("--ratings", help="a MovieLens-style u.data file (user item rating ts, "
                        "tab separated) instead of the synthetic ratings")
    parser.add_argument("--home", default=".rankstream/demo",
                        help="working directory, wiped at the start (default %(default)s)")
    parser.add_argument("--report", help="JSON report path (default HOME/report.json)")
    parser.add_argument("--users", type=int, default=1500, help="synthetic users")
    parser.add_argument("--items", type=int, default=800, help="synthetic items")
    parser.add_argument("--seed", type=int, default=0)


def _models():
    from pipeline.training.config import parse_model

    specs = {
        "movies": {"algorithm": "altsvm", "kinds": ["rating"],
                   "params": {"rank": 10, "item_bias": True, "comparisons": "mixed",
                              "max_pairs_per_user": 500, "random_state": 0},
                   "evaluation": {"holdout": 5},
                   "gate": {"tolerance": 0.01}, "publish": {"top_k": 50}},
        "ads": {"algorithm": "toppush", "kinds": ["outcome"], "params": {"reg": 1.0},
                "evaluation": {"fraction": 0.2, "metric": "average_precision"},
                "gate": {"tolerance": 0.02}, "publish": {"top_k": 50}},
    }
    return {name: parse_model(name, spec, "demo") for name, spec in specs.items()}


def _warm_up() -> float:
    """Compile (or load from numba's cache) the solvers' kernels, so fit times are fit times."""
    import solvers

    return sum(solvers.warm_up().values())


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


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def run(args) -> int:
    from pipeline.cli.train import format_summary
    from pipeline.ingest import synthetic
    from pipeline.ingest.files import ingest_files
    from pipeline.serving.embedded_redis import EmbeddedRedis
    from pipeline.settings import Settings
    from pipeline.training import retrain
    from solvers.persist import read_bundle

    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # unwinds: the embedded Redis stops
    started = time.perf_counter()
    home = Path(args.home)
    shutil.rmtree(home, ignore_errors=True)
    (home / "events").mkdir(parents=True)
    settings = Settings(home=home)
    models = _models()
    say = print
    say(f"rankstream demo: working directory {home}\n")

    if args.ratings:
        r0, r1, fmt, n_ratings = _movielens_stream(Path(args.ratings), home / "events")
        source = f"MovieLens-style file {args.ratings}"
    else:
        r0, r1, fmt, n_ratings = _synthetic_stream(home / "events", args)
        source = f"synthetic: {args.users} users x {args.items} items, planted rank-6 tastes"
    outcomes = synthetic.outcome_events(n_items=5000, seed=args.seed)
    o0, o1 = _split_stream(outcomes, 0.9, 0.02)
    o0 = synthetic.write_jsonl(o0, home / "events" / "outcomes-0.jsonl")
    o1 = synthetic.write_jsonl(o1, home / "events" / "outcomes-1.jsonl")

    report: dict = {"source": source, "events": {"ratings": n_ratings, "outcomes": len(outcomes)}}
    t = time.perf_counter()
    s1 = ingest_files([r0], "rating", settings=settings, fmt=fmt, progress=False)
    s2 = ingest_files([o0], "outcome", settings=settings, progress=False)
    report["ingest_initial"] = {"events": sum(s1.events.values()) + sum(s2.events.values()),
                                "seconds": round(time.perf_counter() - t, 2)}
    say(f"1. ingested the first 90% of the stream: {report['ingest_initial']['events']:,} "
        f"events in {report['ingest_initial']['seconds']:.2f} s ({source})")

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

        users = [str(u) for u in read_bundle(
            Path(report["initial"]["movies"]["dataset"]["run_dir"]) / "dataset",
            fmt=retrain.DATASET_FORMAT)[1]["user_ids"][:50]]
        report["lookups"] = _lookups(url, users)
        lk = report["lookups"]
        say(f"3. top-K lookups from Redis: p50 {lk['latency_us']['p50']:.0f} us, p99 "
            f"{lk['latency_us']['p99']:.0f} us over {lk['latency_us']['n']} calls")
        for user, items in lk["samples"].items():
            say(f"   user {user}: " + ", ".join(f"{i} ({s:.2f})" for i, s in items))
        say(f"   a new user gets the {lk['unknown_user']['source']} list: "
            f"{', '.join(map(str, lk['unknown_user']['items']))}")
        say("   ads, best candidates: " + ", ".join(f"{i}" for i, _ in lk["ads_top5"]))

        t = time.perf_counter()
        ingest_files([r1], "rating", settings=settings, fmt=fmt, progress=False)
        ingest_files([o1], "outcome", settings=settings, progress=False)
        say(f"4. a fresh 2% of events arrived (ingested in {time.perf_counter() - t:.2f} s); "
            "retraining warm vs cold:")
        report["retrain"] = {}
        for name in models:
            warm = retrain.run(name, models, settings=settings, redis_url=url)
            cold = retrain.run(name, models, settings=settings, redis_url=url, cold=True,
                               publish=False)
            w, c = warm["train"], cold["train"]
            metric = models[name].metric
            entry = {"warm_seconds": w["fit_seconds"], "cold_seconds": c["fit_seconds"],
                     "speedup": round(c["fit_seconds"] / max(w["fit_seconds"], 1e-9), 2),
                     "warm_iterations": w["n_iter"], "cold_iterations": c["n_iter"],
                     f"warm_{metric}": w["metrics"].get(metric),
                     f"cold_{metric}": c["metrics"].get(metric),
                     "decision": warm["decision"],
                     "version": (warm.get("publish") or {}).get("version")}
            report["retrain"][name] = entry
            say(f"   {name}: warm {entry['warm_seconds']:.2f} s / {entry['warm_iterations']} "
                f"it vs cold {entry['cold_seconds']:.2f} s / {entry['cold_iterations']} it "
                f"({entry['speedup']:.1f}x); {metric} warm {entry[f'warm_{metric}']:.4f} "
                f"cold {entry[f'cold_{metric}']:.4f}; {entry['decision']}"
                + (f" as v{entry['version']}" if entry["version"] else ""))
    report["seconds"] = round(time.perf_counter() - started, 1)
    path = Path(args.report) if args.report else home / "report.json"
    path.write_text(json.dumps(report, indent=2, default=str))
    say(f"\ndone in {report['seconds']:.1f} s; report: {path}")
    return 0
