"""What publishing a big version does to the lookups beside it (issue 50).

A private redis-server (:class:`~pipeline.serving.embedded_redis.EmbeddedRedis`, a unix socket)
serves a small ``live`` model (``--live-users`` users, the same items) to a second process that
runs paced ``TopK.recommend`` lookups of random users (``--rate`` a second) and records each
one's latency. Meanwhile this process:

1. lets the lookups run idle (``--idle`` seconds);
2. publishes a ``big`` version of ``--users`` x ``--items`` (rank ``--rank``, top-``--top-k``
   lists; at ``--niceness``, the publisher's 19 unless told) with the server's slow log on
   (``CONFIG SET slowlog-log-slower-than`` ``--slowlog-us``, 1 ms by default so that the worst
   command shows even when none passes 5 ms; ``SLOWLOG RESET`` first);
3. loads the new version's item factors in fresh ``TopK`` clients, again and again for
   ``--idle`` seconds (what every serving process does after a flip);
4. measures every value of the version (``STRLEN`` of every key, ``MEMORY USAGE`` of the
   largest).

The artifact is synthetic: random factors, and random precomputed lists in place of the exact
top-K (the bench measures Redis and the publisher, not the BLAS of ``user_topk_blocks``, which
would take most of an hour on two cores at the default size). It prints the publish time and
keys/s, the largest value, the slow-log entries over 5 ms (count, the worst command), and the
lookup p50/p99 idle, during the publish and during the factor loads, with their ratios. The
issue's targets: largest value <= 1 MiB; no command over 5 ms while publishing 1M users x 100k
items; lookup p99 during publish <= 2x idle. Latency is each call's own time (from its start,
not from its slot in the schedule); a lookup process starved of CPU by the publisher on a
small machine shows in it as much as a stalled server does.

Memory: the artifact holds U (users x rank x 4 bytes) and V; the server about 1 KiB per user
at top-100 (lists, factors, key names), about 1.3 GB at the default size.

    .venv/bin/python bench/publish_load.py [--users 1000000] [--items 100000] [--rank 32]
    .venv/bin/python bench/publish_load.py --users 100000 --items 20000   # about a minute
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.serving import artifact_kinds, version_cache  # noqa: E402
from pipeline.serving import publish as publisher  # noqa: E402
from pipeline.serving.artifact import ModelArtifact  # noqa: E402
from pipeline.serving.background import BATCH_NICENESS  # noqa: E402
from pipeline.serving.embedded_redis import EmbeddedRedis  # noqa: E402
from pipeline.serving.layout import MAX_VALUE_BYTES  # noqa: E402
from pipeline.serving.lookup import TopK  # noqa: E402
from pipeline.serving.publish import publish  # noqa: E402
from pipeline.serving.redis_wire import SEND_BYTES, MsetWriter  # noqa: E402
from solvers.topk import TopKBlock  # noqa: E402

NAMESPACE = "bench"


def random_topk_blocks(seed: int):
    """A stand-in for :func:`solvers.topk.user_topk_blocks`: random lists, best first."""
    def blocks(user_factors, item_factors, k, block=4096, **_):
        rng = np.random.default_rng(seed)
        n_users, n_items = len(user_factors), len(item_factors)
        k = int(min(k, n_items))
        for start in range(0, n_users, block):
            b = min(block, n_users - start)
            scores = -np.sort(-rng.random((b, k), dtype=np.float32), axis=1)
            yield TopKBlock(start, rng.integers(0, n_items, (b, k), dtype=np.int32), scores,
                            np.full(b, k, dtype=np.int32))
    return blocks


def synthetic(n_users: int, n_items: int, rank: int, seed: int) -> ModelArtifact:
    rng = np.random.default_rng(seed)
    return ModelArtifact.user_item(
        user_ids=np.arange(n_users), item_ids=np.arange(n_items) + 1_000_000,
        user_factors=rng.standard_normal((n_users, rank), dtype=np.float32),
        item_factors=rng.standard_normal((n_items, rank), dtype=np.float32),
        item_bias=rng.standard_normal(n_items, dtype=np.float32), algorithm="synthetic")


def lookups(url: str, n_users: int, rate: float, ready, stop, out, cpus=None) -> None:
    """The second process: paced lookups of random live users; sends (start, seconds, ok)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    topk = TopK(url, namespace=NAMESPACE)
    rng = np.random.default_rng(1)
    starts, took, ok = [], [], []
    topk.recommend("live", 0, k=10)
    ready.set()
    t_next = time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if now < t_next:
            time.sleep(t_next - now)
        elif now - t_next > 0.1:       # fell behind (no CPU): no burst to catch up
            t_next = now
        t_next += 1.0 / rate
        t0 = time.monotonic()
        try:
            topk.recommend("live", int(rng.integers(n_users)), k=10)
            good = True
        except Exception:
            good = False
        starts.append(t0)
        took.append(time.monotonic() - t0)
        ok.append(good)
    topk.close()
    out.send((np.array(starts), np.array(took), np.array(ok)))


