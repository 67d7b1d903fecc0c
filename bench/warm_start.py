"""Warm vs cold retraining on a stream (issue 7), and dataset building throughput.

AltSVM, MovieLens 100K as a stream: a fixed random 10% of ratings is the test set (NDCG@10 over
each user's test items, gains 2^r - 1); the other ratings arrive in time order. Train on the
first 90% of them, then add 2% at a time for 5 rounds; each round fits cold and warm-started
from the previous round's warm fit, on the same comparisons, and prints time, iterations,
objective and NDCG@10 of both. The comparisons and parameters are the shipped ``movies``
config's, read from dags/models.toml (implicit comparisons, rank, item bias; λ per comparison
kept from the first round, as the trainer does on warm runs), or with ``--altsvm explicit``
all within-user pairs at reg 1000.
TopPush, w8a: train on 90% of the training split, then add 2% chunks of instances; cold vs
warm, Pos@Top on the test split.

Then: dataset building from the event store (ratings -> within-user comparison arrays), events/s.

Run: .venv/bin/python bench/warm_start.py   (needs ../shared/data; prints medians of --repeats;
``--altsvm explicit|both`` for the explicit pairs at reg 1000 of the earlier default)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = Path(os.environ.get("RANKSTREAM_DATA", REPO.parent / "shared" / "data"))

from solvers import AltSVM, ConvergenceWarning, TopPush, pairs_from_ratings  # noqa: E402
from solvers.metrics import ndcg_at_k, pos_at_top  # noqa: E402
from solvers.pairs import implicit_comparisons  # noqa: E402

warnings.simplefilter("ignore", ConvergenceWarning)


def _min_rating(value) -> float:
    """``implicit_min_rating`` of the config; ``"relevance"`` is 4 on MovieLens' 1-5 scale."""
    return 4.0 if value == "relevance" else float(value)


def timed(fit, repeats):
    times, model = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        model = fit()
        times.append(time.perf_counter() - t)
    return statistics.median(times), model


def shipped_movies() -> tuple[dict, dict]:
    """The ``movies`` config of dags/models.toml: (AltSVM params, implicit comparison params)."""
    import tomllib

    params = dict(tomllib.loads((REPO / "dags" / "models.toml").read_text())
                  ["models"]["movies"]["params"])
    implicit = {"per_interaction": int(params.pop("implicit_per_item", 10)),
                "per_user": int(params.pop("implicit_per_user", 0)) or None,
                # "relevance": the threshold "auto" gives MovieLens' 1-5 scale
                "min_rating": _min_rating(params.pop("implicit_min_rating", 0.0))}
    for key in ("comparisons", "implicit_sampling", "max_pairs_per_user", "reg_path"):
        params.pop(key, None)
    return params, implicit


def altsvm_stream(repeats, params, implicit=None, reg_ratio=0.3):
    """With ``implicit`` (``shipped_movies()``'s comparison params), the shipped ``movies``
    config: implicit comparisons, its rank and item bias, and λ per comparison fixed at the
    first round (``reg_ratio`` · reg_max there), as the trainer keeps the last path's λ on warm
    runs."""
    d = np.loadtxt(DATA / "movielens-100k" / "u.data", dtype=np.int64)
    users, items, ratings, ts = d[:, 0] - 1, d[:, 1] - 1, d[:, 2].astype(float), d[:, 3]
    n_users, n_items = users.max() + 1, items.max() + 1
    test = np.random.default_rng(0).random(len(d)) < 0.1
    stream = np.flatnonzero(~test)[np.argsort(ts[~test], kind="stable")]
    tu, ti, tr = users[test], items[test], ratings[test]

    def ndcg(model):
        return ndcg_at_k(tu, tr, model.predict(tu, ti), k=10)

    what = (f"implicit comparisons {implicit}, λ = {reg_ratio} reg_max of round 0 per "
            f"comparison, {params}" if implicit else f"all within-user pairs, {params}")
    print(f"\nAltSVM on MovieLens 100K as a stream ({what}); medians of {repeats} fits. "
          f"Cold fits use random_state 0..{repeats - 1}: 'ndcg c' is their mean and 'sd' their "
          "spread, the noise a single cold fit carries; warm fits continue from the previous "
          "round's warm model.")
    print(f"{'round':>5} {'ratings':>8} {'pairs':>8} {'cold s':>7} {'warm s':>7} {'ratio':>6} "
          f"{'it c/w':>7} {'obj cold':>12} {'obj warm':>12} {'ndcg c':>7} {'sd':>6} "
          f"{'ndcg w':>7} {'w - c':>7}")
    state = None
    ratios, gaps = [], []
    for rnd, frac in enumerate([0.90, 0.92, 0.94, 0.96, 0.98, 1.00]):
        rows = stream[:int(len(stream) * frac)]
        if implicit:
            comps = implicit_comparisons(users[rows], items[rows], n_items,
                                         per_interaction=implicit["per_interaction"],
                                         per_user=implicit["per_user"],
                                         positive=ratings[rows] >= implicit["min_rating"],
                                         random_state=0)
            if rnd == 0:
                reg_per = reg_ratio * AltSVM(**params).reg_max(comps, n_users, n_items) \
                    / len(comps)
            params = {**params, "reg": reg_per * len(comps)}
        else:
            comps = pairs_from_ratings(users[rows], items[rows], ratings[rows])
        colds, cold_times = [], []
        for seed in range(repeats):
            t = time.perf_counter()
            colds.append(AltSVM(**{**params, "random_state": seed}).fit(comps, n_users, n_items))
            cold_times.append(time.perf_counter() - t)
        cold_s, cold = statistics.median(cold_times), colds[0]
        cold_ndcg = [ndcg(m) for m in colds]
        if state is None:
            warm_s, warm = cold_s, cold
        else:
            warm_s, warm = timed(lambda: AltSVM(**params).fit(comps, n_users, n_items,
                                                              warm_start=state), repeats)
            ratios.append(warm_s / cold_s)
            gaps.append(ndcg(warm) - float(np.mean(cold_ndcg)))
        state = warm.warm_state()
        print(f"{rnd:>5} {len(rows):>8} {len(comps):>8} {cold_s:>7.3f} {warm_s:>7.3f} "
              f"{warm_s / cold_s:>6.2f} {cold.n_iter_:>3}/{warm.n_iter_:<3} "
              f"{cold.objective_[-1]:>12.1f} {warm.objective_[-1]:>12.1f} "
              f"{np.mean(cold_ndcg):>7.4f} {np.std(cold_ndcg):>6.4f} {ndcg(warm):>7.4f} "
              f"{ndcg(warm) - np.mean(cold_ndcg):>+7.4f}")
    print(f"median warm/cold time ratio over the 2% rounds: {statistics.median(ratios):.2f}; "
          f"warm NDCG@10 minus the cold fits' mean: {min(gaps):+.4f} to {max(gaps):+.4f}")


