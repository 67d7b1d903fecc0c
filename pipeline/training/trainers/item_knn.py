"""Item-kNN, the sparse item-item challenger for AltSVM's gate (``gate.challenger = [...,
"knn"]``): cosine similarity with shrinkage, each item's ``k`` most similar items kept
(:mod:`solvers.neighbours`). Dacrema et al. (2019) found such a tuned neighbourhood model
level with or ahead of most published deep recommenders on sparse implicit data; where EASE's
dense items x items inverse does not fit (amazon-beauty's 57k items: 13 GB), it is the
item-item model that scales. It runs where EASE, listed before it, does not fit every item
(past ``tune.ease_max_items`` items, or EASE not configured): where EASE fits, it is the
stronger one.

**Cost.** Memory is the kept neighbours, 8 bytes x ``k`` per item (57k items at k = 200:
0.09 GB; while the search ranks them, 16 bytes x the longest ``k`` per item, twice),
plus a row of counts of the catalogue per thread; time is the co-occurrences' count
(Σ over users of their item count squared), on every thread (:mod:`solvers.neighbours`).
Nothing is as wide as the catalogue squared.

**Tuning.** ``k`` of :data:`NEIGHBOURS` and the shrinkage of :data:`SHRINKS` are chosen on the
validation split (fits on TRAIN, the searched users' lists scored: ``tune.sample_users``) by a
compass search from :data:`START` (at most :data:`MAX_SETTINGS` settings); a shrinkage's
neighbours are built once, to the longest ``k``, and each ``k`` is a slice of them (the last
two shrinkages' are kept: a compass search moves one axis at a time). The chosen setting is
refitted on TRAIN + VALIDATION (scored on the holdout) and on every met row (published). A
warm run reuses the last setting until the rows grew by ``REUSE_GROWTH``, then searches from
it.

**Published sparsely, exactly.** Scores ``X Vᵀ`` with ``U = X`` (each user's met items as a
0/1 CSR row) and ``V`` the items' neighbour rows (CSR): a ``user_item`` artifact with sparse
factors (``REDIS_LAYOUT.md``: ``factor_format = csr``), whose precomputed lists, on-demand
scores and fold-in (``item_item``: a new user's factor is the 0/1 row of their items) are the
model's own.
"""

from __future__ import annotations

import time

import numpy as np

from pipeline.training.config import TUNE_KEYS
from pipeline.training.datasets import TEST, TRAIN, VALIDATION
from pipeline.training.selection import NearBest
from pipeline.training.trainers import Challenger
from pipeline.training.trainers.altsvm_data import tuning_view
from pipeline.training.trainers.ease import met_matrix
from pipeline.training.tuning import REUSE_GROWTH, pattern_search, skipped
from solvers.neighbours import cosine_neighbours, neighbour_rows

# k: neighbours kept per item (the peers' grid tops out at 200; on synthetic-1m, 39k Zipf
# items, 400 was 57 s and most of a 3 GB run for a list no better than popularity's)
NEIGHBOURS = (25, 50, 100, 200)
# the similarity's shrinkage (in co-occurrence counts): on amazon-beauty the search moved from
# 10 to 200, the grid's edge then; sparse catalogues want much of it
SHRINKS = (0.0, 10.0, 50.0, 200.0, 1000.0)
START = {"k": 100, "shrink": 50.0}
MAX_SETTINGS = 8
MIN_ITEMS = 2


def fit(X, k: int, shrink: float):
    """The factors ``(X, V, None)`` of the item-kNN of the binary CSR ``X`` (see the module)."""
    nbr = cosine_neighbours(X, (shrink,), k)[float(shrink)]
    return X, neighbour_rows(nbr, X.shape[1], k), None


def challenger(trainer, arrays: dict, cfg, warm: dict,
               ease: Challenger | None = None) -> Challenger:
    """``k`` and the shrinkage chosen on VALIDATION (fits on TRAIN), the holdout scored by
    the TRAIN + VALIDATION fit, the fit on every met row published (see the module); skipped
    where ``ease`` (this run's EASE, fitted before it) covers every item."""
    started = time.perf_counter()
    n_items = len(arrays["item_ids"])
    reason = None
    if n_items < MIN_ITEMS:
        reason = f"item-kNN skipped: {n_items} item(s), no neighbours to find"
    elif ease is not None and ease.skipped is None and "items" not in (ease.fold_in or {}):
        # EASE is the stronger item-item model where it fits (Steck 2019; on ml-1m-implicit
        # 0.2819 Recall@20 against 0.2248, and the kNN took 34 s of a 108 s run)
        reason = (f"item-kNN skipped: EASE fits every one of the {n_items:,} items (the ones "
                  "the events met), the stronger item-item model where it fits")
    if reason is not None:
        return Challenger(name="knn", metrics={}, artifact=None, skipped=reason,
                          tried=[skipped({"n_items": n_items}, reason)])
    metric = cfg.metric
    n_rows = int((arrays["met_part"] != TEST).sum())
    last = None
    if warm and "k" in warm:
        last = {"k": int(np.asarray(warm["k"])), "shrink": float(np.asarray(warm["shrink"]))}
    higher = trainer.family.higher_is_better(metric)
    tried, warning, value, validated = [], None, None, NearBest(0.0, higher)
    if last is not None and n_rows <= REUSE_GROWTH * float(np.asarray(warm["n_rows"])):
        choice, source = last, "last tuning"
    else:
        view = tuning_view(arrays)          # the searched users' rows, up to a count
        X_train = met_matrix(arrays, (TRAIN,))
        built: dict = {}       # shrinkage -> its longest lists, the last two searched

        def score(params: dict):
            shrink = params["shrink"]
            if shrink not in built:
                if len(built) >= 2:
                    del built[next(iter(built))]
                built[shrink] = cosine_neighbours(X_train, (shrink,), max(NEIGHBOURS))[shrink]
            factors = (X_train, neighbour_rows(built[shrink], n_items, params["k"]), None)
            value = trainer.topk_metrics(factors, view, cfg, VALIDATION).get(metric)
            validated.offer((params["k"], params["shrink"]), value, factors)
            return value

        start = last if last is not None and last["k"] in NEIGHBOURS \
            and last["shrink"] in SHRINKS else START
        best, tried, warning = pattern_search(
            {"k": list(NEIGHBOURS), "shrink": list(SHRINKS)}, start, score,
            higher_is_better=higher,
            max_settings=MAX_SETTINGS if last is None else 3, first_step=1,
            budget_seconds=float(cfg.tune.get("budget_seconds", TUNE_KEYS["budget_seconds"])))
        del built
        choice, source, value = dict(best["params"]), "tuned", best["validation"]
    k, shrink = int(choice["k"]), float(choice["shrink"])
    evaluated = fit(met_matrix(arrays, (TRAIN, VALIDATION)), k, shrink)
    metrics = trainer.evaluate(evaluated, arrays, cfg)
    served = fit(met_matrix(arrays, (TRAIN, VALIDATION, TEST)), k, shrink)
    spec = {"method": "item_item", "input": "met"}    # every met item, as X counts them
    artifact = trainer.factor_artifact(served, arrays, fold_in=spec)
    return Challenger(name="knn", metrics=metrics, artifact=artifact,
                      tried=tried + [{"chosen": {"k": k, "shrink": shrink}, "source": source}],
                      fit_seconds=time.perf_counter() - started, warning=warning,
                      warm={"k": np.array(k), "shrink": np.array(shrink),
                            "n_rows": np.array(n_rows)},
                      validated=validated.get((k, shrink)), evaluated=evaluated,
                      served=served, validation=value, fold_in=spec)
