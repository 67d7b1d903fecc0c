"""AltSVM on MovieLens 100K against tuned peers, in two protocols (issue #14, "Benchmark").

Every model is tuned on the SAME validation split, carved out of each training split, with a
grid at least as large for the peers as for AltSVM; then refit on the whole training split with
the chosen hyperparameters and scored once on the test split. All models run in one process on
the same splits; ``OMP_WAIT_POLICY=PASSIVE`` and one BLAS thread are the defaults (set below,
before numpy, numba or implicit load), since OpenMP threads that spin after each parallel
region cost a lot on a machine whose cores are busy with other work.

(a) top-K, what a user of the published lists gets. 80/20 random split of the ratings (split
    seeds 0..4). Validation: a random 1/8 of the training ratings (10% of all, seed 100 +
    split seed); models are tuned on the other 7/8. Every user's candidates are the items they
    have NOT rated in the (sub-)training part; hits are held-out ratings >= 4. Metrics
    (``bench/_recsys.py``): precision@10 = hits/10; recall@10 = hits/|P_u| (all the user's
    held-out positives, not min(10, |P_u|)); NDCG@10 with binary gains, IDCG over
    min(10, |P_u|) hits; mean over users; users with no held-out positive are skipped. Tuning
    maximizes validation NDCG@10 (``--tune-metric``). Models: popularity, implicit's ALS and
    BPR, AltSVM with implicit, explicit and mixed comparisons.
(b) paper, Park et al. (2015) §5.2: every user with >= N + 10 ratings gives N random ratings
    to training (N = 10, 20, 50; split seeds 0..4), the rest are their test items; NDCG@10 over
    each user's test items with gains 2^r - 1. Validation: max(3, N/5) of each user's N training
    ratings, NDCG@10 over them. Models: the global ranking (rank 0 + item bias, λ tuned), AltSVM
    rank 10 at the old default reg 1000, AltSVM on the regularization path.

Each model is a ``fit(train, n_users, n_items, params) -> Scores`` function plus a grid; an axis
that one fit can walk (implicit's iterations, AltSVM's reg_ratio) is tuned along the fit by a
``path`` function. Adding an AltSVM variant is one entry in ``topk_models``.

Run: ``.venv/bin/python bench/altsvm_movielens.py`` (~15 min on 2 idle cores), ``--quick``
(2 splits), ``--protocol topk|paper``, ``--models ALS,BPR``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # implicit asks for it; scoring is tiny

import argparse  # noqa: E402
import itertools  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import _recsys as R  # noqa: E402

from solvers import ConvergenceWarning, warm_up  # noqa: E402
from solvers import altsvm as altsvm_module  # noqa: E402
from solvers import pairs as pairs_module  # noqa: E402
from solvers._ranking_metrics import ndcg_at_k  # noqa: E402
from solvers.pairs import pairs_from_ratings, split_ratings_per_user  # noqa: E402

AltSVM = altsvm_module.AltSVM
HAS_PATH_API = hasattr(AltSVM, "fit_path") and hasattr(pairs_module, "implicit_comparisons")

C_PLUS_PLUS = ("original C++ AltSVM (issue 3), N=50 split seed 0: rank 10, reg 1000, 2 threads: "
               "NDCG@10 0.692 in 0.24-0.34 s, 427k comparisons")
K = 10
PATH_RATIOS = tuple(float(r) for r in np.geomspace(0.95, 0.02, 10))  # fractions of reg_max


# --------------------------------------------------------------------------- models

class Scores:
    """Score matrix ``U Vᵀ + bias`` of a factor model (``U``/``V`` None: the bias alone)."""

    def __init__(self, U=None, V=None, bias=None):
        self.U, self.V, self.bias = U, V, bias

    def matrix(self, n_users: int) -> np.ndarray:
        out = np.zeros((n_users, 1)) if self.U is None else self.U @ self.V.T
        return out + self.bias[None, :] if self.bias is not None else out


@dataclass
class Model:
    """A model of the top-K protocol: ``fit(train, n_users, n_items, params) -> Scores``, its
    grid (axis -> values), and optionally the axis ``path_axis`` that
    ``path(train, n_users, n_items, params, score) -> [(axis value, score), ...]`` walks in
    one fit. ``params`` always holds ``threads`` and ``seed`` besides the grid axes."""

    name: str
    fit: Callable
    grid: dict
    path_axis: str | None = None
    path: Callable | None = None
    describe: Callable = field(default=lambda p: ", ".join(f"{k}={v}" for k, v in p.items()))

    @property
    def size(self) -> int:
        return int(np.prod([len(v) for v in self.grid.values()]))


def popularity(train, n_users, n_items, p):
    """Every user gets the items by how many training ratings they have (>= 4, or all)."""
    X = train.matrix(n_users, n_items, min_rating=4 if p["count"] == "ratings>=4" else None)
    return Scores(bias=np.asarray(X.sum(axis=0), dtype=np.float64).ravel())


def _interactions(train, n_users, n_items, p):
    """implicit's input: one per training rating (all, or >= 4 only)."""
    return train.matrix(n_users, n_items, min_rating=4 if p["input"] == "ratings>=4" else None)


