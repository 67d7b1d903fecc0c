"""EASE, a closed-form item-item challenger (Steck 2019, "Embarrassingly Shallow Autoencoders
for Sparse Data"), for AltSVM's gate (``gate.challenger = ["als", "ease"]``).

The problem, with X the binary users x items matrix of met rows and λ > 0::

    min_B ‖X − X B‖²_F + λ ‖B‖²_F   subject to diag(B) = 0

has the closed form ``B = I − P · diag(1 / diag P)`` with ``P = (XᵀX + λI)⁻¹`` (Steck, eq. 8):
``B_ij = −P_ij / P_jj`` off the diagonal, 0 on it. A user's scores are ``x · B``. P is computed
in float32 by a Cholesky factorization and inverse (LAPACK ``spotrf``/``spotri``), about
``n³`` operations and two ``n x n`` float32 arrays.

**λ** is chosen on the validation split (fits on TRAIN) from ``LAMBDAS`` times TRAIN's mean
item count (so one grid fits catalogues of any density), by a search from ``LAMBDA_START`` in
steps of 2x, then √2. The chosen λ is then used **as it is** for the fits on more rows (the
holdout's, the published one), not rescaled by their larger mean count: the best λ does not
grow with the rows. On MovieLens 100K (NDCG@10 of relevant held-out items) it was 1,000,
700 and 500 when fitted on 40%, 64% and 80% of the bench's training rows (mean counts 19, 31
and 39), and 520 on all of them (47.5) against the bench's held-out 20%. Rescaled by the mean
count, the validation's choice became λ ≈ 1,540 for the published fit (P@10 0.2516 held out);
used as it is, 977 (0.2589).

**Published as a factor model, exactly.** ``x · B = U Vᵀ`` with ``U = X`` (each user's met
items as a 0/1 row, rank = the item count) and ``V = Bᵀ``: a ``user_item`` artifact whose
precomputed lists are exact top-K of ``X·B`` (seen items excluded), whose on-demand scores
are exact, and whose fold-in (``item_item`` in :mod:`pipeline.serving.item_queries`) is exact:
a new user's factor is the 0/1 row of their items, their scores ``x · B``. B lives in the
version's item factors (the existing ``V`` chunks: no new keys); with the users' rows that is
what bounds the model's size.

**On the most-met items of a large catalogue.** ``V`` is ``n_items x N`` floats for a model on
N items, and ``tune.ease_max_items`` (default 5,000) bounds it at that many squared (100 MB):
EASE is fitted on all the items up to it, and past it on the ``N = cap² / n_items`` items met
most often outside the holdout (the columns of X and B; the spec's ``items`` names them).
The other items get no EASE score (0): the long tail, which a top-10 of EASE's rarely reaches.
On a 9,700-item rating set that is its 2,577 most-met items, where EASE on every item would
publish 380 MB. It is skipped, with a one-line reason, under ``MIN_ITEMS`` such items, when
they hold under ``MIN_SHARE`` of the met rows (the tail is then most of what users meet), or
when its arrays (``2 N² · 4`` bytes and the users' rows) would take more than half of the memory
available. The refresher folds a user in like any other ``user_item`` model.

A warm run reuses the last λ until the rows grew by ``REUSE_GROWTH``, then searches next to
it; the fit itself has no warm start (it is one closed form).
"""

from __future__ import annotations

import time

import numpy as np

from pipeline.training.config import TUNE_KEYS
from pipeline.training.datasets import TEST, TRAIN, VALIDATION
from pipeline.training.trainers import Challenger
from pipeline.training.tuning import REUSE_GROWTH, pattern_search, skipped

# λ per TRAIN's mean item count (the mean of diag XᵀX), in steps of √2 from 1 to 512: on
# MovieLens 100K the validation peaks near 23 (λ ≈ 700 at a mean of 31 users per item);
# sparser catalogues want less
LAMBDAS = [round(2.0 ** (k / 2), 3) for k in range(19)]
LAMBDA_START = 16.0
MAX_LAMBDAS = 6        # λ values scored at most (each is one n³ inverse)
MIN_ITEMS = 100        # fewer columns than this say too little to be worth a challenger
# the share of the met rows its columns must hold: on amazon-beauty its 461 most-met of 54k
# items held 15% and its lists scored 0.04 Recall@20 against the item-kNN's 0.09 (11 s of the
# run, and three blend pairs); on Last.fm its 1,417 of 17.6k held 67% and blended best
MIN_SHARE = 0.5


