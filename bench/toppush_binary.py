"""Benchmark: TopPush against scikit-learn's LR and cost-sensitive linear SVM on bipartite ranking.

The protocol of Li, Jin, Zhou (Table 2) on the data sets present in ../shared/data:

* w8a (LIBSVM training part, 49,749 x 300 sparse): 3 random stratified 2/3-1/3 splits, seeds 0-2;
* spambase: the fixed split shipped with the authors' code (``toppush_spambase_split.mat``);
* diabetes (768 x 8): 10 random stratified 2/3-1/3 splits, min-max scaling fitted on the train part.

For each: fit time (median of repeated fits) and test Pos@Top, AP, NDCG, AUC of TopPush(reg=1)
at its default tol, the authors' algorithm (``bench/_toppush_reference.py``: a plain numpy port
of their ``topPush.m``, same λ = 1 and tol = 1e-4, their stopping rule and 10-iteration guard),
LogisticRegression() and LinearSVC(class_weight="balanced") (the paper's LR and cs-SVM, here with
C = 1 instead of cross-validated values), plus the time ratios, all on the same splits in the same
run. The row "LR challenger" is the gate's ``"logistic"`` challenger as the retrain loop trains
it (``pipeline.training.trainers.toppush.TunedLogistic``: C over ``LOGISTIC_C`` chosen by Pos@Top
on a validation fifth of the training part, then refitted on all of it; its time includes that
tuning), and a line per data set sets it beside TopPush. ``reg`` is λ of the paper's eq. 6 (the
authors' code calls it ``opt.lambda``, default 1).
A per-split table then sets TopPush beside the authors' algorithm: fit time, iterations, the
training objective P(w) of eq. 6 each stops at and its suboptimality P(w)/P* − 1, and test
Pos@Top, next to the optimum P* of the same problem (TopPush solved to a relative duality gap of
1e-6, so P* is certified to 1e-6; not timed), the suboptimality of w = 0 (P(0) = ℓ(0) = 1: when
it is small, eq. 6 barely prefers any ranker to the constant one) and the authors' algorithm
started from the paper's L = 1/(m+n) instead of their code's 1/m (not timed), which shows how
much of the Pos@Top difference is where the solvers stop rather than what they solve.
A third table sets every test metric against the trivial models: the best single feature (the
feature and sign with the highest value of that metric on the training part, evaluated on the
test part) and LR, with TopPush's lift over the best single feature and a plain verdict.
The first-call cost of the numba kernels (compile into an empty cache, and load from a warm
cache) is measured in fresh processes and reported apart. Finally, fit time against training
size on w8a subsamples, with the log-log slope (the paper's linear-scaling claim).

Run: ``.venv/bin/python bench/toppush_binary.py [--quick]``. Prints tables, nothing else.
``warn`` counts ConvergenceWarnings / degenerate-fit warnings (``solvers.toppush.
DegenerateFitWarning``, raised when w = 0 is within tol of the optimum) over all timed fits.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DATA = Path(os.environ.get("RANKSTREAM_DATA", REPO.parent / "shared" / "data"))
AUTHORS = "authors (numpy port)"
BEST1 = "best 1 feature"
METRICS = ("Pos@Top", "AP", "NDCG", "AUC")
OPTIMUM_TOL = 1e-6  # relative duality gap of the untimed reference optimum P*


def load_w8a():
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(DATA / "libsvm-w8a" / "w8a.gz"), n_features=300)
    return X.tocsr(), (y > 0).astype(int)


def load_spambase():
    from scipy.io import loadmat

    d = loadmat(DATA / "spambase" / "toppush_spambase_split.mat")
    return (d["Xtr"].tocsr(), (d["ytr"].ravel() > 0).astype(int),
            d["Xte"].tocsr(), (d["yte"].ravel() > 0).astype(int))


def load_diabetes():
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(DATA / "libsvm-diabetes" / "diabetes"), n_features=8)
    return X.toarray(), (y > 0).astype(int)


def splits(name, quick):
    """Yield (split label, Xtr, ytr, Xte, yte) for one data set."""
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import MinMaxScaler

    if name == "w8a":
        X, y = load_w8a()
        for seed in range(1 if quick else 3):
            Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=1 / 3, random_state=seed,
                                                  stratify=y)
            yield seed, Xtr, ytr, Xte, yte
    elif name == "spambase":
        yield "fixed", *load_spambase()
    elif name == "diabetes":
        X, y = load_diabetes()
        for seed in range(3 if quick else 10):
            Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=1 / 3, random_state=seed,
                                                  stratify=y)
            scaler = MinMaxScaler().fit(Xtr)
            yield seed, scaler.transform(Xtr), ytr, scaler.transform(Xte), yte


CHALLENGER = "LR challenger"


def models():
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    from bench._toppush_reference import AuthorsTopPush
    from pipeline.training.trainers.toppush import TunedLogistic
    from solvers import TopPush

    return {
        "TopPush": lambda: TopPush(reg=1.0),
        AUTHORS: lambda: AuthorsTopPush(reg=1.0),
        "LR": lambda: LogisticRegression(),
        "cs-SVM": lambda: LinearSVC(class_weight="balanced"),
        # the gate's challenger (as the gate trains it): tuned on a validation split, refitted
        CHALLENGER: lambda: TunedLogistic(metric="pos@top"),
    }


def metric_functions():
    from solvers._bipartite_metrics import auc, average_precision, ndcg, pos_at_top

    return dict(zip(METRICS, (pos_at_top, average_precision, ndcg, auc)))


class BestSingleFeature:
    """The trivial ranker: score = ±x_j for the one feature j and sign with the highest value of
    ``metric`` on the training data (ties: the lowest j, + before −)."""

    def __init__(self, *, metric="AUC"):
        self.metric = metric

    def fit(self, X, y):
        score_of = metric_functions()[self.metric]
        best = (-np.inf, 0, 1.0)
        for j in range(X.shape[1]):
            col = X[:, j].toarray().ravel() if hasattr(X, "toarray") else np.asarray(X[:, j])
            if col.min() == col.max():
                continue  # constant column: every metric at its tie value
            for sign in (1.0, -1.0):
                value = score_of(y, sign * col)
                if value > best[0]:
                    best = (value, j, sign)
        self.train_score_, self.feature_, self.sign_ = best
        return self

    def decision_function(self, X):
        col = X[:, self.feature_]
        col = col.toarray().ravel() if hasattr(col, "toarray") else np.asarray(col).ravel()
        return self.sign_ * col

    def label(self):
        return f"{'+' if self.sign_ > 0 else '-'}x{self.feature_}"


def fit_once(make, Xtr, ytr):
    """(seconds, fitted model, (convergence warnings, degenerate-fit warnings)) of one fit."""
    model = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        model.fit(Xtr, ytr)
        seconds = time.perf_counter() - t0
    messages = [str(w.message).lower() for w in caught]
    return seconds, model, (sum("converge" in m for m in messages),
                            sum("degenerate" in m for m in messages))


def timed_fits(makers, Xtr, ytr, repeats):
    """Median fit time per method; the methods take turns, so load changes hit all alike."""
    times = {k: [] for k in makers}
    last, n_warn = {}, {k: np.zeros(2, int) for k in makers}
    for _ in range(repeats):
        for label, make in makers.items():
            t, last[label], w = fit_once(make, Xtr, ytr)
            times[label].append(t)
            n_warn[label] += w
    return {k: float(np.median(v)) for k, v in times.items()}, last, n_warn


def first_call_times():
    """Seconds for import + first TopPush fit in a fresh process: cold cache and warm cache."""
    code = ("import time; t=time.perf_counter(); import numpy as np; from solvers import TopPush;"
            "import scipy.sparse as sp; rng=np.random.default_rng(0); X=rng.normal(size=(50,4));"
            "y=np.r_[np.ones(10),np.zeros(40)];"
            "TopPush().fit(X,y); TopPush().fit(sp.csr_matrix(X),y);"
            "print(time.perf_counter()-t)")
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        for label in ("empty numba cache", "warm numba cache"):
            env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=str(REPO))
            res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                 text=True, check=True, cwd=REPO)
            out[label] = float(res.stdout.strip().splitlines()[-1])
    return out


def untimed_references(Xtr, ytr, Xte, yte):
    """Per split, not timed: the optimum of eq. 6 (TopPush to a relative duality gap of
    ``OPTIMUM_TOL``, so P* is certified to that relative precision) and the authors' algorithm
    from the paper's L = 1/(m+n); (P(w), test Pos@Top) of each."""
    from bench._toppush_reference import AuthorsTopPush, primal_objective
    from solvers import TopPush
    from solvers._bipartite_metrics import pos_at_top

    out = {}
    for key, model in (("optimum", TopPush(reg=1.0, tol=OPTIMUM_TOL, max_iter=200000)),
                       ("paper L0", AuthorsTopPush(reg=1.0, l_init="paper"))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit(Xtr, ytr)
        w = np.asarray(model.coef_, dtype=np.float64)
        out[key] = (primal_objective(Xtr, ytr, w), pos_at_top(yte, model.decision_function(Xte)))
    return out


def evaluate(name, quick):
    from bench._toppush_reference import primal_objective

    repeats = {"w8a": 5, "spambase": 7, "diabetes": 7}[name]
    rows = {k: {"time": [], **{m: [] for m in METRICS}, "warn": np.zeros(2, int),
                "iters": [], "P": []} for k in models()}
    best1 = {m: {"test": [], "feature": []} for m in METRICS}
    per_split = []
    n_train = None
    for split, Xtr, ytr, Xte, yte in splits(name, quick):
        n_train = (int(ytr.sum()), int((ytr == 0).sum()), Xtr.shape[1])
        times, fitted, warns = timed_fits(models(), Xtr, ytr, repeats)
        for label, model in fitted.items():
            scores = model.decision_function(Xte)
            r = rows[label]
            r["time"].append(times[label])
            r["warn"] += warns[label]
            r["iters"].append(int(np.max(getattr(model, "n_iter_", 0))))
            if label in ("TopPush", AUTHORS):
                r["P"].append(primal_objective(Xtr, ytr, np.asarray(model.coef_, np.float64)))
            for metric, f in metric_functions().items():
                r[metric].append(f(yte, scores))
        for metric, f in metric_functions().items():  # chosen on train by this metric
            trivial = BestSingleFeature(metric=metric).fit(Xtr, ytr)
            best1[metric]["test"].append(f(yte, trivial.decision_function(Xte)))
            best1[metric]["feature"].append(trivial.label())
        per_split.append((split, untimed_references(Xtr, ytr, Xte, yte)))
    return rows, n_train, per_split, best1


def print_quality_table(results):
    print("\n## Fit time (median over splits of the median of repeated fits) and test metrics "
          "(mean ± std over splits)\n")
    print("P/P*-1: suboptimality in eq. 6 at the returned w, mean (max) over splits, P* from "
          f"TopPush at a relative duality gap of {OPTIMUM_TOL:g}. warn: convergence / "
          "degenerate-fit warnings over all timed fits.\n")
    head = (f"{'data (m/n/d train)':24s} {'method':20s} {'fit s':>8s} {'x LR':>6s} "
            f"{'x cs-SVM':>8s} {'x auth':>6s} {'iters':>6s} {'P/P*-1':>15s} {'Pos@Top':>13s} "
            f"{'AP':>13s} {'NDCG':>13s} {'AUC':>13s}  warn")
    print(head)
    print("-" * len(head))
    for name, (rows, (m, n, d), per_split, _) in results.items():
        t_lr = np.median(rows["LR"]["time"])
        t_svm = np.median(rows["cs-SVM"]["time"])
        t_auth = np.median(rows[AUTHORS]["time"])
        p_opt = np.array([ref["optimum"][0] for _, ref in per_split])
        for label, r in rows.items():
            t = np.median(r["time"])
            sub = f"{'-':>15s}"
            if r["P"]:
                gap = np.array(r["P"]) / p_opt - 1.0
                sub = f"{np.mean(gap):7.2%} ({np.max(gap):5.2%})"
            cells = " ".join(f"{np.mean(r[k]):.3f} ± {np.std(r[k]):.3f}" for k in METRICS)
            data = f"{name} ({m}/{n}/{d})" if label == "TopPush" else ""
            print(f"{data:24s} {label:20s} {t:8.4f} {t / t_lr:6.2f} {t / t_svm:8.2f} "
                  f"{t / t_auth:6.2f} {int(np.median(r['iters'])):6d} {sub} {cells}  "
                  f"{r['warn'][0]}/{r['warn'][1]}")
        print()


def print_challenger_lines(results):
    """TopPush beside the gate's logistic challenger: test metrics and fit time per data set."""
    from pipeline.training.trainers.toppush import LOGISTIC_C

    print(f"\n## TopPush vs the challenger (as the gate trains it: LogisticRegression, C in "
          f"{list(LOGISTIC_C)} chosen by Pos@Top on a validation fifth, refitted; time includes "
          "the tuning)\n")
    for name, (rows, _, _, _) in results.items():
        tp, ch = rows["TopPush"], rows[CHALLENGER]
        t_tp, t_ch = np.median(tp["time"]), np.median(ch["time"])
        cells = ", ".join(f"{m} {np.mean(tp[m]):.3f} vs {np.mean(ch[m]):.3f}" for m in METRICS)
        print(f"{name:9s} TopPush vs challenger: {cells}; fit {t_tp:.4f} s vs {t_ch:.4f} s "
              f"(challenger / TopPush {t_ch / t_tp:.2f})")


def print_split_table(results):
    """TopPush beside the authors' algorithm, split by split, on the same splits."""
    print("\n## TopPush vs the authors' algorithm, per split (same splits, same run)\n")
    print("P = training objective of eq. 6 at the returned w (lower is closer to the optimum); "
          f"optimum = TopPush\nto gap {OPTIMUM_TOL:g}; paper L0 = the authors' algorithm "
          "started from L = 1/(m+n) (Algorithm 1) instead of\ntheir code's 1/m. Pos@Top on the "
          "test part. optimum and paper L0 are fitted once, not timed.\nsub = P/P* - 1 (TP, "
          "auth, and w = 0, whose P(0) = 1).\n")
    head = (f"{'data':9s} {'split':>5s} {'TP s':>7s} {'auth s':>7s} {'TP/LR':>6s} "
            f"{'TP/auth':>7s} {'it TP':>6s} {'it auth':>7s} {'P TP':>8s} {'P auth':>8s} "
            f"{'P opt':>8s} {'sub TP':>7s} {'sub au':>7s} {'sub 0':>7s} {'TP':>6s} {'auth':>6s} "
            f"{'TP/auth':>7s} {'TP-auth':>7s} {'paperL0':>7s} {'opt':>6s} {'LR':>6s}")
    print(f"{'':95s}{'|':>2s} {'test Pos@Top':^58s}")
    print(head)
    print("-" * len(head))
    for name, (rows, _, per_split, _) in results.items():
        tp, au, lr = rows["TopPush"], rows[AUTHORS], rows["LR"]
        for i, (split, ref) in enumerate(per_split):
            p_tp, p_au = tp["Pos@Top"][i], au["Pos@Top"][i]
            ratio = f"{p_tp / p_au:7.2f}" if p_au > 0 else f"{'-':>7s}"
            p_opt = ref["optimum"][0]
            print(f"{name:9s} {str(split):>5s} {tp['time'][i]:7.3f} {au['time'][i]:7.3f} "
                  f"{tp['time'][i] / lr['time'][i]:6.2f} {tp['time'][i] / au['time'][i]:7.2f} "
                  f"{tp['iters'][i]:6d} {au['iters'][i]:7d} {tp['P'][i]:8.5f} {au['P'][i]:8.5f} "
                  f"{p_opt:8.5f} {tp['P'][i] / p_opt - 1:7.2%} {au['P'][i] / p_opt - 1:7.2%} "
                  f"{1.0 / p_opt - 1:7.2%} {p_tp:6.3f} {p_au:6.3f} {ratio} "
                  f"{p_tp - p_au:+7.3f} {ref['paper L0'][1]:7.3f} {ref['optimum'][1]:6.3f} "
                  f"{lr['Pos@Top'][i]:6.3f}")
        diff = np.array(tp["Pos@Top"]) - np.array(au["Pos@Top"])
        se = np.std(diff, ddof=1) / np.sqrt(diff.size) if diff.size > 1 else np.nan
        paper = np.mean([ref["paper L0"][1] for _, ref in per_split])
        opt = np.mean([ref["optimum"][1] for _, ref in per_split])
        print(f"{name:9s} {'mean':>5s} Pos@Top TopPush {np.mean(tp['Pos@Top']):.3f}, authors "
              f"{np.mean(au['Pos@Top']):.3f}, paper L0 {paper:.3f}, optimum {opt:.3f}; "
              f"TopPush - authors {np.mean(diff):+.3f} (paired s.e. {se:.3f}, TopPush higher on "
              f"{int((diff > 0).sum())}/{diff.size}); P below the authors' on "
              f"{int((np.array(tp['P']) < np.array(au['P'])).sum())}/{diff.size} splits")
        print()


def print_trivial_table(results):
    """Every test metric of TopPush against LR and the best single feature (chosen on train)."""
    print("\n## TopPush against the trivial models (test metric, mean over splits)\n")
    print("best 1 = the one feature and sign with the highest value of that metric on the "
          "training part (the feature chosen\nmost often is shown); lift = TopPush - best 1 "
          "(paired s.e. over splits; relative lift in brackets).\nverdict: 'no better' when "
          "the lift is within 2 paired s.e. of 0 (or < 0.005 with one split), 'worse' below.\n")
    head = (f"{'data':9s} {'metric':8s} {'TopPush':>8s} {'LR':>8s} {'best 1':>8s} "
            f"{'feature':>8s} {'lift':>22s}  {'vs best 1':10s} {'vs LR':10s}")
    print(head)
    print("-" * len(head))
    plain = []
    for name, (rows, _, _, best1) in results.items():
        for metric in METRICS:
            tp = np.array(rows["TopPush"][metric])
            lr = np.array(rows["LR"][metric])
            b1 = np.array(best1[metric]["test"])
            feats, counts = np.unique(best1[metric]["feature"], return_counts=True)
            verdicts = []
            for other in (b1, lr):
                diff = tp - other
                se = np.std(diff, ddof=1) / np.sqrt(diff.size) if diff.size > 1 else 0.0
                margin = max(2.0 * se, 0.005 if diff.size == 1 else 0.0)
                mean = float(np.mean(diff))
                verdicts.append("better" if mean > margin else
                                "worse" if mean < -margin else "no better")
            diff = tp - b1
            se = np.std(diff, ddof=1) / np.sqrt(diff.size) if diff.size > 1 else np.nan
            rel = np.mean(diff) / np.mean(b1) if np.mean(b1) > 0 else np.nan
            lift = f"{np.mean(diff):+.3f} ({se:.3f}) [{rel:+6.1%}]"
            print(f"{name:9s} {metric:8s} {np.mean(tp):8.3f} {np.mean(lr):8.3f} "
                  f"{np.mean(b1):8.3f} {feats[np.argmax(counts)]:>8s} {lift:>22s}  "
                  f"{verdicts[0]:10s} {verdicts[1]:10s}")
            for other, verdict in zip((BEST1, "LR"), verdicts):
                if verdict != "better":
                    plain.append(f"{name} {metric}: TopPush {verdict} than {other}")
        print()
    print("TopPush is not better than a trivial model in: " + ("; ".join(plain) or "none"))


def scaling(quick):
    """Fit time and iterations of TopPush on stratified w8a subsamples; log-log slopes."""
    from sklearn.model_selection import train_test_split

    from solvers import TopPush

    X, y = load_w8a()
    fractions = [1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0] if not quick else [1 / 8, 1 / 2, 1.0]
    sizes, times, iters = [], [], []
    print("\n## TopPush fit time vs training size (w8a stratified subsamples, median of 3 fits)\n")
    print(f"{'N':>7s} {'nnz':>9s} {'fit s':>8s} {'iters':>6s} {'ms/iter':>8s}")
    for frac in fractions:
        if frac < 1.0:
            Xs, _, ys, _ = train_test_split(X, y, train_size=frac, random_state=0, stratify=y)
        else:
            Xs, ys = X, y
        medians, fitted, _ = timed_fits({"TopPush": lambda: TopPush(reg=1.0)}, Xs, ys, 3)
        t, model = medians["TopPush"], fitted["TopPush"]
        sizes.append(Xs.shape[0])
        times.append(t)
        iters.append(model.n_iter_)
        print(f"{Xs.shape[0]:7d} {Xs.nnz:9d} {t:8.4f} {model.n_iter_:6d} "
              f"{1e3 * t / model.n_iter_:8.3f}")
    logn = np.log(sizes)
    slope_t = np.polyfit(logn, np.log(times), 1)[0]
    slope_it = np.polyfit(logn, np.log(np.array(times) / np.array(iters)), 1)[0]
    print(f"\nlog-log slope: fit time {slope_t:.2f}, time per iteration {slope_it:.2f} "
          f"(1.0 = linear in the number of training instances)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer splits and sizes")
    args = parser.parse_args()
    if not DATA.is_dir():
        sys.exit(f"data not found at {DATA} (set RANKSTREAM_DATA)")

    import numba
    import scipy
    import sklearn

    load = os.getloadavg()
    print("# TopPush bipartite ranking benchmark")
    print(f"machine: {os.cpu_count()} cores (shared with other processes; timings are noisy), "
          f"load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, scipy {scipy.__version__}, "
          f"numba {numba.__version__}, scikit-learn {sklearn.__version__}")
    from solvers import TopPush

    print(f"TopPush(reg=1.0): reg is λ of eq. 6 (authors' default λ = 1), default tol "
          f"{TopPush().tol:g} relative duality gap; authors (numpy port) = "
          "bench/_toppush_reference.py (their "
          "topPush.m: λ = 1, tol 1e-4, >= 10 iterations, L0 = 1/m, L doubles only); "
          "LR = LogisticRegression() (C=1, lbfgs); cs-SVM = LinearSVC(class_weight='balanced') "
          "(C=1)")

    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # every method single-threaded (BLAS/OpenMP), as TopPush's kernels are
    print("threads: BLAS/OpenMP limited to 1 for every method")
    jit = first_call_times()
    print("\nfirst call (fresh process: imports + two tiny fits, dense and CSR): "
          + ", ".join(f"{k} {v:.2f} s" for k, v in jit.items()))

    results = {}
    for name in ("w8a", "spambase", "diabetes"):
        results[name] = evaluate(name, args.quick)
    print_quality_table(results)
    print_challenger_lines(results)
    print_split_table(results)
    print_trivial_table(results)
    scaling(args.quick)
    load = os.getloadavg()
    print(f"\nload average at end {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}")


if __name__ == "__main__":
    main()