def _implicit(kind, p, iterations):
    if kind == "als":
        from implicit.cpu.als import AlternatingLeastSquares

        return AlternatingLeastSquares(
            factors=p["factors"], alpha=p["alpha"], regularization=p["regularization"],
            iterations=iterations, num_threads=p["threads"], random_state=p["seed"])
    from implicit.cpu.bpr import BayesianPersonalizedRanking

    return BayesianPersonalizedRanking(
        factors=p["factors"], learning_rate=p["learning_rate"],
        regularization=p["regularization"], iterations=iterations, num_threads=p["threads"],
        random_state=p["seed"])


def _implicit_fit(kind):
    def fit(train, n_users, n_items, p):
        m = _implicit(kind, p, p["iterations"])
        m.fit(_interactions(train, n_users, n_items, p), show_progress=False)
        return Scores(np.asarray(m.user_factors), np.asarray(m.item_factors))
    return fit


def _implicit_path(kind, iterations):
    """One fit of max(iterations) epochs, scored after each listed epoch by implicit's callback
    (both solvers run epoch t of a longer fit exactly as the t-epoch fit: checked at start)."""
    def path(train, n_users, n_items, p, score):
        m = _implicit(kind, p, max(iterations))
        out = []

        def callback(epoch, *_):
            if epoch + 1 in iterations:
                out.append((epoch + 1, score(Scores(m.user_factors, m.item_factors))))
        m.fit(_interactions(train, n_users, n_items, p), show_progress=False, callback=callback)
        return out
    return path


def comparisons(train, n_items, p):
    """AltSVM's input: implicit ("a rated item beats a sampled unrated one", per_interaction
    per rating, or per_user per user; only ratings >= min_rating win), explicit (within-user
    pairs of different ratings, at most max_pairs_per_user per user) or both."""
    parts = []
    if p["comparisons"] in ("implicit", "mixed"):
        parts.append(pairs_module.implicit_comparisons(
            train.users, train.items, n_items, per_interaction=p["per_interaction"],
            sampling=p.get("sampling", "uniform"), random_state=p["seed"],
            positive=train.ratings >= p.get("min_rating", 0.0),
            per_user=p.get("per_user") or None))
    if p["comparisons"] in ("explicit", "mixed"):
        parts.append(pairs_from_ratings(train.users, train.items, train.ratings,
                                        max_pairs_per_user=p.get("max_pairs_per_user"),
                                        random_state=p["seed"]))
    return np.concatenate(parts)


def _altsvm(p, **kw):
    return AltSVM(rank=p["rank"], item_bias=True, n_threads=p["threads"],
                  random_state=p["seed"], **kw)


def _altsvm_scores(m):
    return Scores(m.user_factors_, m.item_factors_, m.item_bias_)


def altsvm_fit(train, n_users, n_items, p):
    m = _altsvm(p, reg=None, reg_ratio=p["reg_ratio"])
    m.fit(comparisons(train, n_items, p), n_users=n_users, n_items=n_items)
    return _altsvm_scores(m)