def ease_weights(X, lam: float) -> np.ndarray:
    """B (float32, items x items) of the binary CSR ``X`` at ``lam`` (see the module).

    >>> from scipy.sparse import csr_matrix
    >>> X = csr_matrix(np.array([[1, 1, 0], [1, 1, 1], [0, 1, 1]], np.float32))
    >>> B = ease_weights(X, 1.0)
    >>> bool(np.allclose(np.diag(B), 0)), B.dtype.name
    (True, 'float32')
    """
    from scipy.linalg import lapack

    G = np.asarray((X.T @ X).toarray(), dtype=np.float32, order="F")
    G[np.diag_indices_from(G)] += np.float32(lam)
    c, info = lapack.spotrf(G, lower=False, overwrite_a=True, clean=False)
    if info != 0:
        raise np.linalg.LinAlgError(f"XᵀX + {lam:g} I is not positive definite (spotrf {info})")
    P, info = lapack.spotri(c, lower=False, overwrite_c=True)
    if info != 0:
        raise np.linalg.LinAlgError(f"XᵀX + {lam:g} I could not be inverted (spotri {info})")
    del c, G
    P = np.triu(P)
    P += np.triu(P, 1).T                     # spotri fills the upper triangle only
    d = np.diag(P).copy()
    P /= -d[None, :]                         # B_ij = −P_ij / P_jj
    P[np.diag_indices_from(P)] = 0.0
    return np.ascontiguousarray(P, dtype=np.float32)


def met_matrix(arrays: dict, parts):
    """Binary CSR (users x items) of the met rows in ``parts``."""
    from scipy.sparse import csr_matrix

    rows = np.isin(arrays["met_part"], parts)
    X = csr_matrix((np.ones(int(rows.sum()), np.float32),
                    (arrays["met_user"][rows], arrays["met_item"][rows])),
                   shape=(len(arrays["user_ids"]), len(arrays["item_ids"])))
    X.sum_duplicates()
    X.data[:] = 1.0
    return X


def factors(X, B: np.ndarray, items: np.ndarray | None = None, *, sparse: bool = False) -> tuple:
    """``(U, V, None)`` with ``U Vᵀ = X B``: U the 0/1 rows, V = Bᵀ; on the columns ``items``
    only (B over them), U is X's columns ``items`` and V has a row per item, zero off them.
    ``sparse`` (on ``items`` only): both as CSR, for the fits a run only scores (a 40k-user,
    39k-item set's dense pair on 647 columns was 200 MB per fit, kept for the blends)."""
    if items is None:
        return (np.asarray(X.toarray(), dtype=np.float32), np.ascontiguousarray(B.T), None)
    if sparse:
        import scipy.sparse as sp

        V = sp.csr_matrix(sp.coo_matrix(
            (np.asarray(B.T, np.float32).ravel(),
             (np.repeat(items, len(items)), np.tile(np.arange(len(items)), len(items)))),
            shape=(X.shape[1], len(items))))
        V.eliminate_zeros()
        return sp.csr_matrix(X[:, items], dtype=np.float32), V, None
    V = np.zeros((X.shape[1], len(items)), np.float32)
    V[items] = B.T
    return np.asarray(X[:, items].toarray(), dtype=np.float32), V, None