def toppush_stream(repeats):
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(DATA / "libsvm-w8a" / "w8a.gz"), n_features=300)
    X, y = X.tocsr(), (y > 0).astype(int)
    rng = np.random.default_rng(0)
    perm = rng.permutation(X.shape[0])
    n_train = 2 * X.shape[0] // 3
    train, test = perm[:n_train], perm[n_train:]
    print(f"\nTopPush on w8a, instances arriving in 2% chunks (reg 1); medians of {repeats}")
    print(f"{'round':>5} {'n':>7} {'cold s':>7} {'warm s':>7} {'ratio':>6} {'it c/w':>9} "
          f"{'pos@top c':>9} {'pos@top w':>9}")
    state, ratios = None, []
    for rnd, frac in enumerate([0.90, 0.92, 0.94, 0.96, 0.98, 1.00]):
        rows = train[:int(len(train) * frac)]
        Xr, yr = X[rows], y[rows]
        cold_s, cold = timed(lambda: TopPush(reg=1.0).fit(Xr, yr, ids=rows), repeats)
        if state is None:
            warm_s, warm = cold_s, cold
        else:
            warm_s, warm = timed(lambda: TopPush(reg=1.0).fit(Xr, yr, ids=rows,
                                                              warm_start=state), repeats)
            ratios.append(warm_s / cold_s)
        state = warm.warm_state()
        pc = pos_at_top(y[test], cold.decision_function(X[test]))
        pw = pos_at_top(y[test], warm.decision_function(X[test]))
        print(f"{rnd:>5} {len(rows):>7} {cold_s:>7.3f} {warm_s:>7.3f} {warm_s / cold_s:>6.2f} "
              f"{cold.n_iter_:>4}/{warm.n_iter_:<4} {pc:>9.3f} {pw:>9.3f}")
    print(f"median warm/cold time ratio over the 2% rounds: {statistics.median(ratios):.2f}")


def dataset_throughput(n_users=20000, per_user=100, n_items=5000):
    import pyarrow as pa

    from pipeline.ingest.events import schema
    from pipeline.ingest.local_store import LocalEventStore
    from pipeline.training.trainers.altsvm_data import collaborative

    rng = np.random.default_rng(0)
    n = n_users * per_user
    table = pa.table({
        "event_id": pa.array([f"e{i}" for i in range(n)]),
        "ts": pa.array(np.arange(n, dtype=np.int64) * 1000),
        "offset": pa.array(np.arange(n, dtype=np.int64)),
        "user": pa.array(np.repeat(np.arange(n_users), per_user).astype(str)),
        "item": pa.array(rng.integers(0, n_items, n).astype(str)),
        "rating": pa.array(rng.integers(1, 6, n).astype(float)),
    }, schema=schema("rating"))
    with tempfile.TemporaryDirectory() as tmp:
        store = LocalEventStore(tmp)
        for lo in range(0, n, 500_000):
            store.write("bench", 0, first=lo, last=min(lo + 500_000, n) - 1,
                        tables={"rating": table.slice(lo, 500_000)})
        times = []
        for _ in range(3):
            t = time.perf_counter()
            data = collaborative(store, ("rating",), holdout=5, max_pairs_per_user=200)
            times.append(time.perf_counter() - t)
    best = statistics.median(times)
    print(f"\ndataset building: {n:,} rating events -> {len(data.comparisons):,} comparisons "
          f"(cap 200 per user) in {best:.2f} s = {n / best / 1e6:.2f} M events/s (median of 3)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--altsvm", default="shipped", choices=("shipped", "explicit", "both"),
                        help="AltSVM stream: the shipped movies config (implicit comparisons, "
                        "item bias, λ from reg_max), all explicit pairs at reg 1000, or both")
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"data sets not found at {DATA} (set RANKSTREAM_DATA)")
    load1, load5, _ = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load1:.2f} (1 min) {load5:.2f} (5 min)")
    AltSVM(rank=2, max_iter=1).fit(np.array([[0, 0, 1]]))   # JIT outside the timings
    if args.altsvm in ("shipped", "both"):
        params, implicit = shipped_movies()
        altsvm_stream(args.repeats, params, implicit=implicit)
    if args.altsvm in ("explicit", "both"):
        altsvm_stream(args.repeats, dict(rank=10, reg=1000.0, random_state=0))
    toppush_stream(args.repeats)
    dataset_throughput()


if __name__ == "__main__":
    main()