def altsvm_path(train, n_users, n_items, p, score):
    m = _altsvm(p).fit_path(comparisons(train, n_items, p), n_users=n_users, n_items=n_items,
                            score=lambda model: score(_altsvm_scores(model)), ratios=PATH_RATIOS)
    return [(pt["ratio"], pt["score"]) for pt in m.path_]


def shipped_movies_model() -> Model:
    """The ``movies`` config of dags/models.toml as the pipeline trains it: its comparisons,
    rank and item bias, λ chosen along the trainer's own path (``PATH_RATIOS`` of
    pipeline/training/trainers/altsvm.py) on the same validation split as every model here."""
    import tomllib

    from pipeline.training.trainers.altsvm import PATH_RATIOS as TRAINER_RATIOS

    cfg = tomllib.loads((REPO / "dags" / "models.toml").read_text())["models"]["movies"]
    params = cfg["params"]
    ratios = tuple(float(r) for r in TRAINER_RATIOS)
    grid = {"comparisons": (params.get("comparisons", "implicit"),),
            "rank": (int(params["rank"]),),
            "per_interaction": (int(params.get("implicit_per_item", 10)),),
            "per_user": (int(params.get("implicit_per_user", 0)),),
            # "relevance": the threshold "auto" gives MovieLens' 1-5 scale, 4
            "min_rating": (4.0 if params.get("implicit_min_rating") == "relevance"
                           else float(params.get("implicit_min_rating", 0.0)),),
            "sampling": (params.get("implicit_sampling", "uniform"),),
            "max_pairs_per_user": (params.get("max_pairs_per_user"),),
            "reg_ratio": ratios}

    def path(train, n_users, n_items, p, score):
        m = _altsvm(p).fit_path(comparisons(train, n_items, p), n_users=n_users,
                                n_items=n_items, score=lambda model: score(_altsvm_scores(model)),
                                ratios=ratios)
        return [(pt["ratio"], pt["score"]) for pt in m.path_]
    return Model("AltSVM movies cfg", altsvm_fit, grid, "reg_ratio", path)


def topk_models() -> list[Model]:
    """The models of protocol (a) and their grids. Grid ranges come from scouting runs on split
    0's validation part (wider grids, 100-400 epochs): ALS's optimum is a ridge from (alpha 1,
    regularization ~12) over (alpha 10, 50: the top) to (alpha 80, ~200), flat beyond 25-50
    epochs; implicit's BPR peaks once learning_rate · epochs ≈ 0.5 and then overfits (peak
    0.16-0.17 for every rate from 0.0025 to 0.01); AltSVM's implicit comparisons gain ~0.002
    from 10 to 20 per interaction at twice the cost, and lose with popularity sampling."""
    als_iterations = (10, 25, 50)
    bpr_iterations = (50, 100, 200)
    models = [
        Model("popularity", popularity, {"count": ("all ratings", "ratings>=4")}),
        Model("ALS (implicit)", _implicit_fit("als"),
              {"input": ("all ratings", "ratings>=4"), "factors": (32, 128),
               "alpha": (3.0, 10.0, 30.0), "regularization": (20.0, 50.0, 100.0),
               "iterations": als_iterations},
              "iterations", _implicit_path("als", als_iterations)),
        Model("BPR (implicit)", _implicit_fit("bpr"),
              {"input": ("all ratings", "ratings>=4"), "factors": (32, 64),
               "learning_rate": (0.0025, 0.005, 0.01), "regularization": (0.0001, 0.001),
               "iterations": bpr_iterations},
              "iterations", _implicit_path("bpr", bpr_iterations)),
    ]
    if HAS_PATH_API:
        models += [
            Model("AltSVM implicit", altsvm_fit,
                  {"comparisons": ("implicit",), "rank": (10, 50),
                   "per_interaction": (3, 10), "reg_ratio": PATH_RATIOS},
                  "reg_ratio", altsvm_path),
            Model("AltSVM explicit", altsvm_fit,
                  {"comparisons": ("explicit",), "rank": (10, 50),
                   "max_pairs_per_user": (300, 1000), "reg_ratio": PATH_RATIOS},
                  "reg_ratio", altsvm_path),
            Model("AltSVM mixed", altsvm_fit,
                  {"comparisons": ("mixed",), "rank": (10, 50), "per_interaction": (3, 10),
                   "max_pairs_per_user": (300,), "reg_ratio": PATH_RATIOS},
                  "reg_ratio", altsvm_path),
            shipped_movies_model(),
        ]
    return models


