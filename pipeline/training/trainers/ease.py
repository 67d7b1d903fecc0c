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
version's item factors (the existing ``V`` chunks: no new keys), ``n² · 4`` bytes; with the
users' rows that is what bounds the model's size, so EASE is skipped, with a one-line reason,
above ``tune.ease_max_items`` items (default 5,000: 100 MB of B) or when ``2 n² · 4`` bytes
(and the users' rows) would take more than half of the memory available. The refresher folds
a user in like any other ``user_item`` model.

A warm run reuses the last λ until the rows grew by ``REUSE_GROWTH``, then searches next to
it; the fit itself has no warm start (it is one closed form).
"""

from __future__ import annotations

import time

import numpy as np

from pipeline.training.config import TUNE_KEYS
from pipeline.training.datasets import TEST, TRAIN, VALIDATION
from pipeline.training.trainers import Challenger
from pipeline.training.trainers.altsvm_tuning import REUSE_GROWTH
from pipeline.training.tuning import pattern_search, skipped

# λ per TRAIN's mean item count (the mean of diag XᵀX), in steps of √2 from 1 to 512: on
# MovieLens 100K the validation peaks near 23 (λ ≈ 700 at a mean of 31 users per item);
# sparser catalogues want less
LAMBDAS = [round(2.0 ** (k / 2), 3) for k in range(19)]
LAMBDA_START = 16.0
MAX_LAMBDAS = 6        # λ values scored at most (each is one n³ inverse)


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


def factors(X, B: np.ndarray) -> tuple:
    """``(U, V, None)`` with ``U Vᵀ = X B``: U the 0/1 rows, V = Bᵀ."""
    return (np.asarray(X.toarray(), dtype=np.float32), np.ascontiguousarray(B.T), None)


def too_large(n_users: int, n_items: int, cfg) -> str | None:
    """Why EASE is not fitted on ``n_items`` items (None: it is)."""
    cap = int(cfg.tune.get("ease_max_items", TUNE_KEYS["ease_max_items"]))
    if n_items > cap:
        return (f"EASE skipped: {n_items:,} items is over tune.ease_max_items {cap:,} (its "
                f"item-item weights are {n_items:,}² floats)")
    need = 2 * n_items * n_items * 4 + 3 * n_users * n_items * 4   # P, its copy; users' rows
    free = available_memory()
    if free is not None and need > free // 2:
        return (f"EASE skipped: {n_items:,} items need {need / 2**30:.1f} GiB, over half of "
                f"the {free / 2**30:.1f} GiB of memory available")
    return None


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
    fit, the fit on every met row published; skipped with its reason when too large."""
    started = time.perf_counter()
    n_items = len(arrays["item_ids"])
    reason = too_large(len(arrays["user_ids"]), n_items, cfg)
    if reason is not None:
        return Challenger(name="ease", metrics={}, artifact=None, skipped=reason,
                          tried=[skipped({"n_items": n_items}, reason)])
    metric = cfg.metric
    n_rows = int((arrays["met_part"] != TEST).sum())
    last = float(np.asarray(warm["ridge"])) if warm and "ridge" in warm else None
    tried, validated, warning, value = [], {}, None, None
    X_train = met_matrix(arrays, (TRAIN,))
    if last is not None and n_rows <= REUSE_GROWTH * float(np.asarray(warm["n_rows"])):
        lam, source = last, "last tuning"
    else:
        grid = [round(per * _mean_count(X_train), 1) for per in LAMBDAS]   # λ itself

        def score(params: dict):
            B = ease_weights(X_train, params["lambda"])
            validated[params["lambda"]] = B
            return trainer.topk_metrics(factors(X_train, B), arrays, cfg, VALIDATION).get(metric)

        near = LAMBDA_START * _mean_count(X_train) if last is None else last
        best, tried, warning = pattern_search(
            {"lambda": grid}, {"lambda": min(grid, key=lambda v: abs(np.log(v / near)))}, score,
            higher_is_better=trainer.family.higher_is_better(metric),
            max_settings=MAX_LAMBDAS if last is None else 3,
            budget_seconds=float(cfg.tune.get("budget_seconds", TUNE_KEYS["budget_seconds"])),
            first_step=2 if last is None else 1)
        lam, source, value = best["params"]["lambda"], "tuned", best["validation"]
    X = met_matrix(arrays, (TRAIN, VALIDATION))
    evaluated = factors(X, ease_weights(X, lam))
    metrics = trainer.evaluate(evaluated, arrays, cfg)
    X_all = met_matrix(arrays, (TRAIN, VALIDATION, TEST))
    served = factors(X_all, ease_weights(X_all, lam))
    spec = {"method": "item_item", "input": "met"}    # every met item, as X counts them
    artifact = trainer.factor_artifact(served, arrays, fold_in=spec)
    B_val = validated.get(lam)
    return Challenger(name="ease", metrics=metrics, artifact=artifact,
                      tried=tried + [{"chosen": {"lambda": lam}, "source": source}],
                      fit_seconds=time.perf_counter() - started, warning=warning,
                      warm={"ridge": np.array(lam), "n_rows": np.array(n_rows)},
                      validated=None if B_val is None else factors(X_train, B_val),
                      evaluated=evaluated, served=served, validation=value, fold_in=spec)
