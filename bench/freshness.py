"""Freshness: how soon a user's answer moves with their events, under load, and what the
refresher's lists are worth between retrains (issue 35, item 5).

1. **Latency under load** (``--part latency``): a Kafka broker (``infra/kafka/start.sh``) and a
   redis-server (``infra/redis/start.sh``) on free loopback ports, stopped by pid at the end;
   MovieLens 100K (``../shared/data/movielens-100k/u.data``; synthetic ratings of the same
   shape when absent, said so; ``--items N``: synthetic ratings of that shape over a catalogue
   of N items) ingested and the shipped ``movies`` config of
   ``dags/models.toml``, unedited, trained and published; ``rankstream refresh movies`` runs as
   a subprocess (``RANKSTREAM_*`` environment), as users run it. Then, for ``--seconds``:

   * a load process produces ``--rate`` rating events/s (paced every 10 ms; JSON, one message
     per event, to ``rankstream.rating``) for random MovieLens users and items;
   * a lookup process calls ``TopK.recommend`` for random users at ``--lookup-rate`` calls/s
     (0: as fast as it can), interleaved in blocks with a raw redis-py ``GET`` of a random
     user's ``topk`` key of the served version: the same process, the same moments;
   * this process sends ``--probes`` probe events/s and polls each probed user every 10 ms:
     four of five are a known user rating the item at the top of their current list (reflected
     when the item left the list and ``source == "fresh"``), one a new user's first three
     ratings (reflected when the answer's ``source == "fresh"``, no longer the fallback).
     Freshness latency is from just before the producer's ``send`` to the first lookup that
     reflects it.

   Prints the freshness latency p50/p99/max (targets p50 <= 0.5 s, p99 <= 2 s), the event rate
   produced and consumed, the refresher's own lag histogram over the load (the difference of
   ``HOME/refresh/movies@*.json``, read as one, before and after), and the lookups' p50 vs the
   raw GET's (target <= 1.2x).

2. **Quality** (``--part quality``), MovieLens 100K and Last.fm 2K, read and split by
   ``bench/recommend_datasets.py``'s own functions (imported): its outer split holds out a stable
   random 20% of (user, item) rows; the other 80% (the training part) is ordered by time
   (stable sort on ``ts``; Last.fm's row order stands in for time); its first 90% is ingested
   and trained with the shipped ``movies`` config (unedited) and published to an embedded
   redis-server; the last 10% is streamed through ``Refresher.apply_events`` + ``flush`` (no
   Kafka). Every user of the training part with a relevant held-out item is scored
   (precision@10 and NDCG@10 of their top-10 against the held-out positives, by
   ``recommend_datasets.score_lists``):

   (a) ``unrefreshed``: the version's lists as served before the refresher wrote;
   (b) ``refreshed``: the lists lookups answer after it wrote (``source == "fresh"`` for the
       users the stream touched);
   (c) ``full retrain``: the last 10% ingested too and ``retrain.run`` again (what the next
       scheduled retrain does: warm-started, the gate deciding), its served lists.

   Prints the three and the ratios refreshed/unrefreshed (target >= 1.0) and refreshed/full
   retrain (target >= 0.95), per data set, with the touched users apart.

    .venv/bin/python bench/freshness.py                         # both parts
    .venv/bin/python bench/freshness.py --part latency --seconds 60 --rate 2000
    .venv/bin/python bench/freshness.py --part latency --items 40000     # a large catalogue
    .venv/bin/python bench/freshness.py --part latency --refreshers 2 --rate 6000   # scale-out
    .venv/bin/python bench/freshness.py --part latency --users 20000 --refreshers 2  # many users
    .venv/bin/python bench/freshness.py --part latency --seconds 600    # RSS over 10 minutes

``--refreshers N`` runs N ``rankstream refresh movies`` processes in the model's group over
topics of ``--partitions`` partitions (default 4 when N > 1); the load is keyed by user as
``rankstream produce`` sends it. Each refresher's RSS is sampled every second and printed after
the first minute (the warm-up) and at the end (target: at most 10% growth).
    .venv/bin/python bench/freshness.py --part quality --data movielens,lastfm
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = "movies"
CONFIG = REPO / "dags" / "models.toml"
K = 10
PROBE_TIMEOUT = 30.0       # a probe not reflected by then counts as missed (inf)
POLL = 0.010


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _pct(values, q) -> float:
    """Nearest-rank percentile (``inf``, a probe never reflected, stays ``inf``)."""
    v = sorted(values)
    if not v:
        return float("nan")
    return float(v[min(len(v) - 1, max(0, int(np.ceil(q / 100 * len(v))) - 1))])


# ================================================================ part 2: quality

def quality_one(name: str, rows: list[dict]) -> dict:
    """Train on the first 90% (by time) of recommend_datasets' 80% training part, stream the
    last 10% through the refresher, retrain on all of it; score (a), (b), (c)."""
    import recommend_datasets as rd

    from pipeline.ingest.files import ingest_files
    from pipeline.ingest.open_store import open_store
    from pipeline.ingest.synthetic import write_jsonl
    from pipeline.refresh.refresher import Refresher
    from pipeline.serving.embedded_redis import EmbeddedRedis
    from pipeline.serving.lookup import TopK
    from pipeline.settings import Settings, state_dir
    from pipeline.training import retrain
    from pipeline.training.config import load_models
    from pipeline.training.run_types import DATASET_FORMAT
    from solvers.persist import read_bundle

    models = {MODEL: load_models(CONFIG)[MODEL]}
    held_mask = rd.outer_split(rows)
    for n, r in enumerate(rows):
        r["event_id"] = f"{name}:{n}"
    kept = sorted((r for r, h in zip(rows, held_mask) if not h), key=lambda r: r["ts"])
    cut = int(len(kept) * 0.9)
    first, stream = kept[:cut], kept[cut:]
    home = Path(tempfile.mkdtemp(prefix=f"fresh-{name}-", dir=state_dir("bench")))
    out = {"name": name, "rows": len(rows), "train_rows": len(first), "stream_rows": len(stream)}
    try:
        settings = Settings(home=home)
        ingest_files([write_jsonl(first, home / "in-0.jsonl")], settings=settings,
                     progress=False)
        with EmbeddedRedis() as server, TopK(server.url, namespace=settings.namespace,
                                             timeout=5.0) as topk:
            t = time.perf_counter()
            run0 = retrain.run(MODEL, models, settings=settings, redis_url=server.url)
            out["train_s"] = time.perf_counter() - t
            out["first"] = (run0["decision"], run0.get("reason"), run0["gate"]["publishes"])
            _, arrays = read_bundle(Path(run0["dataset"]["run_dir"]) / "dataset",
                                    fmt=DATASET_FORMAT)
            relevance = float(arrays["relevance"])
            train_users = {r["user"] for r in kept}
            held: dict = {}
            for r, h in zip(rows, held_mask):
                if h and r["user"] in train_users and not (r.get("rating", np.inf) < relevance):
                    held.setdefault(r["user"], set()).add(r["item"])
            users = sorted(held)
            touched = {r["user"] for r in stream} & set(users)
            lists = {"unrefreshed": served_lists(topk, users)}
            refresher = Refresher(MODEL, models[MODEL], settings, topk, open_store(settings),
                                  redis_url=server.url)
            t = time.perf_counter()
            refresher.watch()
            while refresher.replay or refresher.pending:      # a first version: all users
                refresher.flush()
            out["replay_s"] = time.perf_counter() - t
            t = time.perf_counter()
            applied = refresher.apply_events([dict(r) for r in stream])
            written = 0
            while refresher.pending or refresher.replay:
                written += refresher.flush()
            out["refresh_s"] = time.perf_counter() - t
            out["applied"], out["written"] = applied, written
            lists["refreshed"] = served_lists(topk, users)
            out["sources"] = source_counts(topk, users)
            ingest_files([write_jsonl(stream, home / "in-1.jsonl")], settings=settings,
                         progress=False)
            t = time.perf_counter()
            run1 = retrain.run(MODEL, models, settings=settings, redis_url=server.url)
            out["retrain_s"] = time.perf_counter() - t
            out["second"] = (run1["decision"], run1.get("reason"), run1["gate"]["publishes"])
            lists["full retrain"] = served_lists(topk, users)
        out["n_users"], out["n_touched"] = len(users), len(touched)
        out["scores"] = {k: rd.score_lists(v, held) for k, v in lists.items()}
        sub = {u: held[u] for u in touched}
        out["touched_scores"] = {k: rd.score_lists(v, sub) for k, v in lists.items()}
        return out
    finally:
        shutil.rmtree(home, ignore_errors=True)


def served_lists(topk, users: list) -> dict:
    """``{user: [item id, ...]}`` of the top-K lookups answer now."""
    out = {}
    for lo in range(0, len(users), 256):
        for a in topk.recommend_many(MODEL, users[lo:lo + 256], k=K):
            out[a.user] = [i for i, _ in a.items]
    return out


def source_counts(topk, users: list) -> dict:
    counts: dict = {}
    for lo in range(0, len(users), 256):
        for a in topk.recommend_many(MODEL, users[lo:lo + 256], k=K):
            counts[a.source] = counts.get(a.source, 0) + 1
    return counts


def quality_report(r: dict) -> None:
    print(f"\n== quality, {r['name']}: {r['rows']:,} rows; training part (80%) ordered by time: "
          f"first 90% {r['train_rows']:,} trained ({r['train_s']:.1f} s; {r['first'][0]}, "
          f"serves {r['first'][2]}), last 10% {r['stream_rows']:,} streamed through the "
          f"refresher")
    print(f"   refresher: first-version replay {r['replay_s']:.1f} s; {r['applied']:,} events "
          f"applied, {r['written']:,} user writes in {r['refresh_s']:.1f} s; answers' sources "
          f"after: {r['sources']}")
    print(f"   full retrain on 100% of the training part: {r['retrain_s']:.1f} s, "
          f"{r['second'][0]} ({r['second'][1]}), serves {r['second'][2]}")
    print(f"   {r['n_users']} users scored (training-part users with a relevant held-out item), "
          f"{r['n_touched']} of them touched by the stream")
    print(f"   {'lists':<14} {'P@10':>7} {'NDCG@10':>8}   touched only: {'P@10':>7} "
          f"{'NDCG@10':>8}")
    for k, m in r["scores"].items():
        t = r["touched_scores"][k]
        print(f"   {k:<14} {m['P@10']:>7.4f} {m['NDCG@10']:>8.4f}   {'':>14}{t['P@10']:>7.4f} "
              f"{t['NDCG@10']:>8.4f}")
    sc = r["scores"]
    up = sc["refreshed"]["P@10"] / sc["unrefreshed"]["P@10"]
    full = sc["refreshed"]["P@10"] / sc["full retrain"]["P@10"]
    print(f"   {r['name']} P@10 refreshed/unrefreshed {up:.3f} (>= 1.0: {_met(up >= 1.0)})  "
          f"refreshed/full retrain {full:.3f} (>= 0.95: {_met(full >= 0.95)})")


def quality(args) -> list[dict]:
    sys.path.insert(0, str(REPO / "bench"))
    import recommend_datasets as rd

    results = []
    for name in [n for n in args.data.split(",") if n]:
        load = {"movielens": rd.movielens, "lastfm": rd.lastfm}[name]
        if not rd.DATA.is_dir():
            print(f"quality, {name}: {rd.DATA} is absent; skipped")
            continue
        print(f"quality, {name}: training (the shipped config takes about a minute) ...",
              flush=True)
        r = quality_one(name, load())
        quality_report(r)
        results.append(r)
    return results


# ================================================================ part 1: latency under load

def training_rows(items: int | None = None, users: int | None = None
                  ) -> tuple[list[dict], str]:
    """MovieLens 100K's ratings, or synthetic ones of its shape (943 users x 106 ratings) over
    ``items`` items with Zipf-like popularity (``--items``: a large catalogue, whose top-K
    per refreshed user reads every item's score), or of ``users`` users with MovieLens's
    100,000 ratings spread over them, at least 10 each (``--users``: so many users that a batch
    touches each at most once, the scale-out's case)."""
    sys.path.insert(0, str(REPO / "bench"))
    import recommend_datasets as rd

    from pipeline.ingest.synthetic import rating_events

    def synthetic(n_users: int, n_items: int, per_user: int) -> list[dict]:
        return [{**r, "kind": "rating"}
                for r in rating_events(n_users=n_users, n_items=n_items, per_user=per_user,
                                       seed=0)]

    if items or users:
        n_users, n_items = users or 943, items or 1682
        per_user = 106 if not users else max(10, 100_000 // users)
        return synthetic(n_users, n_items, per_user), (
            f"synthetic ratings ({n_users:,} users x {n_items:,} items, {per_user} each, "
            "popularity 1/rank^0.8): " + " ".join(
                f"--{k}" for k, v in (("items", items), ("users", users)) if v))
    if (rd.DATA / "movielens-100k" / "u.data").is_file():
        rows = rd.movielens()
        for n, r in enumerate(rows):
            r["event_id"] = f"ml:{n}"
        return rows, "MovieLens 100K (u.data)"
    return synthetic(943, 1682, 106), ("synthetic ratings (943 users x 1682 items, 106 each): "
                                       "MovieLens 100K is absent")


def train_and_publish(settings, url: str, n_items: int | None = None,
                      n_users: int | None = None) -> tuple[dict, list, list, str, float]:
    from pipeline.ingest.files import ingest_files
    from pipeline.ingest.synthetic import write_jsonl
    from pipeline.training import retrain
    from pipeline.training.config import load_models

    rows, what = training_rows(n_items, n_users)
    ingest_files([write_jsonl(rows, Path(settings.home) / "train.jsonl")], settings=settings,
                 progress=False)
    t = time.perf_counter()
    run = retrain.run(MODEL, {MODEL: load_models(CONFIG)[MODEL]}, settings=settings,
                      redis_url=url)
    seconds = time.perf_counter() - t
    if run["decision"] != "published":
        raise RuntimeError(f"the first train did not publish: {run['decision']}: "
                           f"{run.get('reason')}")
    users = sorted({r["user"] for r in rows}, key=str)
    items = sorted({r["item"] for r in rows}, key=str)
    return run, users, items, what, seconds


def create_topics(bootstrap: str, partitions: int = 1) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    from pipeline.ingest.events import default_topic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(default_topic(k), partitions, 1)
                             for k in ("rating", "interaction")])
    finally:
        admin.close()


def start_refresher(settings, log_path: Path, threads: int | None = None) -> subprocess.Popen:
    """``rankstream refresh movies`` with the run's settings in ``RANKSTREAM_*`` (``threads``:
    its numba threads, ``NUMBA_NUM_THREADS``)."""
    env = {**os.environ, **({"NUMBA_NUM_THREADS": str(threads)} if threads else {}),
           "RANKSTREAM_HOME": str(settings.home),
           "RANKSTREAM_CONFIG": str(CONFIG), "RANKSTREAM_NAMESPACE": settings.namespace,
           "RANKSTREAM_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "RANKSTREAM_REDIS_URL": settings.redis_url}
    exe = Path(sys.executable).parent / "rankstream"
    cmd = [str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else
                                                            ["-m", "pipeline.cli"]),
           "refresh", MODEL]
    log = open(log_path, "w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


def stop_child(child: subprocess.Popen, what: str) -> None:
    """SIGTERM our own child (checked: it is the Popen we started and still running)."""
    if child.poll() is None:
        os.kill(child.pid, signal.SIGTERM)
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            print(f"{what} (pid {child.pid}) ignored SIGTERM for 30 s; killing it")
            child.kill()
            child.wait(10)


def worker_cmd(kind: str, spec: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--worker", kind, "--spec", str(spec)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def load_worker(spec: dict) -> dict:
    """Produce ``rate`` rating events/s for random users and items, paced every 10 ms."""
    from pipeline.ingest.events import default_topic
    from pipeline.ingest.producer import EventProducer

    rng = np.random.default_rng(11)
    users, items = spec["users"], spec["items"]
    topic, rate, seconds = default_topic("rating"), spec["rate"], spec["seconds"]
    producer = EventProducer(spec["bootstrap"])
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    sent, behind = 0, []
    while True:
        now = time.monotonic()
        if now - start >= seconds:
            break
        due = int((now - start) * rate)
        behind.append(due - sent)
        ts = int(time.time() * 1000)
        uix = rng.integers(len(users), size=max(0, due - sent))
        iix = rng.integers(len(items), size=len(uix))
        for u, i in zip(uix.tolist(), iix.tolist()):
            producer.send(topic, {"kind": "rating", "event_id": uuid.uuid4().hex, "ts": ts,
                                  "user": users[u], "item": items[i],
                                  "rating": float(1 + (u + i) % 5)}, "rating")
        sent += len(uix)
        time.sleep(max(0.0, 0.010 - (time.monotonic() - now)))
    elapsed = time.monotonic() - start
    producer.flush()
    acked = time.monotonic() - start
    producer.close()
    return {"sent": sent, "seconds": elapsed, "acked_seconds": acked,
            "behind_p99": _pct(behind, 99), "behind_max": max(behind, default=0)}


def lookup_worker(spec: dict) -> dict:
    """``TopK.recommend`` of random users, interleaved in blocks of 100 with a raw ``GET`` of
    a random user's ``topk`` key of the served version; paced at ``lookup_rate``/s (0: as fast
    as one client goes)."""
    from pipeline.serving.layout import key_of
    from pipeline.serving.lookup import TopK
    from pipeline.serving.redis_client import client_from_url

    rng = np.random.default_rng(12)
    users, rate = spec["users"], spec["lookup_rate"]
    topk = TopK(spec["redis_url"], namespace=spec["namespace"], timeout=1.0)
    raw = client_from_url(spec["redis_url"])
    version = topk.recommend(MODEL, users[0], k=K).version
    vk = topk.versions.keys(MODEL).version(version)
    for u in users[:200]:
        topk.recommend(MODEL, u, k=K)
        raw.get(vk.topk(key_of(u)))
    print("ready", flush=True)
    sys.stdin.readline()
    rec, get, sources = [], [], {}
    start = time.monotonic()
    n, pc = 0, time.perf_counter_ns
    while time.monotonic() - start < spec["seconds"]:
        batch = [users[i] for i in rng.integers(len(users), size=100).tolist()]
        keys = [vk.topk(key_of(u)) for u in batch]
        for u in batch:
            t = pc()
            r = topk.recommend(MODEL, u, k=K)
            rec.append(pc() - t)
            sources[r.source] = sources.get(r.source, 0) + 1
        for key in keys:
            t = pc()
            raw.get(key)
            get.append(pc() - t)
        n += 200
        if rate:
            time.sleep(max(0.0, start + n / rate - time.monotonic()))
    seconds = time.monotonic() - start
    topk.close()
    raw.close()
    return {"calls": n, "seconds": seconds, "rec_p50_us": _pct(rec, 50) / 1e3,
            "rec_p99_us": _pct(rec, 99) / 1e3, "get_p50_us": _pct(get, 50) / 1e3,
            "get_p99_us": _pct(get, 99) / 1e3, "sources": sources}


class Probes:
    """Probe events sent from this process, each polled every 10 ms until reflected."""

    def __init__(self, topk, bootstrap: str, users: list, rate: float):
        from pipeline.ingest.producer import EventProducer

        self.topk, self.rate = topk, rate
        self.producer = EventProducer(bootstrap)
        rng = np.random.default_rng(13)
        self.pool = [users[i] for i in rng.permutation(len(users))]
        self.fallback = [i for i, _ in topk.recommend(MODEL, None, k=K).items]
        self.open: list[dict] = []
        self.done: list[dict] = []
        self.n = self.known = 0

    def _send(self, user, items: list) -> float:
        from pipeline.ingest.events import default_topic

        t0 = time.monotonic()
        ts = int(time.time() * 1000)
        for item in items:
            self.producer.send(default_topic("rating"), {
                "kind": "rating", "event_id": uuid.uuid4().hex, "ts": ts, "user": user,
                "item": item, "rating": 5.0}, "rating")
        self.producer.flush()
        return t0

    def start(self, kind: str | None = None) -> None:
        kind = kind or ("new" if self.n % 5 == 4 else "known")
        self.n += 1
        if kind == "known":
            user = self.pool[self.known % len(self.pool)]      # each user once, while they last
            self.known += 1
            items = [i for i, _ in self.topk.recommend(MODEL, user, k=K).items]
            if not items:
                return
            probe = {"kind": kind, "user": user, "item": items[0]}
            probe["t0"] = self._send(user, [items[0]])
        else:
            user = f"fresh-probe-{self.n}-{uuid.uuid4().hex[:6]}"
            probe = {"kind": kind, "user": user}
            probe["t0"] = self._send(user, self.fallback[:3])
        self.open.append(probe)

    def poll(self) -> None:
        still = []
        now = time.monotonic()
        for p in self.open:
            rec = self.topk.recommend(MODEL, p["user"], k=K)
            ids = [i for i, _ in rec.items]
            ok = rec.source == "fresh" and (p["kind"] == "new" or p["item"] not in ids)
            if ok:
                p["latency"] = time.monotonic() - p["t0"]
            elif now - p["t0"] > PROBE_TIMEOUT:
                p["latency"] = float("inf")
            if "latency" in p:
                self.done.append(p)
            else:
                still.append(p)
        self.open = still

    def run(self, seconds: float, grace: float = PROBE_TIMEOUT) -> None:
        start = time.monotonic()
        next_probe = start
        while True:
            now = time.monotonic()
            if now - start < seconds:
                if now >= next_probe:
                    self.start()
                    next_probe += 1.0 / self.rate
            elif not self.open or now - start > seconds + grace:
                break
            self.poll()
            time.sleep(max(0.0, POLL - (time.monotonic() - now)))

    def close(self) -> None:
        self.producer.close()


class RssSampler(threading.Thread):
    """Each pid's resident set size every second while the block runs: ``series`` maps a pid
    to ``[(seconds since start, bytes), ...]``."""

    def __init__(self, pids: list[int]):
        super().__init__(daemon=True)
        self.pids, self.series = pids, {pid: [] for pid in pids}
        self.done = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.done.wait(1.0):
            for pid in self.pids:
                try:
                    with open(f"/proc/{pid}/statm") as fh:
                        pages = int(fh.read().split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                self.series[pid].append((time.monotonic() - start,
                                         pages * os.sysconf("SC_PAGE_SIZE")))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.join(5)


def rss_growth(series: list) -> tuple[float, float, float]:
    """``(RSS at the end of the first minute, RSS at the end, growth)`` of one series (the
    first minute: warm-up, excluded as the target says; shorter runs: the first tenth)."""
    if not series:
        return float("nan"), float("nan"), float("nan")
    end_t = series[-1][0]
    cut = min(60.0, end_t / 10)
    first = next((b for t, b in series if t >= cut), series[-1][1])
    last = series[-1][1]
    return first, last, last / first - 1.0


def lag_delta(before: dict | None, after: dict | None) -> dict:
    """What the refresher's stats file counted between ``before`` and ``after``."""
    if not after:
        return {}
    before = before or {"lag_counts": [0] * len(after["lag_counts"]), "lag_sum": 0.0,
                        "events": 0, "users_refreshed": 0}
    counts = np.array(after["lag_counts"]) - np.array(before["lag_counts"])
    return {"buckets": after["lag_buckets"], "counts": counts.tolist(),
            "sum": after["lag_sum"] - before["lag_sum"],
            "events": after["events"] - before["events"],
            "users": after["users_refreshed"] - before["users_refreshed"],
            "max": after["lag_max"], "backlog": after.get("backlog")}


def wait_ready(probes: Probes, children: list, log_path: Path, limit: float = 180.0):
    """One known-user probe until reflected: a refresher consumes and writes."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        for child in children:
            if child.poll() is not None:
                raise RuntimeError(f"rankstream refresh exited ({child.returncode}); see "
                                   f"{log_path}")
        probes.start("known")
        t = time.monotonic()
        while probes.open and time.monotonic() - t < 20:
            probes.poll()
            time.sleep(0.05)
        if probes.done and probes.done[-1]["latency"] < float("inf"):
            probes.done.clear()
            return time.monotonic() - started
        probes.open.clear()
        probes.done.clear()
    raise RuntimeError(f"the refresher reflected no event within {limit:.0f} s; see {log_path}")


def latency(args) -> dict:
    sys.path.insert(0, str(REPO / "bench"))
    from ingest_throughput import broker, machine_state
    from lookup_latency import local_redis

    from pipeline.refresh.stats import read_stats
    from pipeline.serving.lookup import TopK
    from pipeline.settings import Settings, state_dir

    print(f"machine: {machine_state()}", flush=True)
    with broker(args.bootstrap) as bootstrap, local_redis() as (url, redis_how):
        home = Path(tempfile.mkdtemp(prefix="fresh-latency-", dir=state_dir("bench")))
        settings = Settings(home=home, kafka_bootstrap=bootstrap, redis_url=url,
                            namespace=f"bench-fresh-{uuid.uuid4().hex[:8]}")
        children: list = []
        try:
            print(f"redis: {redis_how}; training the shipped `movies` config ...", flush=True)
            run, users, items, what, train_s = train_and_publish(settings, url, args.items,
                                                                  args.users)
            partitions = args.partitions or (1 if args.refreshers == 1 else 4)
            create_topics(bootstrap, partitions)
            log_path = home / "refresh-*.log"
            threads = args.threads or max(1, (os.cpu_count() or 1) // args.refreshers)
            refreshers = [start_refresher(settings, home / f"refresh-{n}.log", threads)
                          for n in range(args.refreshers)]
            children += [(r, "rankstream refresh") for r in refreshers]
            topk = TopK(url, namespace=settings.namespace, timeout=1.0)
            probes = Probes(topk, bootstrap, users, args.probes)
            ready_s = wait_ready(probes, refreshers, log_path)
            spec = {"users": users, "items": items, "bootstrap": bootstrap, "rate": args.rate,
                    "seconds": args.seconds, "redis_url": url, "namespace": settings.namespace,
                    "lookup_rate": args.lookup_rate}
            spec_path = home / "spec.json"
            spec_path.write_text(json.dumps(spec))
            workers = {k: worker_cmd(k, spec_path) for k in ("load", "lookup")}
            children += [(w, f"{k} worker") for k, w in workers.items()]
            for k, w in workers.items():
                if w.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"the {k} worker did not start")
            time.sleep(2.5)          # the stats file is rewritten every 2 s
            before = read_stats(home, MODEL)
            for w in workers.values():
                w.stdin.write("go\n")
                w.stdin.flush()
            t = time.monotonic()
            with RssSampler([r.pid for r in refreshers]) as rss:
                probes.run(args.seconds)
            results = {k: json.loads(w.stdout.readline()) for k, w in workers.items()}
            time.sleep(max(0.0, 2.5 - (time.monotonic() - t - args.seconds)))
            after = read_stats(home, MODEL)
            probes.close()
            topk.close()
            for r in refreshers:
                stop_child(r, "rankstream refresh")
            return {"what": what, "train_s": train_s, "served": run["gate"]["publishes"],
                    "refreshers": args.refreshers, "partitions": partitions,
                    "threads": threads,
                    "rss": rss.series,
                    "ready_s": ready_s, "probes": probes.done, "load": results["load"],
                    "lookup": results["lookup"], "lag": lag_delta(before, after),
                    "refresher_rc": [r.returncode for r in refreshers],
                    "machine": machine_state(),
                    "seconds": args.seconds}
        finally:
            for child, name in children:
                stop_child(child, name)
            shutil.rmtree(home, ignore_errors=True)


def latency_report(r: dict, rate: float) -> None:
    print(f"\n== freshness under load: {r['what']}; shipped `movies` config trained and "
          f"published in {r['train_s']:.1f} s (serves {r['served']}); {r['refreshers']} x "
          f"`rankstream refresh movies` (subprocesses, one group, {r['partitions']} "
          f"partition(s), {r['threads']} thread(s) each) reflected a first event "
          f"{r['ready_s']:.1f} s after start")
    load, look = r["load"], r["lookup"]
    produced = load["sent"] / load["seconds"]
    print(f"   load: {load['sent']:,} rating events in {load['seconds']:.1f} s = {produced:,.0f} "
          f"events/s produced (target {rate:,.0f}; all acked after {load['acked_seconds']:.1f} s;"
          f" pacing behind by p99 {load['behind_p99']:.0f}, max {load['behind_max']} events)")
    lag = r["lag"]
    if lag:
        consumed = lag["events"] / r["seconds"]
        print(f"   refresher over the load: {lag['events']:,} events consumed "
              f"(~{consumed:,.0f}/s over the {r['seconds']:.0f} s window), {lag['users']:,} user "
              f"writes; backlog at the end {lag['backlog']}")
        n = sum(lag["counts"])
        cells = [f"<={b:g}s {c}" for b, c in zip(lag["buckets"], lag["counts"])]
        cells.append(f">{lag['buckets'][-1]:g}s {lag['counts'][-1]}")
        cum = np.cumsum(lag["counts"]) / max(n, 1)
        bounds = [*lag["buckets"], float("inf")]
        p50 = bounds[int(np.searchsorted(cum, 0.5))]
        p99 = bounds[int(np.searchsorted(cum, 0.99))]
        def bound(x):
            return f"<= {x:g} s" if x < float("inf") else f"> {lag['buckets'][-1]:g} s"

        print(f"   refresher's own lag (event ts -> user written), {n:,} live events: "
              f"p50 {bound(p50)}, p99 {bound(p99)}, mean {lag['sum'] / max(n, 1):.3f} s, "
              f"max so far {lag['max']:.2f} s")
        print("     histogram: " + ", ".join(cells))
    for kind in ("known", "new", None):
        ps = [p for p in r["probes"] if kind is None or p["kind"] == kind]
        lat = [p["latency"] for p in ps]
        finite = [x for x in lat if x < float("inf")]
        label = {"known": "known users (top item rated)", "new": "new users (3 first ratings)",
                 None: "all probes"}[kind]
        print(f"   freshness {label}: n={len(lat)}, p50 {_pct(lat, 50):.3f} s, p99 "
              f"{_pct(lat, 99):.3f} s, max {max(lat, default=float('nan')):.3f} s"
              + (f" ({len(lat) - len(finite)} not reflected within {PROBE_TIMEOUT:.0f} s)"
                 if len(finite) < len(lat) else ""))
    lat = [p["latency"] for p in r["probes"]]
    p50, p99 = _pct(lat, 50), _pct(lat, 99)
    ratio = look["rec_p50_us"] / look["get_p50_us"]
    print(f"   lookups during the load: {look['calls']:,} calls in {look['seconds']:.1f} s "
          f"({look['calls'] / look['seconds']:,.0f}/s, half recommend, half raw GET); recommend "
          f"p50 {look['rec_p50_us']:.0f} us (p99 {look['rec_p99_us']:.0f}) vs raw GET of a topk "
          f"key p50 {look['get_p50_us']:.0f} us (p99 {look['get_p99_us']:.0f}): "
          f"{ratio:.2f}x; sources {look['sources']}")
    print(f"   targets: freshness p50 {p50:.3f} s <= 0.5: {_met(p50 <= 0.5)}; p99 {p99:.3f} s "
          f"<= 2: {_met(p99 <= 2.0)}; sustained {produced:,.0f} events/s >= {rate * 0.98:,.0f}"
          f": {_met(produced >= rate * 0.98)}; lookup p50 / raw GET p50 {ratio:.2f} <= 1.2: "
          f"{_met(ratio <= 1.2)}")
    for pid, series in r["rss"].items():
        first, last, growth = rss_growth(series)
        print(f"   refresher pid {pid} RSS: {first / 2**20:,.0f} MiB after warm-up, "
              f"{last / 2**20:,.0f} MiB at the end ({growth:+.1%}; target <= +10%: "
              f"{_met(growth <= 0.10)})")
    print(f"   machine after: {r['machine']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("latency", "quality", "both"), default="both")
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the load")
    ap.add_argument("--rate", type=float, default=2000.0, help="rating events/s produced")
    ap.add_argument("--probes", type=float, default=5.0, help="probe events/s")
    ap.add_argument("--lookup-rate", type=float, default=2000.0,
                    help="lookups/s of the lookup process (0: as fast as it goes)")
    ap.add_argument("--items", type=int, help="latency on a synthetic catalogue of this many "
                    "items (popularity 1/rank^0.8) instead of MovieLens 100K's 1,682")
    ap.add_argument("--users", type=int, help="latency with this many synthetic users (100,000 "
                    "ratings over them, at least 10 each) instead of MovieLens 100K's 943")
    ap.add_argument("--refreshers", type=int, default=1,
                    help="refresher processes in the model's group (scale-out)")
    ap.add_argument("--partitions", type=int,
                    help="partitions of the event topics (default 1, or 4 with --refreshers > 1)")
    ap.add_argument("--threads", type=int,
                    help="numba threads per refresher (default: the cores / --refreshers)")
    ap.add_argument("--data", default="movielens,lastfm", help="quality data sets")
    ap.add_argument("--bootstrap", default=os.environ.get("RANKSTREAM_KAFKA_BOOTSTRAP"))
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", choices=("load", "lookup"), help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.items is not None and args.items < 2:
        ap.error(f"--items {args.items}: expected a catalogue of at least 2 items")
    if args.users is not None and args.users < 2:
        ap.error(f"--users {args.users}: expected at least 2 users")
    if args.worker:
        spec = json.loads(Path(args.spec).read_text())
        run = load_worker if args.worker == "load" else lookup_worker
        print(json.dumps(run(spec)), flush=True)
        return 0
    import logging

    logging.basicConfig(level=logging.WARNING)
    results = {}
    if args.part in ("latency", "both"):
        results["latency"] = latency(args)
        latency_report(results["latency"], args.rate)
    if args.part in ("quality", "both"):
        results["quality"] = quality(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