# --------------------------------------------------------------------------- tuning

@dataclass
class Fold:
    """Training ratings and how a top-K list is scored against held-out ratings."""

    train: R.Ratings
    held: R.Ratings
    n_users: int
    n_items: int

    def __post_init__(self):
        self.seen = self.train.matrix(self.n_users, self.n_items)
        self.positives = self.held.positives(self.n_users, self.n_items, min_rating=4)

    def evaluate(self, scores: Scores) -> dict:
        return R.evaluate_topk(scores.matrix(self.n_users), self.seen, self.positives, K)


@dataclass
class Tuned:
    params: dict
    value: float
    n_evaluated: int
    seconds: float
    results: list  # (params, validation value)


def tune(model: Model, fold: Fold, fixed: dict, metric: str) -> Tuned:
    """Evaluate the whole grid on ``fold`` (path axes along one fit); the best by ``metric``."""
    axes = [a for a in model.grid if a != model.path_axis]
    results = []
    started = time.perf_counter()
    for values in itertools.product(*(model.grid[a] for a in axes)):
        p = {**fixed, **dict(zip(axes, values))}
        if model.path_axis is None:
            results.append((p, fold.evaluate(model.fit(fold.train, fold.n_users,
                                                        fold.n_items, p))[metric]))
        else:
            for value, score in model.path(fold.train, fold.n_users, fold.n_items, p,
                                           lambda s: fold.evaluate(s)[metric]):
                results.append(({**p, model.path_axis: value}, score))
    best = max(results, key=lambda r: r[1])
    return Tuned(best[0], best[1], len(results), time.perf_counter() - started, results)


def at_edge(model: Model, params: dict) -> list[str]:
    """Numeric axes of 3 or more values whose chosen value is the first or last of the grid
    (the optimum may lie outside it)."""
    out = []
    for axis, values in model.grid.items():
        if len(values) > 2 and all(isinstance(v, (int, float)) for v in values):
            if params[axis] in (values[0], values[-1]):
                out.append(f"{axis}={params[axis]:g}")
    return out


def show(model: Model, params: dict) -> str:
    keep = {k: v for k, v in params.items() if k in model.grid and len(model.grid[k]) > 1
            or k == "comparisons"}
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in keep.items())


# --------------------------------------------------------------------------- (a) top-K

