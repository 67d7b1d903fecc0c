"""AltSVM on MovieLens 100K, paper protocol (Park et al. 2015, §5.2), against its peers.

For every user with at least N + 10 ratings, N random ratings (seeded) go to training and
become all within-user comparisons with different ratings; the rest are that user's test
items; the score is NDCG@10 over the test items (gains 2^r − 1). On that one split, in one
process, this prints fit time (median of --repeats runs, interleaved) and NDCG@10 for

* AltSVM rank 10 and 100, reg 1000, 1 and all threads, with and without item bias,
* the global ranking (AltSVM with rank 0 and an item bias),
* AltSVM tuned (rank and reg chosen on other split seeds, see --tuned-rank/--tuned-reg),
* implicit's BPR (64 factors, positives = rating >= 4, implicit.cpu.bpr, fixed seed),

the ratio of each fit time to BPR's (same thread count), the first-call time of each AltSVM
code path (numba compile or cache load) separately, and a warm start after 5% more
comparisons. Run: ``.venv/bin/python bench/altsvm_movielens.py [--repeats 5]``.

Both AltSVM (numba's OpenMP layer) and implicit use OpenMP threads that spin after each
parallel region; on a machine whose cores are busy with other work that spinning costs a lot
(BPR with 2 threads ran 5x slower than with 1 here). ``OMP_WAIT_POLICY=PASSIVE`` (set before
starting Python) avoids it for both; the machine line says which policy a run had.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import scipy.sparse as sp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from solvers import (  # noqa: E402
    AltSVM,
    ConvergenceWarning,
    warm_up,  # noqa: E402
)
from solvers._ranking_metrics import ndcg_at_k  # noqa: E402
from solvers.pairs import pairs_from_ratings, split_ratings_per_user  # noqa: E402

C_PLUS_PLUS = "original C++ AltSVM (issue 3): rank 10, reg 1000, 2 threads: NDCG@10 0.692 " \
              "in 0.24-0.34 s, 427k comparisons, 8 outer iterations, 1.0-1.4x BPR's time"


def load(data_dir: Path):
    d = np.loadtxt(data_dir / "u.data", dtype=np.int64)
    return d[:, 0] - 1, d[:, 1] - 1, d[:, 2].astype(np.float64)


def machine_state() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load1, load5, _ = os.getloadavg()
    return (f"{platform.node()}: {os.cpu_count()} cores ({cpu}), load average {load1:.2f} "
            f"(1 min) {load5:.2f} (5 min), python {platform.python_version()}, "
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")


class Case:
    """One benchmarked configuration: a fit function and an NDCG function."""

    def __init__(self, name, threads, fit, score):
        self.name, self.threads, self._fit, self._score = name, threads, fit, score
        self.times, self.first, self.ndcg, self.info = [], None, None, ""

    def run(self):
        t0 = time.perf_counter()
        model = self._fit()
        elapsed = time.perf_counter() - t0
        if self.first is None:
            self.first = elapsed
            self.ndcg, self.info = self._score(model)
        else:
            self.times.append(elapsed)

    @property
    def median(self):
        return statistics.median(self.times) if self.times else float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" /
                    "movielens-100k")
    ap.add_argument("--n-train", type=int, default=50)
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--tuned-rank", type=int, default=50)
    ap.add_argument("--tuned-reg", type=float, default=500.0)
    ap.add_argument("--global-reg", type=float, default=2000.0)
    ap.add_argument("--skip-bpr", action="store_true")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", ConvergenceWarning)

    print(machine_state())
    seconds = sum(warm_up(args.threads).values())
    print(f"numba kernels ready in {seconds:.2f} s (compile on a first run, "
          "else load from the on-disk cache; not included below)")
    users, items, ratings = load(args.data)
    n_users, n_items = int(users.max()) + 1, int(items.max()) + 1
    train, test = split_ratings_per_user(users, args.n_train, 10, random_state=args.split_seed)
    t0 = time.perf_counter()
    comps = pairs_from_ratings(users[train], items[train], ratings[train])
    t_pairs = time.perf_counter() - t0
    tu, ti, tr = users[test], items[test], ratings[test]
    print(f"split: N={args.n_train}, seed {args.split_seed}, {np.unique(users[train]).size} users,"
          f" {train.size} training ratings -> {len(comps)} comparisons "
          f"({t_pairs * 1e3:.0f} ms), {test.size} test ratings")

    def ndcg_of(model):
        return ndcg_at_k(tu, tr, model.predict(tu, ti), k=10), \
            f"{model.n_iter_} it{'' if model.converged_ else ' (max_iter)'}"

    def altsvm(rank, reg, threads, bias, max_iter=20):
        def fit():
            return AltSVM(rank=rank, reg=reg, item_bias=bias, n_threads=threads,
                          random_state=0, max_iter=max_iter).fit(comps, n_users=n_users,
                                                                 n_items=n_items)
        return fit

    T = args.threads
    cases = []
    for threads in sorted({1, T}):
        for rank in (10, 100):
            for bias in (False, True):
                cases.append(Case(f"AltSVM rank {rank} reg 1000{' +bias' if bias else ''}",
                                  threads, altsvm(rank, 1000.0, threads, bias), ndcg_of))
        cases.append(Case(f"global ranking (rank 0 +bias, reg {args.global_reg:g})", threads,
                          altsvm(0, args.global_reg, threads, True), ndcg_of))
        cases.append(Case(f"AltSVM tuned rank {args.tuned_rank} reg {args.tuned_reg:g} +bias",
                          threads, altsvm(args.tuned_rank, args.tuned_reg, threads, True, 60),
                          ndcg_of))

    if not args.skip_bpr:
        from implicit.cpu.bpr import BayesianPersonalizedRanking

        pos = ratings[train] >= 4
        X = sp.csr_matrix((np.ones(pos.sum(), dtype=np.float32),
                           (users[train][pos], items[train][pos])), shape=(n_users, n_items))

        def bpr(threads):
            def fit():
                m = BayesianPersonalizedRanking(factors=64, random_state=0, num_threads=threads)
                m.fit(X, show_progress=False)
                return m
            return fit

        def bpr_ndcg(m):
            uf, vf = np.asarray(m.user_factors), np.asarray(m.item_factors)
            return ndcg_at_k(tu, tr, np.einsum("ij,ij->i", uf[tu], vf[ti]), k=10), \
                f"{m.iterations} it"

        for threads in sorted({1, T}):
            cases.append(Case("implicit BPR 64 factors (rating >= 4)", threads, bpr(threads),
                              bpr_ndcg))

    # a first call of every configuration (its time is the "first" column), then repeats
    print(f"\nfirst calls and {args.repeats} interleaved repeats ...")
    for rep in range(args.repeats + 1):
        for case in cases:
            case.run()
        print(f"  round {rep + 1}/{args.repeats + 1} done (load {os.getloadavg()[0]:.2f})",
              flush=True)

    bpr_time = {c.threads: c.median for c in cases if c.name.startswith("implicit")}
    print(f"\n{'model':<44} {'thr':>3} {'fit s (med)':>11} {'min':>6} {'first':>6} "
          f"{'NDCG@10':>8} {'/BPR':>6}  notes")
    for case in cases:
        ratio = case.median / bpr_time[case.threads] if case.threads in bpr_time else np.nan
        print(f"{case.name:<44} {case.threads:>3} {case.median:>11.3f} {min(case.times):>6.3f} "
              f"{case.first:>6.2f} {case.ndcg:>8.4f} {ratio:>6.2f}  {case.info}")

    # speed-ups from threads
    print()
    for name in dict.fromkeys(c.name for c in cases):
        by = {c.threads: c.median for c in cases if c.name == name}
        if len(by) == 2:
            print(f"{name:<44} 1 -> {T} threads: {by[1] / by[T]:.2f}x")

    # warm start after 5% more comparisons, paper settings, all threads
    new = np.random.default_rng(1).random(len(comps)) < 0.05
    kw = dict(rank=10, reg=1000.0, n_threads=T, random_state=0)
    base = AltSVM(**kw).fit(comps[~new], n_users=n_users, n_items=n_items)
    state = base.warm_state()
    cold_t, warm_t = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        cold = AltSVM(**kw).fit(comps, n_users=n_users, n_items=n_items)
        cold_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        warm = AltSVM(**kw).fit(comps, n_users=n_users, n_items=n_items, warm_start=state)
        warm_t.append(time.perf_counter() - t0)
    print(f"\nwarm start, rank 10 reg 1000, {T} threads, +5% comparisons: cold "
          f"{statistics.median(cold_t):.3f} s / {cold.n_iter_} it (objective "
          f"{cold.objective_[-1]:.1f}, NDCG {ndcg_of(cold)[0]:.4f}); warm "
          f"{statistics.median(warm_t):.3f} s / {warm.n_iter_} it (objective "
          f"{warm.objective_[-1]:.1f}, NDCG {ndcg_of(warm)[0]:.4f})")
    print(f"\nreference: {C_PLUS_PLUS}")
    print(machine_state())


if __name__ == "__main__":
    main()