def slow_entries(client) -> list[tuple[int, str]]:
    """(µs, command) of every slow-log entry, slowest first; the command as its name, its
    first key's kind and how many keys it wrote (``MSET 256 topk``)."""
    out = []
    for e in client.slowlog_get(1_000_000):
        words = (e["command"] or b"?").split(b" ")
        name = words[0].decode(errors="replace")
        if len(words) > 1:
            key = words[1].decode(errors="replace")
            name += " " + key.rsplit(":", 2)[-2 if key.count(":") > 2 else -1]
        more = re.search(rb"\.\.\. \((\d+) more arguments\)$", e["command"] or b"")
        if name.startswith("MSET"):
            n_args = (int(more.group(1)) + 31) if more else len(words) - 1
            name = f"MSET of {n_args // 2} keys ({name.split(' ', 1)[-1]})"
        out.append((e["duration"], name))
    return sorted(out, reverse=True)


def show_slow(label: str, entries: list) -> str:
    over = [e for e in entries if e[0] > 5000]
    worst = (", ".join(f"{name} {us / 1e3:.1f} ms" for us, name in entries[:3])
             if entries else "none logged")
    return f"slowlog {label}: {len(over)} commands over 5 ms ({len(entries)} over the log " \
           f"threshold); slowest: {worst}"


def value_sizes(client, model: str, version: int) -> tuple[int, str, int, int]:
    """(keys, largest key, its STRLEN, keys over MAX_VALUE_BYTES) of one version."""
    n = over = 0
    largest, largest_len = "", -1
    for pattern in (f"{{{NAMESPACE}:{model}}}:v{version}:*",
                    f"{{{NAMESPACE}:{model}:*}}:v{version}:*"):
        batch = []
        for key in client.scan_iter(match=pattern, count=10_000):
            batch.append(key)
            if len(batch) >= 10_000:
                n, over, largest, largest_len = _measure(client, batch, n, over, largest,
                                                         largest_len)
                batch = []
        n, over, largest, largest_len = _measure(client, batch, n, over, largest, largest_len)
    return n, largest, largest_len, over


def _measure(client, keys, n, over, largest, largest_len):
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.strlen(key)
    for key, size in zip(keys, pipe.execute(raise_on_error=False)):
        if not isinstance(size, int):   # the meta hash
            continue
        n += 1
        over += size > MAX_VALUE_BYTES
        if size > largest_len:
            largest, largest_len = key.decode(), size
    return n, over, largest, largest_len