def run_topk(users, items, ratings, n_users, n_items, seeds, threads, metric, only):
    models = [m for m in topk_models() if not only or m.name.split(" ")[0] in only
              or m.name in only]
    data = R.Ratings(users, items, ratings)
    print(f"\n== (a) top-{K} over unseen items: {len(seeds)} splits (80/20 random, seeds "
          f"{seeds[0]}..{seeds[-1]}); validation = 1/8 of training (10% of all); hits = held-out "
          f"ratings >= 4; tuned on validation {metric}@{K}; {threads} threads ==")
    for m in models:
        note = f" (axis '{m.path_axis}' walked within one fit)" if m.path_axis else ""
        print(f"  {m.name:<16} grid {m.size:>3} points{note}: "
              + "; ".join(f"{a} {list(v) if len(v) < 5 else f'{len(v)} values'}"
                          for a, v in m.grid.items()))
    if not HAS_PATH_API:
        print("  AltSVM variants: NOT RUN, the working tree has no AltSVM.fit_path / "
              "solvers.pairs.implicit_comparisons yet")
    rows = {m.name: [] for m in models}
    for seed in seeds:
        train_idx, test_idx = R.random_split(len(data), 0.2, seed)
        train, test = data[train_idx], data[test_idx]
        sub_idx, val_idx = R.random_split(len(train), 0.125, 100 + seed)
        val_fold = Fold(train[sub_idx], train[val_idx], n_users, n_items)
        test_fold = Fold(train, test, n_users, n_items)
        for m in models:
            fixed = {"threads": threads, "seed": seed}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ConvergenceWarning, CollapseWarning on paths
                tuned = tune(m, val_fold, fixed, metric)
                started = time.perf_counter()
                scores = m.fit(train, n_users, n_items, tuned.params)
                fit_s = time.perf_counter() - started
            result = test_fold.evaluate(scores)
            edge = at_edge(m, tuned.params)
            rows[m.name].append({**result, "fit_s": fit_s, "tune_s": tuned.seconds,
                                 "n_eval": tuned.n_evaluated, "params": tuned.params,
                                 "val": tuned.value, "edge": edge})
            print(f"  split {seed} {m.name:<16} {tuned.n_evaluated:>3} configs in "
                  f"{tuned.seconds:6.1f} s, val {metric} {tuned.value:.4f}: {show(m, tuned.params)}"
                  f"{'  [grid edge: ' + ', '.join(edge) + ']' if edge else ''}; refit "
                  f"{fit_s:.2f} s; test P@{K} {result['precision']:.4f} "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    return models, rows


def print_topk(models, rows, seeds):
    def ms(name, key):
        v = [r[key] for r in rows[name]]
        return f"{np.mean(v):.4f} ± {np.std(v):.4f}"

    def ratio(name, ref, key, agg):
        if ref not in rows:
            return "   -  "
        return f"{agg([a[key] / b[key] for a, b in zip(rows[name], rows[ref])]):6.2f}"

    refs = {"ALS": "ALS (implicit)", "BPR": "BPR (implicit)", "pop": "popularity"}
    counted = [r["n_users"] for r in rows[models[0].name]]
    print(f"\n(a) top-{K} over unseen items, test split, mean ± std over {len(seeds)} splits "
          f"({min(counted)}-{max(counted)} users with a held-out positive); fit s "
          "= median refit on the whole training split at the chosen point (after warm-up); tune "
          "s = median time of the whole grid search; ratios = mean over splits of same-split "
          "ratios (fit: median)")
    print(f"{'model':<17}{'grid':>5} {'P@10':>16} {'R@10':>16} {'NDCG@10':>16} {'fit s':>7} "
          f"{'tune s':>7} {'P/ALS':>6} {'P/BPR':>6} {'P/pop':>6} {'fit/ALS':>7}")
    for m in models:
        n = m.name
        fit_s = statistics.median(r["fit_s"] for r in rows[n])
        tune_s = statistics.median(r["tune_s"] for r in rows[n])
        n_eval = statistics.median(r["n_eval"] for r in rows[n])
        print(f"{n:<17}{n_eval:>5.0f} {ms(n, 'precision'):>16} {ms(n, 'recall'):>16} "
              f"{ms(n, 'ndcg'):>16} {fit_s:>7.3f} {tune_s:>7.1f} "
              f"{ratio(n, refs['ALS'], 'precision', np.mean)} "
              f"{ratio(n, refs['BPR'], 'precision', np.mean)} "
              f"{ratio(n, refs['pop'], 'precision', np.mean)} "
              f" {ratio(n, refs['ALS'], 'fit_s', statistics.median)}")
    print("grid = configurations evaluated on validation (median over splits; AltSVM's path "
          "stops after 2 points without improvement, so it can evaluate fewer than its grid)")
    print("\nchosen hyperparameters per split (validation value)")
    for m in models:
        print(f"  {m.name}")
        for seed, r in zip(seeds, rows[m.name]):
            edge = f"  [grid edge: {', '.join(r['edge'])}]" if r["edge"] else ""
            print(f"    split {seed}: {show(m, r['params'])} ({r['val']:.4f}){edge}")


# --------------------------------------------------------------------------- (b) paper

def run_paper(users, items, ratings, n_users, n_items, seeds, threads, ns):
    print(f"\n== (b) paper protocol (Park et al. 2015 §5.2): N = {list(ns)} training ratings per "
          f"user, split seeds {seeds[0]}..{seeds[-1]}; NDCG@{K} over each user's test items, "
          f"gains 2^r - 1; validation = max(3, N/5) of the N, NDCG@{K} over them; {threads} "
          "threads ==")
    global_regs = tuple(float(x) for x in np.geomspace(3.0, 3e4, 2 * len(PATH_RATIOS)))
    path_ranks = (10, 50)
    print(f"  global ranking: rank 0 + item bias, λ on a grid of {len(global_regs)} "
          f"({global_regs[0]:g}..{global_regs[-1]:g}), refit at λ · (comparisons in the N / "
          f"in the N - v); AltSVM reg 1000: rank 10, no item bias (the old default, as the C++ "
          f"original); AltSVM path: rank {list(path_ranks)} + item bias, reg_ratio path "
          f"{PATH_RATIOS[0]:.2f}..{PATH_RATIOS[-1]:.2f} ({len(PATH_RATIOS)} points, "
          "warm-started), refit cold on the N at the chosen reg_ratio")
    if not HAS_PATH_API:
        print("  AltSVM path: NOT RUN, the working tree has no AltSVM.fit_path yet")
    out = {}
    for n_train in ns:
        for seed in seeds:
            train, test = split_ratings_per_user(users, n_train, 10, random_state=seed)
            v = max(3, n_train // 5)
            sub_pos, val_pos = split_ratings_per_user(users[train], n_train - v, v,
                                                      random_state=100 + seed)
            sub, val = train[sub_pos], train[val_pos]
            c_sub = pairs_from_ratings(users[sub], items[sub], ratings[sub])
            c_all = pairs_from_ratings(users[train], items[train], ratings[train])

            def ndcg(model, idx):
                return ndcg_at_k(users[idx], ratings[idx], model.predict(users[idx], items[idx]),
                                 k=K)

            def timed_fit(model, c):
                started = time.perf_counter()
                model.fit(c, n_users=n_users, n_items=n_items)
                return model, time.perf_counter() - started

            row = out.setdefault(n_train, {}).setdefault(seed, {})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # the global ranking, λ tuned on validation
                t0 = time.perf_counter()
                vals = [ndcg(AltSVM(rank=0, item_bias=True, reg=lam, n_threads=threads,
                                    random_state=seed).fit(c_sub, n_users=n_users,
                                                           n_items=n_items), val)
                        for lam in global_regs]
                tune_s = time.perf_counter() - t0
                best = int(np.argmax(vals))
                lam = global_regs[best] * len(c_all) / len(c_sub)
                model, fit_s = timed_fit(AltSVM(rank=0, item_bias=True, reg=lam,
                                                n_threads=threads, random_state=seed), c_all)
                # reference only, never used to choose: the best TEST value over the same grid
                oracle = max(ndcg(AltSVM(rank=0, item_bias=True, reg=g * len(c_all) / len(c_sub),
                                         n_threads=threads, random_state=seed).fit(
                    c_all, n_users=n_users, n_items=n_items), test) for g in global_regs)
                row["global"] = {"ndcg": ndcg(model, test), "fit_s": fit_s, "tune_s": tune_s,
                                 "reg": lam, "val": vals[best], "oracle": oracle,
                                 "edge": best in (0, len(global_regs) - 1)}
                # AltSVM at the old default
                model, fit_s = timed_fit(AltSVM(rank=10, reg=1000.0, n_threads=threads,
                                                random_state=seed), c_all)
                row["reg1000"] = {"ndcg": ndcg(model, test), "fit_s": fit_s,
                                  "n_iter": model.n_iter_,
                                  "collapsed": bool(getattr(model, "collapsed_", False))}
                if HAS_PATH_API:
                    best_path = None
                    t0 = time.perf_counter()
                    for rank in path_ranks:
                        started = time.perf_counter()
                        m = AltSVM(rank=rank, item_bias=True, n_threads=threads,
                                   random_state=seed).fit_path(
                            c_sub, n_users=n_users, n_items=n_items,
                            score=lambda model: ndcg(model, val), ratios=PATH_RATIOS)
                        path_s = time.perf_counter() - started
                        top = max(m.path_, key=lambda pt: pt["score"])
                        if best_path is None or top["score"] > best_path[1]["score"]:
                            best_path = (rank, top, path_s, m.path_)
                    tune_s = time.perf_counter() - t0
                    rank, top, path_s, path = best_path
                    _, cold_s = timed_fit(AltSVM(rank=rank, item_bias=True, reg=top["reg"],
                                                 n_threads=threads, random_state=seed), c_sub)
                    model, fit_s = timed_fit(AltSVM(rank=rank, item_bias=True, reg=None,
                                                    reg_ratio=top["ratio"], n_threads=threads,
                                                    random_state=seed), c_all)
                    oracle = max(max(pt["score"] for pt in AltSVM(
                        rank=r, item_bias=True, n_threads=threads, random_state=seed).fit_path(
                        c_all, n_users=n_users, n_items=n_items,
                        score=lambda model: ndcg(model, test), ratios=PATH_RATIOS).path_)
                        for r in path_ranks)
                    row["path"] = {"ndcg": ndcg(model, test), "fit_s": fit_s, "tune_s": tune_s,
                                   "rank": rank, "ratio": top["ratio"], "reg_sub": top["reg"],
                                   "reg": model.reg_, "val": top["score"], "path_s": path_s,
                                   "path_fits_s": sum(pt["seconds"] for pt in path),
                                   "cold_s": cold_s, "points": len(path), "oracle": oracle,
                                   "edge": top["ratio"] in (PATH_RATIOS[0], PATH_RATIOS[-1])}
            print(f"  N={n_train:<3} split {seed}: {len(c_all)} comparisons; global "
                  f"{row['global']['ndcg']:.4f}, reg 1000 {row['reg1000']['ndcg']:.4f}"
                  + (f", path {row['path']['ndcg']:.4f} (rank {row['path']['rank']}, ratio "
                     f"{row['path']['ratio']:.3f})" if "path" in row else "")
                  + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    return out


def print_paper(out, seeds):
    print(f"\n(b) paper protocol: test NDCG@{K} mean ± std over {len(seeds)} splits; lift = "
          "NDCG - the global ranking's on the same split (mean, then per split); fit s = median "
          "refit on the N ratings")
    names = {"global": "global ranking (λ tuned)", "reg1000": "AltSVM rank 10 reg 1000",
             "path": "AltSVM path (tuned)"}
    for n_train, by_seed in out.items():
        print(f"N = {n_train}")
        for key, name in names.items():
            rows = [by_seed[s][key] for s in seeds if key in by_seed[s]]
            if not rows:
                continue
            nd = np.array([r["ndcg"] for r in rows])
            lift = nd - np.array([by_seed[s]["global"]["ndcg"] for s in seeds])
            fit_s = statistics.median(r["fit_s"] for r in rows)
            lifts = " ".join(f"{x:+.4f}" for x in lift)
            collapsed = sum(r.get("collapsed", False) for r in rows)
            print(f"  {name:<26} {nd.mean():.4f} ± {nd.std():.4f}  fit {fit_s:6.3f} s"
                  + (f"  lift {lift.mean():+.4f} ({lifts})" if key != "global" else "")
                  + (f"  [collapsed to U = V = 0 on {collapsed}/{len(rows)} splits: reg 1000 >= "
                     "reg_max, every score 0]" if collapsed else ""))
        if all("path" in by_seed[s] for s in seeds):
            og = np.array([by_seed[s]["global"]["oracle"] for s in seeds])
            op = np.array([by_seed[s]["path"]["oracle"] for s in seeds])
            print(f"  reference only, tuned on TEST over the same grids: global {og.mean():.4f}, "
                  f"AltSVM path {op.mean():.4f}, lift {np.mean(op - og):+.4f} ("
                  + " ".join(f"{x:+.4f}" for x in op - og) + ")")
        for s in seeds:
            g = by_seed[s]["global"]
            line = (f"    split {s}: global λ {g['reg']:.4g} (val {g['val']:.4f}"
                    f"{', grid edge' if g['edge'] else ''})")
            if "path" in by_seed[s]:
                p = by_seed[s]["path"]
                line += (f"; path: rank {p['rank']}, reg_ratio {p['ratio']:.3f} (λ "
                         f"{p['reg_sub']:.4g} on the N - v, {p['reg']:.4g} on the N; val "
                         f"{p['val']:.4f}{', path edge' if p['edge'] else ''}); its path: "
                         f"{p['points']} points in {p['path_s']:.2f} s ({p['path_fits_s']:.2f} s "
                         f"in fits, the rest reg_max and scoring) vs one cold fit at that λ "
                         f"{p['cold_s']:.2f} s = {p['path_s'] / p['cold_s']:.1f}x "
                         f"({p['path_fits_s'] / p['cold_s']:.1f}x fits only); both ranks' paths "
                         f"{p['tune_s']:.2f} s")
            print(line)
    if 50 in out and 0 in out[50]:
        r = out[50][0]["reg1000"]
        print(f"\nrank 10 reg 1000, N=50 split 0: NDCG@{K} {r['ndcg']:.4f} in {r['fit_s']:.3f} s, "
              f"{r['n_iter']} outer iterations; reference: {C_PLUS_PLUS}")


# --------------------------------------------------------------------------- checks, main

def check_iteration_paths() -> None:
    """implicit's ALS and BPR after epoch t of a longer fit (callback) equal a t-epoch fit, so
    scoring along one fit is the same as fitting each iteration count (1 thread: exact)."""
    rng = np.random.default_rng(0)
    X = sp.random(30, 40, density=0.2, random_state=rng, format="csr", dtype=np.float32)
    X.data[:] = 1.0
    for kind, p in (("als", {"factors": 4, "alpha": 2.0, "regularization": 2.0}),
                    ("bpr", {"factors": 4, "learning_rate": 0.05, "regularization": 0.01})):
        p = {**p, "threads": 1, "seed": 0}
        snap = {}
        m = _implicit(kind, p, 6)
        m.fit(X, show_progress=False, callback=lambda e, *_: snap.setdefault(
            e + 1, np.array(m.user_factors)))
        short = _implicit(kind, p, 3)
        short.fit(X, show_progress=False)
        assert np.array_equal(snap[3], np.asarray(short.user_factors)), kind


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
            f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
            f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}")


def load(data_dir: Path):
    d = np.loadtxt(data_dir / "u.data", dtype=np.int64)
    return d[:, 0] - 1, d[:, 1] - 1, d[:, 2].astype(np.float64)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path(os.environ.get(
        "RANKSTREAM_DATA", REPO.parent / "shared" / "data")) / "movielens-100k")
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 splits instead of 5")
    ap.add_argument("--protocol", choices=("topk", "paper", "both"), default="both")
    ap.add_argument("--models", default="", help="comma-separated top-K models (first word "
                    "or full name), e.g. 'popularity,ALS,AltSVM implicit'; default all")
    ap.add_argument("--paper-n", default="10,20,50")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--tune-metric", choices=("ndcg", "precision", "recall"), default="ndcg")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", ConvergenceWarning)
    seeds = list(range(2 if args.quick else args.splits))
    started = time.perf_counter()

    print(machine_state())
    print(f"self-check of the top-K metrics against a brute-force reference: "
          f"{R.self_check()} users on 200 random problems agree")
    check_iteration_paths()
    print("self-check: implicit ALS/BPR scored after epoch t of a longer fit == a t-epoch fit")
    seconds = sum(warm_up(args.threads).values())
    print(f"numba kernels ready in {seconds:.2f} s (compile, or load from the on-disk cache; "
          "not included below)")
    users, items, ratings = load(args.data)
    n_users, n_items = int(users.max()) + 1, int(items.max()) + 1
    print(f"MovieLens 100K: {len(users)} ratings, {n_users} users, {n_items} items; AltSVM "
          f"path API {'present' if HAS_PATH_API else 'ABSENT (AltSVM variants skipped)'}")

    if args.protocol in ("topk", "both"):
        only = {s.strip() for s in args.models.split(",") if s.strip()}
        models, rows = run_topk(users, items, ratings, n_users, n_items, seeds, args.threads,
                                args.tune_metric, only)
    if args.protocol in ("paper", "both"):
        out = run_paper(users, items, ratings, n_users, n_items, seeds, args.threads,
                        [int(n) for n in args.paper_n.split(",")])
    if args.protocol in ("topk", "both"):
        print_topk(models, rows, seeds)
    if args.protocol in ("paper", "both"):
        print_paper(out, seeds)
    print(f"\ntotal {time.perf_counter() - started:.0f} s; {machine_state()}")


if __name__ == "__main__":
    main()
