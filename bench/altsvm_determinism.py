"""What a bit-for-bit reproducible AltSVM fit costs: the default stratified V-step (parallel,
the same numbers on any thread count) against the lock-free (Hogwild) one, at 1, 2 and the
machine's thread count.

For each thread count: two fits per V-step on the same comparisons with the same seed, taking
turns (so both see the same machine load); whether the two fits are identical (factors,
duals, objective, iterations), the largest difference of their factors when they are not,
their median wall time, and the Hogwild/stratified time ratio; then whether the stratified
fits of every thread count are one and the same fit.

Data: MovieLens 100K (``$RANKSTREAM_DATA``/movielens-100k/u.data, default ../shared/data),
implicit comparisons as the shipped ``movies`` model makes them (1,000 per user: a met item
beats an unmet one), rank 20, λ 100 (0.11 reg_max), 10 outer iterations. Without the data, a
planted problem of the same size.

Run: ``.venv/bin/python bench/altsvm_determinism.py [--repeats 3]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from solvers import AltSVM, warm_up  # noqa: E402
from solvers.pairs import implicit_comparisons  # noqa: E402


def comparisons() -> tuple[np.ndarray, str]:
    path = Path(os.environ.get("RANKSTREAM_DATA", REPO.parent / "shared" / "data"))
    u_data = path / "movielens-100k" / "u.data"
    rng = np.random.default_rng(0)
    if u_data.exists():
        d = np.loadtxt(u_data, dtype=np.int64)
        users, items = d[:, 0] - 1, d[:, 1] - 1
        source = "MovieLens 100K"
    else:
        users = rng.integers(0, 943, 100_000)
        items = np.minimum(rng.zipf(1.3, 100_000) - 1, 1681)
        source = "planted (MovieLens 100K absent)"
    n_items = int(items.max()) + 1
    c = implicit_comparisons(users, items, n_items, per_user=1000, random_state=0)
    return c, f"{source}: {len(c):,} implicit comparisons"


def fit(c, threads: int, deterministic: bool) -> tuple[AltSVM, float]:
    model = AltSVM(rank=20, reg=100.0, item_bias=True, max_iter=10, tol=0.0,
                   n_threads=threads, deterministic=deterministic, random_state=0)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(c)
    return model, time.perf_counter() - started


def identical(a: AltSVM, b: AltSVM) -> tuple[bool, float]:
    sa, sb = a.warm_state(), b.warm_state()
    same = all(np.array_equal(sa[k], sb[k]) for k in sa) and \
        np.array_equal(a.objective_, b.objective_) and a.n_iter_ == b.n_iter_
    return same, float(np.abs(a.item_factors_ - b.item_factors_).max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="fits per V-step and count")
    args = parser.parse_args()
    c, source = comparisons()
    warm_up()
    print(f"{source}; rank 20, λ 100 (0.11 reg_max), 10 outer iterations; {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'threads':>7} {'V-step':>8} {'identical':>9} {'max |ΔV|':>9} {'median s':>9}")
    stratified = []
    for threads in sorted({1, 2, os.cpu_count() or 1}):
        times = {True: [], False: []}
        fits = {True: [], False: []}
        for _ in range(max(2, args.repeats)):
            for deterministic in (True, False):
                model, seconds = fit(c, threads, deterministic)
                times[deterministic].append(seconds)
                fits[deterministic].append(model)
        for deterministic in (True, False):
            same, diff = identical(*fits[deterministic][:2])
            print(f"{threads:>7} {'strata' if deterministic else 'hogwild':>8} "
                  f"{'yes' if same else 'no':>9} {diff:>9.1e} "
                  f"{statistics.median(times[deterministic]):>9.2f}")
        ratio = statistics.median(times[False]) / statistics.median(times[True])
        print(f"{threads:>7} hogwild/stratified time: {ratio:.2f}")
        stratified.append(fits[True][0])
    same = all(identical(stratified[0], m)[0] for m in stratified[1:])
    print(f"stratified fits identical across thread counts: {'yes' if same else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