def columns(X, n_users: int, cfg) -> tuple[np.ndarray | None, str | None]:
    """``(items EASE is fitted on (None: every item), why it is not fitted (None: it is))``,
    by ``tune.ease_max_items`` and the memory (see the module); ``X``: the met rows outside
    the holdout, whose counts pick the most-met items."""
    n_items = X.shape[1]
    cap = int(cfg.tune.get("ease_max_items", TUNE_KEYS["ease_max_items"]))
    n = min(n_items, cap, cap * cap // max(n_items, 1))
    if n < min(MIN_ITEMS, n_items):
        return None, (f"EASE skipped: {n_items:,} items leave {n:,} columns under "
                      f"tune.ease_max_items {cap:,} (its weights are n_items x columns "
                      f"floats, at most {cap:,}²), under the {MIN_ITEMS} worth fitting")
    need = 2 * n * n * 4 + 3 * n_users * n * 4 + n_items * n * 4    # P, its copy; U; V
    free = available_memory()
    if free is not None and need > free // 2:
        return None, (f"EASE skipped: {n_items:,} items need {need / 2**30:.1f} GiB, over half "
                      f"of the {free / 2**30:.1f} GiB of memory available")
    if n == n_items:
        return None, None
    counts = np.asarray(X.sum(axis=0)).ravel()
    # the n most met (the lower index on a tie, so the choice is stable), in index order
    top = np.sort(np.argsort(-counts, kind="stable")[:n])
    share = float(counts[top].sum()) / max(float(counts.sum()), 1.0)
    if share < MIN_SHARE:
        return None, (f"EASE skipped: its {n:,} most-met of {n_items:,} items hold "
                      f"{share:.0%} of the met rows, under {MIN_SHARE:.0%}: it would score "
                      "most of what users meet 0 (an item-kNN covers every item)")
    return top, None


def available_memory() -> int | None:
    """Bytes of memory available (``MemAvailable`` of /proc/meminfo; None where unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _mean_count(X) -> float:
    return max(float(X.nnz) / max(X.shape[1], 1), 1.0)


def challenger(trainer, arrays: dict, cfg, warm: dict) -> Challenger:
    """λ chosen on VALIDATION (fits on TRAIN), the holdout scored by the TRAIN + VALIDATION
    fit, the fit on every met row published; on the most-met items of a large catalogue, or
    skipped with its reason (see the module)."""
    started = time.perf_counter()
    n_items = len(arrays["item_ids"])
    X = met_matrix(arrays, (TRAIN, VALIDATION))
    items, reason = columns(X, len(arrays["user_ids"]), cfg)
    if reason is not None:
        return Challenger(name="ease", metrics={}, artifact=None, skipped=reason,
                          tried=[skipped({"n_items": n_items}, reason)])

    def weights(X, lam: float) -> np.ndarray:
        return ease_weights(X if items is None else X[:, items], lam)

    metric = cfg.metric
    n_rows = int((arrays["met_part"] != TEST).sum())
    last = float(np.asarray(warm["ridge"])) if warm and "ridge" in warm else None
    tried, validated, warning, value = [], {}, None, None
    X_train = met_matrix(arrays, (TRAIN,))
    counted = X_train if items is None else X_train[:, items]
    if last is not None and n_rows <= REUSE_GROWTH * float(np.asarray(warm["n_rows"])):
        lam, source = last, "last tuning"
    else:
        grid = [round(per * _mean_count(counted), 1) for per in LAMBDAS]   # λ itself

        def score(params: dict):
            B = validated[params["lambda"]] = weights(X_train, params["lambda"])
            return trainer.topk_metrics(factors(X_train, B, items, sparse=True), arrays, cfg,
                                        VALIDATION).get(metric)

        near = LAMBDA_START * _mean_count(counted) if last is None else last
        best, tried, warning = pattern_search(
            {"lambda": grid}, {"lambda": min(grid, key=lambda v: abs(np.log(v / near)))}, score,
            higher_is_better=trainer.family.higher_is_better(metric),
            max_settings=MAX_LAMBDAS if last is None else 3,
            budget_seconds=float(cfg.tune.get("budget_seconds", TUNE_KEYS["budget_seconds"])),
            first_step=2 if last is None else 1)
        lam, source, value = best["params"]["lambda"], "tuned", best["validation"]
    evaluated = factors(X, weights(X, lam), items, sparse=True)
    metrics = trainer.evaluate(evaluated, arrays, cfg)
    X_all = met_matrix(arrays, (TRAIN, VALIDATION, TEST))
    served = factors(X_all, weights(X_all, lam), items)
    spec = {"method": "item_item", "input": "met",    # every met item, as X counts them
            **({} if items is None else {"items": items.tolist()})}
    artifact = trainer.factor_artifact(served, arrays, fold_in=spec)
    chosen = {"lambda": lam, **({} if items is None else {"items": len(items)})}
    return Challenger(name="ease", metrics=metrics, artifact=artifact,
                      tried=tried + [{"chosen": chosen, "source": source}],
                      fit_seconds=time.perf_counter() - started, warning=warning,
                      warm={"ridge": np.array(lam), "n_rows": np.array(n_rows)},
                      validated=None if lam not in validated else factors(
                          X_train, validated[lam], items, sparse=True),
                      evaluated=evaluated, served=served,
                      validation=value, fold_in=spec)