def percentiles(starts, took, ok, lo: float, hi: float) -> tuple[float, float, int, int]:
    sel = (starts >= lo) & (starts < hi)
    if not sel.any():
        return float("nan"), float("nan"), 0, 0
    t = took[sel] * 1e3
    return float(np.percentile(t, 50)), float(np.percentile(t, 99)), int(sel.sum()), \
        int((~ok[sel]).sum())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=1_000_000)
    p.add_argument("--items", type=int, default=100_000)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--top-k", type=int, default=100)
    p.add_argument("--live-users", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=1000.0, help="lookups a second")
    p.add_argument("--idle", type=float, default=5.0, help="seconds of each quiet phase")
    p.add_argument("--slowlog-us", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-value-bytes", type=int, default=MAX_VALUE_BYTES,
                   help="the publisher's chunk bound (8388608 with --mset-keys 1000 "
                        "--mset-bytes 8388608: as before issue 50, for comparison)")
    p.add_argument("--mset-keys", type=int, default=publisher.MSET_KEYS)
    p.add_argument("--mset-bytes", type=int, default=1 << 20)
    p.add_argument("--send-bytes", type=int, default=SEND_BYTES,
                   help="bytes a round of pipelined MSETs (8388608: as before issue 50)")
    p.add_argument("--trip-bytes", type=int, default=version_cache.TRIP_BYTES,
                   help="bytes of chunks a reader asks for in one round trip")
    p.add_argument("--niceness", default=str(BATCH_NICENESS),
                   help="the publish's CPU priority ('none': this process's, as before issue 50)")
    p.add_argument("--pin", action="store_true",
                   help="redis-server and the lookups on CPU 0, the publisher on CPU 1: what "
                        "the server adds when the publisher has CPU of its own")
    args = p.parse_args(argv)
    artifact_kinds.user_topk_blocks = random_topk_blocks(args.seed)
    publisher.MAX_VALUE_BYTES, publisher.MSET_KEYS = args.max_value_bytes, args.mset_keys
    MsetWriter.__init__.__defaults__ = (args.send_bytes, 1000, args.mset_bytes)
    version_cache.TRIP_BYTES = args.trip_bytes
    print(f"publisher: chunks of at most {args.max_value_bytes:,} bytes, MSETs of at most "
          f"{args.mset_keys} keys and {args.mset_bytes:,} bytes, rounds of "
          f"{args.send_bytes:,} bytes, niceness {args.niceness}{', pinned' if args.pin else ''}")

    t = time.perf_counter()
    live = synthetic(min(args.live_users, args.users), args.items, args.rank, args.seed + 1)
    big = synthetic(args.users, args.items, args.rank, args.seed)
    print(f"artifacts: {time.perf_counter() - t:.1f} s")
    with EmbeddedRedis() as server:
        import redis

        client = redis.Redis.from_url(server.url)
        lookup_cpus = None
        if args.pin:
            lookup_cpus = {0}
            os.sched_setaffinity(server.pid, lookup_cpus)
            os.sched_setaffinity(0, {1})
        publish("live", live, client, top_k=args.top_k, namespace=NAMESPACE)
        ctx = mp.get_context("spawn")
        ready, stop = ctx.Event(), ctx.Event()
        recv, send = ctx.Pipe(duplex=False)
        worker = ctx.Process(target=lookups, args=(server.url, live.n_keys, args.rate, ready,
                                                    stop, send, lookup_cpus))
        worker.start()
        try:
            ready.wait(60)
            t_idle = time.monotonic()
            time.sleep(args.idle)
            client.config_set("slowlog-log-slower-than", args.slowlog_us)
            client.config_set("slowlog-max-len", 100_000)
            client.slowlog_reset()
            t_pub = time.monotonic()
            res = publish("big", big, client, top_k=args.top_k, namespace=NAMESPACE,
                          niceness=None if args.niceness == "none" else int(args.niceness))
            t_pub_end = time.monotonic()
            slow_publish = slow_entries(client)
            client.slowlog_reset()
            t_load = time.monotonic()
            loads = []
            while time.monotonic() < t_load + args.idle or not loads:
                t0 = time.perf_counter()
                with TopK(server.url, namespace=NAMESPACE) as fresh:
                    st = fresh.versions.current_state("big")
                    fresh.lists.factors(st)
                loads.append(time.perf_counter() - t0)
            t_load_end = time.monotonic()
            slow_load = slow_entries(client)
            time.sleep(0.5)
        finally:
            stop.set()
            starts, took, ok = recv.recv() if recv.poll(60) else (np.zeros(0),) * 3
            worker.join(30)
        client.config_set("slowlog-log-slower-than", 10_000)
        meta = client.hgetall(f"{{{NAMESPACE}:big}}:v{res.version}:meta")
        n_keys, largest, largest_len, over = value_sizes(client, "big", res.version)
        usage = client.memory_usage(largest) if largest else 0
        info = client.info("memory")

    ok = ok.astype(bool)
    keys = res.timings["keys_written"]
    print(f"publish: {args.users:,} users x {args.items:,} items, rank {args.rank}, "
          f"top-{args.top_k}: {res.seconds:.1f} s, {keys:,} keys ({keys / res.seconds:,.0f} "
          f"keys/s; item_chunk {int(meta[b'item_chunk']):,} rows, "
          f"{int(meta[b'n_item_chunks'])} chunks)")
    print(f"largest value: {largest} {largest_len:,} bytes (MEMORY USAGE {usage:,}); "
          f"{over} of {n_keys:,} string keys over {MAX_VALUE_BYTES:,} bytes (1 MiB)")
    print(show_slow("while publishing", slow_publish))
    print(show_slow("while loading factors", slow_load))
    idle = percentiles(starts, took, ok, t_idle, t_pub)
    during = percentiles(starts, took, ok, t_pub, t_pub_end)
    loading = percentiles(starts, took, ok, t_load, t_load_end)
    for label, (p50, p99, n, failed) in (("idle", idle), ("during publish", during),
                                         ("during factor loads", loading)):
        print(f"lookups {label}: p50 {p50:.3f} ms, p99 {p99:.3f} ms ({n:,} lookups, "
              f"{failed} failed)")
    print(f"p99 ratio: during publish / idle {during[1] / idle[1]:.2f}x, during factor loads / "
          f"idle {loading[1] / idle[1]:.2f}x (target <= 2x)")
    print(f"factor loads: {len(loads)} fresh clients, median {np.median(loads) * 1e3:.0f} ms "
          f"({args.items:,} x {args.rank} float32)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"memory: this process peak {peak:.2f} GiB, redis-server peak "
          f"{info['used_memory_peak'] / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
