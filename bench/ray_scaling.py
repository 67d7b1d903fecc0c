"""AltSVM on a Ray cluster against one process (issue 52): the same bits, wall time, memory.

Not part of pytest. Run::

    .venv/bin/python bench/ray_scaling.py                        # ML-100K and 10M synthetic
    .venv/bin/python bench/ray_scaling.py --comparisons 2000000 --workers 1,2,3
    .venv/bin/python bench/ray_scaling.py --address 127.0.0.1:6390   # a running cluster

Data: MovieLens 100K's rated pairs (each user's pairs of different ratings, the higher one
winning, as ``solvers.pairs_from_ratings`` makes them; skipped when ../shared/data lacks it)
and a synthetic set of ``--comparisons`` comparisons (``--users`` users, ``--items`` items
drawn with Zipf popularity, exponent 1.1). Each is fitted cold on its first 80% and then warm
on all of it, rank ``--rank``, λ = 0.2 reg_max (computed in the driver), ``--max-iter``
iterations at most, seed 0.

Engines: this process with 1 and with 2 numba threads, and Ray with each ``--workers`` count
(one CPU each). Every engine runs in a fresh process (``--one``), so its peak RSS is its own;
Ray's workers report theirs. Without ``--address`` a cluster is started with
``infra/ray/start.sh`` (a head without CPUs and max(workers) one-CPU worker nodes, on loopback)
and stopped at the end; its start is not timed. Prints per engine and data set: the SHA-256
of U, V, b, alpha, beta, the objective and the iteration count (cold / warm; the first 16
hex digits), the wall time of the two fits, the driver's and the workers' peak RSS, then the
ratios the issue's targets name. This machine has 2 cores shared with other jobs: the driver,
Ray's daemons and the workers share them, so 2 workers cannot run at 2 cores' speed here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = Path(os.environ.get("RANKSTREAM_DATA", REPO.parent / "shared" / "data"))


def movielens() -> np.ndarray | None:
    from solvers import pairs_from_ratings

    path = DATA / "movielens-100k" / "u.data"
    if not path.is_file():
        return None
    raw = np.loadtxt(path, dtype=np.int64)
    c = pairs_from_ratings(raw[:, 0] - 1, raw[:, 1] - 1, raw[:, 2].astype(float))
    return c[np.random.default_rng(0).permutation(len(c))]


def synthetic(n: int, n_users: int, n_items: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    weight = 1.0 / np.arange(1, n_items + 1) ** 1.1
    weight /= weight.sum()
    winners = rng.choice(n_items, size=n, p=weight)
    losers = rng.choice(n_items, size=n, p=weight)
    same = winners == losers
    losers[same] = (losers[same] + 1) % n_items
    return np.c_[rng.integers(0, n_users, n), winners, losers]


def digest(model) -> str:
    h = hashlib.sha256()
    for a in (model.user_factors_, model.item_factors_, model.item_bias_, model._alpha,
              model._beta, model.objective_):
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(str(model.n_iter_).encode())
    return h.hexdigest()[:16]


def one(args) -> None:
    """Fit cold then warm with one engine; print a JSON line."""
    from solvers import AltSVM

    c = np.load(args.one_data)
    engine = (dict(n_threads=int(args.one[len("local"):])) if args.one.startswith("local")
              else dict(ray_address=args.address, ray_workers=int(args.one[len("ray"):])))
    params = dict(rank=args.rank, reg_ratio=0.2, item_bias=True, max_iter=args.max_iter,
                  random_state=0, **engine)
    started = time.perf_counter()
    cold = AltSVM(**params).fit(c[: int(0.8 * len(c))])
    warm = AltSVM(**params).fit(c, warm_start=cold.warm_state())
    seconds = time.perf_counter() - started
    workers = [max(a, b) for a, b in zip(getattr(cold, "worker_peak_rss_", []),
                                         getattr(warm, "worker_peak_rss_", []))]
    print(json.dumps({"engine": args.one, "cold": digest(cold), "warm": digest(warm),
                      "seconds": seconds, "iterations": [cold.n_iter_, warm.n_iter_],
                      "driver_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "worker_rss": workers, "where": warm.engine_}))


def cluster(workers: int, port: int):
    env = {**os.environ, "RANKSTREAM_RAY_PORT": str(port),
           "RANKSTREAM_RAY_WORKERS": str(workers)}
    start = subprocess.run([REPO / "infra" / "ray" / "start.sh"], env=env, text=True,
                           capture_output=True)
    if start.returncode != 0:       # stop the nodes it did start
        subprocess.run([REPO / "infra" / "ray" / "stop.sh"], env=env, capture_output=True)
        sys.exit(f"infra/ray/start.sh failed: {start.stderr.strip()}")
    return env


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--comparisons", type=int, default=10_000_000)
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--max-iter", type=int, default=8)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--address", help="a running cluster (default: start one)")
    ap.add_argument("--port", type=int, default=6395, help="the started cluster's port")
    ap.add_argument("--one"), ap.add_argument("--one-data")
    args = ap.parse_args()
    if args.one:
        return one(args)
    workers = [int(w) for w in args.workers.split(",")]
    env = None
    if args.address is None:
        env = cluster(max(workers), args.port)
        args.address = f"127.0.0.1:{args.port}"
    state = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state"))
    work = state / "rankstream" / "bench" / f"ray-scaling-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    try:
        sets = {"ml-100k": movielens(),
                f"synthetic-{args.comparisons // 10**6}M": synthetic(
                    args.comparisons, args.users, args.items)}
        for name, c in sets.items():
            if c is None:
                print(f"{name}: not found under {DATA}; skipped")
                continue
            path = work / f"{name}.npy"
            np.save(path, c)
            print(f"\n{name}: {len(c):,} comparisons, {int(c[:, 0].max()) + 1:,} users, "
                  f"{int(c[:, 1:].max()) + 1:,} items; rank {args.rank}, cold on 80% then warm")
            rows = []
            for engine in ["local1", "local2", *[f"ray{w}" for w in workers]]:
                out = subprocess.run([sys.executable, __file__, "--one", engine, "--one-data",
                                      str(path), "--address", args.address, "--rank",
                                      str(args.rank), "--max-iter", str(args.max_iter)],
                                     text=True, capture_output=True)
                if out.returncode != 0:
                    print(f"  {engine}: failed: {out.stderr.strip().splitlines()[-1]}")
                    continue
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
                r = rows[-1]
                peak = max(r["worker_rss"]) if r["worker_rss"] else None
                print(f"  {engine:7s} cold {r['cold']} warm {r['warm']}  {r['seconds']:7.2f} s"
                      f"  iterations {r['iterations']}  driver {gib(r['driver_rss'])}"
                      + (f"  workers <= {gib(peak)}" if peak else "") + f"  ({r['where']})")
            by = {r["engine"]: r for r in rows}
            same = len({(r["cold"], r["warm"]) for r in rows}) == 1
            print(f"  same bits on every engine: {'yes' if same else 'NO'}")
            for w in workers:
                if f"ray{w}" in by and "local1" in by:
                    print(f"  ray {w} worker(s) / local 1 thread: "
                          f"{by[f'ray{w}']['seconds'] / by['local1']['seconds']:.2f}x the time")
            if "ray1" in by and "ray2" in by:
                print(f"  speed-up, 2 workers over 1: "
                      f"{by['ray1']['seconds'] / by['ray2']['seconds']:.2f}x (target >= 1.6x)")
            path.unlink()
    finally:
        if env is not None:
            subprocess.run([REPO / "infra" / "ray" / "stop.sh"], env=env, capture_output=True)
        work.rmdir()


if __name__ == "__main__":
    main()
