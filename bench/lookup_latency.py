"""Publish a 100k-user x 20k-item model (rank 32, top-100 lists) to a local redis-server and
measure lookup latency from one Python client, in the same run:

(a) a raw redis-py ``GET`` of a value as big as one stored top-100 list,
(b) ``TopK.recommend(k=10)``,
(c) ``TopK.recommend_many`` of 64 users,
(d) ``TopK.rank`` of 100 candidates (46 dense features each, as Python lists) by a kernel
    RankSVM ``query_docs`` model of 2,000 support vectors (RBF), scored in process from the
    cached support set: one ``GET current`` plus Σ_s β_s K(x_s, x) for the 100 rows,

printing p50/p99/p99.9 latency, lookups/s and the ratio (b)/(a) and (d)/(a); plus the publish
time, and the in-process parts of (d) (feature rows from the request, kernel scores).

Then the same model on a local **Redis Cluster** (6 nodes: 3 primaries, 3 replicas, started by
``infra/redis/cluster-start.sh`` on free ports and stopped by pid; ``--no-cluster`` skips it;
``RANKSTREAM_REDIS_CLUSTER_URL`` names an existing one): (e) a raw ``RedisCluster.get`` of a
value as big as one list, (e') a ``GET`` on a held connection to the node that owns it,
(f) ``TopK.recommend(k=10)`` and (g) ``recommend_many`` of 64 users against it, and publish
throughput in keys/s, single node against cluster.

Uses ``RANKSTREAM_REDIS_URL`` when set (the namespace ``bench`` is used and flushed of this
model only); otherwise starts ``infra/redis/start.sh`` on a free port and stops it by pid at
the end. Each measurement runs in several interleaved rounds; the medians over rounds are
printed, because the machine may be shared.

    .venv/bin/python bench/lookup_latency.py [--users 100000] [--items 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.serving.artifact import ModelArtifact  # noqa: E402
from pipeline.serving.layout import ModelKeys, VersionKeys, bucket_of  # noqa: E402
from pipeline.serving.lookup import TopK  # noqa: E402
from pipeline.serving.publish import publish  # noqa: E402
from pipeline.serving.redis_client import client_from_url  # noqa: E402
from pipeline.serving.shards import ShardWriter  # noqa: E402
from pipeline.settings import redact, state_dir  # noqa: E402
from solvers.topk import warm_up  # noqa: E402

TARGETS = {"ratio_p50": 1.2, "recommend_p99_us": 1000.0, "batch_users_per_s": 50_000,
           "publish_s": 10.0}


@contextmanager
def local_cluster():
    """RANKSTREAM_REDIS_CLUSTER_URL, or a 6-node cluster from infra/redis on free ports."""
    if os.environ.get("RANKSTREAM_REDIS_CLUSTER_URL"):
        yield os.environ["RANKSTREAM_REDIS_CLUSTER_URL"], "RANKSTREAM_REDIS_CLUSTER_URL"
        return
    rng = np.random.default_rng()
    for _ in range(200):  # 6 ports and their cluster-bus ports (+10000) free
        base = int(rng.integers(20000, 55000))
        try:
            for port in [*range(base, base + 6), *range(base + 10000, base + 10006)]:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            break
        except OSError:
            continue
    tmp = tempfile.mkdtemp(prefix="cluster-", dir=state_dir("bench"))   # ours, not /tmp
    env = {**os.environ, "RANKSTREAM_REDIS_CLUSTER_PORT": str(base),
           "RANKSTREAM_REDIS_CLUSTER_DIR": tmp}
    try:
        subprocess.run([REPO / "infra/redis/cluster-start.sh"], env=env, check=True,
                       capture_output=True)
        yield (f"redis://127.0.0.1:{base}/0",
               f"infra/redis/cluster-start.sh (pid files {tmp}/*/redis.pid)")
    finally:
        subprocess.run([REPO / "infra/redis/cluster-stop.sh"], env=env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)    # the directory made above, nothing else


def cluster_run(art: ModelArtifact, args, value_size: int) -> dict:
    """Publish ``art`` to a local cluster (fresh, then replacing it) and time (e) a raw
    ``RedisCluster.get``, (e') a GET on a held connection to the key's node, (f)
    ``TopK.recommend`` and (g) ``recommend_many`` of 64, interleaved in rounds."""
    with local_cluster() as (url, origin):
        client = client_from_url(url, retries=3)
        for key in client.scan_iter(match="{bench:latency*", count=10_000):
            client.unlink(key)
        fresh = publish("latency", art, client, top_k=args.top_k, keep_versions=1,
                        namespace="bench")
        again = publish("latency", art, client, top_k=args.top_k, keep_versions=1,
                        namespace="bench")
        writes = write_rate(client, args.users, 8 * args.top_k)
        client.set("bench:raw", os.urandom(value_size))
        node = client.get_node_from_key("bench:raw")
        held = client.get_redis_connection(node).connection_pool.make_connection()

        def held_get(key):
            held.send_command("GET", key, check_health=False)
            return held.read_response()

        topk = TopK(url, namespace="bench", timeout=1.0)
        rng = np.random.default_rng(2)
        topk.recommend("latency", 0, k=10)
        for _ in range(200):
            client.get("bench:raw")
            held_get("bench:raw")
            topk.recommend("latency", int(rng.integers(args.users)), k=10)
        e, e2, f, g = [], [], [], []
        for _ in range(args.rounds):
            users = rng.integers(0, args.users, args.calls).tolist()
            e.append(timed(client.get, [("bench:raw",)] * args.calls))
            e2.append(timed(held_get, [("bench:raw",)] * args.calls))
            f.append(timed(topk.recommend, [("latency", u, 10) for u in users]))
            batches = [rng.integers(0, args.users, 64).tolist() for _ in range(args.batches)]
            g.append(timed(topk.recommend_many, [("latency", us, 10) for us in batches]))
        check = topk.recommend("latency", 7, k=10)
        assert check.source == "precomputed" and len(check.items) == 10
        primaries = {n.name: client.get_redis_connection(n).dbsize()
                     for n in client.get_primaries()}
        topk.close()
        held.disconnect()
        client.close()
    return {"url": url, "origin": origin, "fresh": fresh, "again": again, "writes": writes,
            "e": summary(e), "e2": summary(e2), "f": summary(f), "g": summary(g, per_call=64),
            "primaries": primaries}


def write_rate(client, n_keys: int, size: int) -> tuple[float, int]:
    """Seconds to write ``n_keys`` values of ``size`` bytes through publish's own writer
    (``ShardWriter``: one ``MSET`` per bucket on a cluster, pipelined per node), as a version's
    per-user keys; the write path alone, without the top-K compute publish overlaps it with.
    Returns (seconds, keys); the keys are deleted afterwards."""
    keys = ModelKeys("bench", "writes")
    vk = keys.version(1)
    names = [str(u) for u in range(n_keys)]
    buckets = np.array([bucket_of(x) for x in names])
    value = os.urandom(size)
    t0 = time.perf_counter()
    with ShardWriter(client, keys) as w:
        for lo in range(0, n_keys, 4096):
            w.mset_buckets([vk.bucket_prefixes[b] + "topk:" + x
                            for b, x in zip(buckets[lo:lo + 4096].tolist(), names[lo:lo + 4096])],
                           [value] * len(names[lo:lo + 4096]), buckets[lo:lo + 4096])
        w.finish()
    seconds = time.perf_counter() - t0
    for key in client.scan_iter(match="{bench:writes*", count=10_000):
        client.unlink(key)
    return seconds, n_keys


def keys_per_s(r) -> str:
    """Publish throughput: keys written per second of the whole publish (and of its write
    phase, which overlaps the top-K compute)."""
    tm = r.timings
    return (f"{tm['keys_written'] / r.seconds:,.0f} keys/s ({tm['keys_written']:,} keys in "
            f"{r.seconds:.2f} s; write phase {tm['keys_written'] / tm['write']:,.0f} keys/s, "
            f"pointers {tm['pointers'] * 1e3:.0f} ms)")


@contextmanager
def local_redis():
    """RANKSTREAM_REDIS_URL, or a redis-server from infra/redis on a free port."""
    if os.environ.get("RANKSTREAM_REDIS_URL"):
        yield os.environ["RANKSTREAM_REDIS_URL"], "RANKSTREAM_REDIS_URL"
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="redis-", dir=state_dir("bench"))
    env = {**os.environ, "RANKSTREAM_REDIS_PORT": str(port), "RANKSTREAM_REDIS_DIR": tmp}
    subprocess.run([REPO / "infra/redis/start.sh"], env=env, check=True, capture_output=True)
    try:
        yield f"redis://127.0.0.1:{port}/0", f"infra/redis/start.sh (pid file {tmp}/redis.pid)"
    finally:
        subprocess.run([REPO / "infra/redis/stop.sh"], env=env, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def make_model(n_users: int, n_items: int, rank: int, seed: int = 0) -> ModelArtifact:
    rng = np.random.default_rng(seed)
    nnz = rng.integers(0, 100, n_users)  # ~50 seen items per user, excluded from lists
    indptr = np.concatenate([[0], np.cumsum(nnz)])
    indices = (rng.random(int(indptr[-1])) * n_items).astype(np.int64)
    # unique per user: sort within rows and drop repeats by nudging (cheap, keeps sizes)
    rows = np.repeat(np.arange(n_users), nnz)
    order = np.lexsort((indices, rows))
    indices, rows = indices[order], rows[order]
    dup = np.flatnonzero((np.diff(indices) == 0) & (np.diff(rows) == 0)) + 1
    keep = np.ones(len(indices), bool)
    keep[dup] = False
    indices, rows = indices[keep], rows[keep]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n_users))])
    return ModelArtifact.user_item(
        user_ids=np.arange(n_users), item_ids=np.arange(n_items) + 1_000_000,
        user_factors=rng.standard_normal((n_users, rank), dtype=np.float32) / np.sqrt(rank),
        item_factors=rng.standard_normal((n_items, rank), dtype=np.float32),
        item_bias=rng.standard_normal(n_items, dtype=np.float32) * 0.1,
        seen=(indptr, indices), algorithm="synthetic", params={"rank": rank})


def make_query_ranker(n_support: int, n_features: int, n_queries: int = 1000,
                      docs_per_query: int = 20, seed: int = 0) -> ModelArtifact:
    """A ``query_docs`` artifact whose scorer is an RBF kernel RankSVM with exactly
    ``n_support`` support vectors (features in [0, 1], as LETOR's query-normalised ones; β
    random): built directly, since only its size matters for the latency."""
    from pipeline.serving.scorers import Scorer

    rng = np.random.default_rng(seed)
    scorer = Scorer("kernel", {"n_features": n_features, "text_features": 0, "kernel": "rbf",
                               "gamma": 1.0 / n_features, "degree": 3, "coef0": 1.0},
                    {"support_vectors": rng.random((n_support, n_features), np.float32),
                     "dual_coef": rng.normal(size=n_support)})
    n = n_queries * docs_per_query
    return ModelArtifact.query_docs(
        query_ids=np.arange(n_queries), doc_ids=np.arange(n),
        indptr=np.arange(0, n + 1, docs_per_query), docs=np.arange(n),
        scores=rng.random(n, np.float32), scorer=scorer, algorithm="synthetic",
        params={"support": n_support})


def timed(fn, args_list) -> np.ndarray:
    """Latency of fn(*args) for each args, in seconds."""
    out = np.empty(len(args_list))
    clock = time.perf_counter
    for i, args in enumerate(args_list):
        t0 = clock()
        fn(*args)
        out[i] = clock() - t0
    return out


def summary(rounds: list[np.ndarray], per_call: int = 1) -> dict:
    pct = np.array([np.percentile(r, [50, 99, 99.9]) for r in rounds]) * 1e6
    med = np.median(pct, axis=0)
    rate = np.median([per_call * len(r) / r.sum() for r in rounds])
    return {"p50": med[0], "p99": med[1], "p999": med[2], "per_s": rate,
            "p50_range": (pct[:, 0].min(), pct[:, 0].max())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=4000, help="single lookups per round")
    ap.add_argument("--batches", type=int, default=300, help="64-user batches per round")
    ap.add_argument("--support", type=int, default=2000, help="(d) support vectors")
    ap.add_argument("--candidates", type=int, default=100, help="(d) candidates per call")
    ap.add_argument("--rank-calls", type=int, default=300, help="(d) calls per round")
    ap.add_argument("--republish", action=argparse.BooleanOptionalAction, default=True,
                    help="publish a second version, which prunes the first (default on)")
    ap.add_argument("--cluster", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure a local 6-node Redis Cluster (default on)")
    args = ap.parse_args(argv)

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    art = make_model(args.users, args.items, args.rank)
    t_model = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm_up()
    t_warm = time.perf_counter() - t0

    with local_redis() as (url, origin):
        client = client_from_url(url, retries=3)
        for key in client.scan_iter(match="{bench:latency*", count=10_000):
            client.unlink(key)
        res = publish("latency", art, client, top_k=args.top_k, keep_versions=1,
                      namespace="bench")
        again = first = None
        if args.republish:  # steady state: a new version replaces (and prunes) the last one
            again = publish("latency", art, client, top_k=args.top_k, keep_versions=1,
                            namespace="bench")
            res, first = again, res
        writes = write_rate(client, args.users, 8 * args.top_k) if args.cluster else None
        n_features = 46
        publish("ranker", make_query_ranker(args.support, n_features), client, top_k=20,
                keep_versions=1, namespace="bench")
        memory = client.info("memory")["used_memory_human"]
        value_size = len(client.get(VersionKeys("bench:latency", res.version).topk("0")))
        client.set("bench:raw", os.urandom(value_size))

        raw = client_from_url(url)  # a plain redis-py client, as a user would make it
        topk = TopK(url, namespace="bench", timeout=1.0)
        held = raw.connection_pool.make_connection()  # (a') GET on a held connection: no pool

        def raw_held_get(key):
            held.send_command("GET", key, check_health=False)
            return held.read_response()

        rng = np.random.default_rng(1)
        topk.recommend("latency", 0, k=10)  # loads the version's item ids once
        candidates = [[(f"doc{j}", rng.random(n_features).tolist())
                       for j in range(args.candidates)] for _ in range(20)]
        for _ in range(200):  # warm sockets and caches (and load the ranker's support set)
            raw.get("bench:raw")
            topk.recommend("latency", int(rng.integers(args.users)), k=10)
            topk.rank("ranker", candidates[0], k=10)
        a, a2, b, c, d = [], [], [], [], []
        for _ in range(args.rounds):  # interleaved, so drifts in machine load hit all alike
            users = rng.integers(0, args.users, args.calls).tolist()
            a.append(timed(raw.get, [("bench:raw",)] * args.calls))
            a2.append(timed(raw_held_get, [("bench:raw",)] * args.calls))
            b.append(timed(topk.recommend, [("latency", u, 10) for u in users]))
            batches = [rng.integers(0, args.users, 64).tolist() for _ in range(args.batches)]
            c.append(timed(topk.recommend_many, [("latency", us, 10) for us in batches]))
            d.append(timed(topk.rank, [("ranker", candidates[i % 20], 10)
                                       for i in range(args.rank_calls)]))
        # the in-process parts of (d): the request's features to rows, then the kernel sums
        scorer = topk._scorer_state("ranker")[0].scorer
        rows = scorer.rows([x for _, x in candidates[0]])
        d_rows = timed(scorer.rows, [([x for _, x in candidates[0]],)] * args.rank_calls)
        d_score = timed(scorer.score, [(rows,)] * args.rank_calls)
        check = topk.recommend("latency", 7, k=10)
        assert check.source == "precomputed" and len(check.items) == 10
        topk.close()
        raw.close()
        client.close()
    cl = cluster_run(art, args, value_size) if args.cluster else None

    sa, sa2, sb, sc = summary(a), summary(a2), summary(b), summary(c, per_call=64)
    sd = summary(d)
    load_after = os.getloadavg()
    print(f"\nrankstream lookup latency -- {args.users:,} users x {args.items:,} items, "
          f"rank {args.rank}, top-{args.top_k} lists ({value_size} B per list)")
    print(f"redis: {redact(url)} via {origin}; redis used_memory {memory}")
    print(f"machine: {os.cpu_count()} cores, load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after (shared: numbers are medians over {args.rounds} rounds)")
    print(f"\nmodel build {t_model:.1f} s; top-K kernel load/compile {t_warm:.2f} s "
          "(first call per process, not in publish time)")
    for name, r in (("publish (fresh)", first if again else res),
                    ("publish (replaces v1)", again)):
        if r is None:
            continue
        tm = r.timings
        print(f"{name}: {r.seconds:.2f} s for {tm['keys_written']:,} keys (waiting for top-K "
              f"compute {tm['waiting_for_topk']:.2f} s, flip {tm['flip'] * 1e3:.1f} ms, prune "
              f"{tm['prune']:.2f} s)  target <= {TARGETS['publish_s']:.0f} s")
    print(f"\n{'':34} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9} {'lookups/s':>11}")
    rows = [("(a)  raw redis-py GET (client.get)", sa, 1),
            ("(a') GET on a held connection", sa2, 1),
            ("(b)  TopK.recommend(k=10)", sb, 1),
            ("(c)  recommend_many(64 users)", sc, 64),
            (f"(d)  rank({args.candidates} cand., {args.support} SV)", sd, 1)]
    for name, s, _ in rows:
        print(f"{name:34} {s['p50']:8.1f} {s['p99']:8.1f} {s['p999']:9.1f} {s['per_s']:11,.0f}")
    print(f"      (c) per batch p50 {sc['p50']:.0f} us = {sc['p50'] / 64:.1f} us per user")
    print(f"      (d) in process, p50: feature rows from the request "
          f"{np.median(d_rows) * 1e6:.0f} us, kernel scores {np.median(d_score) * 1e6:.0f} us "
          f"({args.candidates} x {args.support} x {n_features} RBF); (d)/(a) p50 "
          f"{sd['p50'] / sa['p50']:.1f}")
    ratio = sb["p50"] / sa["p50"]
    print(f"\nratio (b)/(a) p50: {ratio:.2f}  (target <= {TARGETS['ratio_p50']});  "
          f"(b)/(a') p50: {sb['p50'] / sa2['p50']:.2f}")
    print(f"p50 ranges over rounds: (a) {sa['p50_range'][0]:.0f}-{sa['p50_range'][1]:.0f} us, "
          f"(b) {sb['p50_range'][0]:.0f}-{sb['p50_range'][1]:.0f} us")
    verdict = {
        "recommend p50 <= 1.2x raw GET p50": ratio <= TARGETS["ratio_p50"],
        "recommend p99 <= 1 ms": sb["p99"] <= TARGETS["recommend_p99_us"],
        "batched >= 50k users/s": sc["per_s"] >= TARGETS["batch_users_per_s"],
        "publish <= 10 s": max(res.seconds, (first if again else res).seconds)
        <= TARGETS["publish_s"],
    }
    if cl is not None:
        se, se2, sf, sg = cl["e"], cl["e2"], cl["f"], cl["g"]
        print(f"\nredis cluster: {redact(cl['url'])} via {cl['origin']}; keys per primary "
              f"{sorted(cl['primaries'].values())}")
        print(f"{'':34} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9} {'lookups/s':>11}")
        for name, x in (("(e)  raw RedisCluster.get", se),
                        ("(e') GET on a held node connection", se2),
                        ("(f)  TopK.recommend(k=10), cluster", sf),
                        ("(g)  recommend_many(64), cluster", sg)):
            print(f"{name:34} {x['p50']:8.1f} {x['p99']:8.1f} {x['p999']:9.1f} "
                  f"{x['per_s']:11,.0f}")
        print(f"      (g) per batch p50 {sg['p50']:.0f} us = {sg['p50'] / 64:.1f} us per user")
        cratio = sf["p50"] / se["p50"]
        print(f"ratio (f)/(e) p50: {cratio:.2f}  (target <= {TARGETS['ratio_p50']});  "
              f"(f)/(e') p50: {sf['p50'] / se2['p50']:.2f}")
        single = first if again else res
        print(f"publish throughput, fresh version: single node {keys_per_s(single)}")
        print(f"                                   cluster     {keys_per_s(cl['fresh'])}")
        print(f"publish throughput, replacing one: single node {keys_per_s(res)}")
        print(f"                                   cluster     {keys_per_s(cl['again'])}")
        for name, (sec, n) in (("single node", writes), ("cluster    ", cl["writes"])):
            print(f"publish write path alone ({n:,} lists of {value_size} B, no top-K compute): "
                  f"{name} {n / sec:,.0f} keys/s ({n * value_size / sec / 1e6:.0f} MB/s)")
        verdict["cluster: recommend p50 <= 1.2x raw RedisCluster.get p50"] = \
            cratio <= TARGETS["ratio_p50"]
        verdict["cluster: recommend p99 <= 1 ms"] = sf["p99"] <= TARGETS["recommend_p99_us"]
    for name, ok in verdict.items():
        print(f"  [{'met' if ok else 'MISSED'}] {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
