"""Top-K throughput: every user's exact top-K items of ``U Vᵀ`` (the lists a retrain scores on
validation and the holdout, and publishes), ``solvers.topk.user_topk`` against numpy's own
(``argpartition`` + ``argsort`` of each block of score rows, the same blocked BLAS product) on
the same factors, in one process.

Factors are random normal (rank ``--rank``), users ``--users``, catalogues ``--items`` (a
comma list): the cost is the product (users x items x rank) plus one read of each score row.
Prints seconds (median of ``--repeats``) and numpy's time over ours; the two must return the
same items (checked on the first block of every size: ties are rare with random factors).

    .venv/bin/python bench/topk_throughput.py
    .venv/bin/python bench/topk_throughput.py --users 40000 --items 1682,39000,100000 --rank 64
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def numpy_topk(U: np.ndarray, V: np.ndarray, k: int, block: int = 256) -> np.ndarray:
    """The peer: each block's scores by one BLAS product, ``argpartition`` to the best k, then
    those ranked (descending score, then the lower index, as ours)."""
    VT = np.ascontiguousarray(V.T)
    out = np.empty((U.shape[0], k), np.int64)
    for start in range(0, U.shape[0], block):
        s = U[start:start + block] @ VT
        part = np.argpartition(-s, k - 1, axis=1)[:, :k]
        top = np.take_along_axis(s, part, axis=1)
        order = np.lexsort((part, -top), axis=1)
        out[start:start + block] = np.take_along_axis(part, order, axis=1)
    return out


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--items", default="1682,39000,100000", help="catalogue sizes, a comma list")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    sizes = [x for x in args.items.split(",") if x]
    if not all(x.isdigit() and int(x) >= 1 for x in sizes) or not sizes:
        ap.error(f"--items {args.items!r}: expected catalogue sizes >= 1, e.g. 1682,39000")
    if min(args.users, args.rank, args.k, args.repeats) < 1:
        ap.error("--users, --rank, --k and --repeats must be at least 1")
    from solvers.topk import user_topk, warm_up

    warm_up()
    rng = np.random.default_rng(0)
    U = rng.standard_normal((args.users, args.rank), dtype=np.float32)
    print(f"{os.cpu_count()} cores; {args.users:,} users, rank {args.rank}, k {args.k}; "
          f"median of {args.repeats}")
    print(f"{'items':>8} {'ours s':>8} {'numpy s':>8} {'numpy/ours':>10}")
    for n_items in map(int, sizes):
        V = rng.standard_normal((n_items, args.rank), dtype=np.float32)
        k = min(args.k, n_items)          # a catalogue shorter than k: every item
        ours = user_topk(U[:256], V, k)[0]
        if not np.array_equal(ours, numpy_topk(U[:256], V, k)):
            print(f"{n_items:>8} lists differ from numpy's: a defect")
            return 1
        t_ours = median_seconds(lambda: user_topk(U, V, k), args.repeats)
        t_np = median_seconds(lambda: numpy_topk(U, V, k), args.repeats)
        print(f"{n_items:>8,} {t_ours:>8.3f} {t_np:>8.3f} {t_np / t_ours:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
