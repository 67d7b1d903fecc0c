"""AltSVM's challenger: implicit's ALS (Hu, Koren & Volinsky's weighted matrix factorization),
trained on the same window, tuned on the same validation split with the same caps as AltSVM's
tuner, scored on the same holdout by the same top-K code, and published as the same
``user_item`` artifact when AltSVM loses to it; and their blend.

What is searched, and why these ranges (a coordinate search from ``ALS_START``):

* ``factors`` 16–256: the bench's optimum on MovieLens 100K is 32–128;
* ``regularization`` 1–1,000 and ``alpha`` (confidence of a met item) 1–100: the bench found a
  ridge of equally good points from (alpha 1, regularization ~12) to (alpha 80, ~200), with
  its top near (10, 50), so the search starts there and can walk the ridge on other data;
* ``input``: the relevant items only (what AltSVM's winners are), or every met item.

ALS runs ``ITERATIONS`` sweeps (flat past 25 on MovieLens 100K); a warm run starts from the
last run's factors (users and items keep their indices: id maps are extended, never
renumbered) and runs ``WARM_ITERATIONS``, reusing the last choice until the data grew 25%.

The blend scores ``w · s_AltSVM / σ_AltSVM + (1 − w) · s_ALS / σ_ALS`` (σ: each model's score
spread), with ``w`` from ``BLEND_WEIGHTS`` chosen on validation; it is published as factors
``[w U₁/σ₁, (1 − w) U₂/σ₂]`` against ``[V₁, V₂]`` with item bias ``w b₁/σ₁``, so lookups stay
one dot product.
"""

from __future__ import annotations

import time

import numpy as np

from pipeline.training.config import TUNE_KEYS
from pipeline.training.datasets import TEST, TRAIN, VALIDATION
from pipeline.training.selection import setting_key
from pipeline.training.trainers import Challenger
from pipeline.training.trainers.altsvm_tuning import REUSE_GROWTH
from pipeline.training.tuning import coordinate_search

ALS_AXES = {"factors": [16, 32, 64, 128, 256],
            "regularization": [1.0, 5.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0],
            "alpha": [1.0, 3.0, 10.0, 30.0, 100.0],
            "input": ["relevant", "met"]}
ALS_START = {"factors": 64, "regularization": 50.0, "alpha": 10.0, "input": "relevant"}
ITERATIONS = 20
WARM_ITERATIONS = 6
BLEND_WEIGHTS = (0.1, 0.25, 0.5, 0.75, 0.9)


def interactions(arrays: dict, relevant: np.ndarray, parts, which: str):
    """CSR (users x items) of the met rows in ``parts``: the relevant ones, or all."""
    from scipy.sparse import csr_matrix

    rows = np.isin(arrays["met_part"], parts) & (relevant if which == "relevant" else True)
    shape = (len(arrays["user_ids"]), len(arrays["item_ids"]))
    X = csr_matrix((np.ones(int(rows.sum()), np.float32),
                    (arrays["met_user"][rows], arrays["met_item"][rows])), shape=shape)
    X.sum_duplicates()
    X.data[:] = 1.0
    return X


def fit_als(X, params: dict, *, iterations: int, seed: int, start=None):
    """Fitted (U, V) float32; ``start`` is (U₀, V₀) to continue from (rows beyond them, new
    users and items, start small and random like implicit's own)."""
    from implicit.cpu.als import AlternatingLeastSquares
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):   # implicit's advice: its own threads, one BLAS thread
        als = AlternatingLeastSquares(factors=int(params["factors"]),
                                      regularization=float(params["regularization"]),
                                      alpha=float(params["alpha"]), iterations=iterations,
                                      random_state=seed)
        if start is not None:
            rng = np.random.default_rng(seed)
            als.user_factors = _grown(start[0], X.shape[0], rng)
            als.item_factors = _grown(start[1], X.shape[1], rng)
        als.fit(X, show_progress=False)
    return np.asarray(als.user_factors, np.float32), np.asarray(als.item_factors, np.float32)


def _grown(old: np.ndarray, n: int, rng) -> np.ndarray:
    out = (rng.random((n, old.shape[1]), dtype=np.float32) * 0.01)
    out[:min(n, len(old))] = old[:n]
    return out


def _spread(factors: tuple, seed: int) -> float:
    """Standard deviation of a model's scores over a sample of (user, item) pairs."""
    U, V, b = factors
    rng = np.random.default_rng(seed)
    u = rng.integers(0, len(U), 4096)
    i = rng.integers(0, len(V), 4096)
    s = np.einsum("ij,ij->i", U[u], V[i]) + (0.0 if b is None else b[i])
    return float(np.std(s)) or 1.0


def blend(first: tuple, second: tuple, weight: float, seed: int = 0) -> tuple:
    """Factors of ``weight · first / σ₁ + (1 − weight) · second / σ₂`` (see the module)."""
    a, b = weight / _spread(first, seed), (1.0 - weight) / _spread(second, seed)
    U = np.hstack([first[0] * a, second[0] * b]).astype(np.float32)
    V = np.hstack([first[1], second[1]]).astype(np.float32)
    bias = None if first[2] is None else (first[2] * a).astype(np.float32)
    if second[2] is not None:
        bias = (second[2] * b if bias is None else bias + second[2] * b).astype(np.float32)
    return U, V, bias


def challenger(trainer, validated, final, published, arrays: dict, cfg,
               warm: dict | None) -> Challenger:
    """Tune, fit and score ALS (see the module); ``validated``, ``final`` and ``published``
    are AltSVM's TRAIN fit (None when the run reused the last tuning), its evaluated fit
    (TRAIN + VALIDATION) and the fit it publishes, as factors. Like AltSVM's, the published
    ALS and blend learned from every met row, the holdout too."""
    started = time.perf_counter()
    seed = int(cfg.evaluation["seed"])
    relevant = trainer._relevant(arrays, cfg)
    caps = {k: cfg.tune.get(k, default) for k, default in TUNE_KEYS.items()}
    metric = cfg.metric
    n_rows = int((arrays["met_part"] != TEST).sum())
    last = _last(warm)
    tried, trained = [], {}
    if last is not None and n_rows <= REUSE_GROWTH * last["n_rows"]:
        choice, source = last["choice"], "last tuning"
    else:
        def score(params: dict):
            X = interactions(arrays, relevant, (TRAIN,), params["input"])
            trained[setting_key(params)] = fit_als(X, params, iterations=ITERATIONS, seed=seed)
            U, V = trained[setting_key(params)]
            return trainer.topk_metrics((U, V, None), arrays, cfg, VALIDATION).get(metric)

        best, tried = coordinate_search(ALS_AXES, last["choice"] if last else ALS_START,
                                        score, higher_is_better=trainer.family
                                        .higher_is_better(metric),
                                        cost=lambda p: p["factors"], **caps)
        choice, source = best["params"], "tuned"
    start = None   # the last factors, when they have the chosen width
    if last is not None and "U" in warm and np.shape(warm["U"])[1] == int(choice["factors"]):
        start = (np.asarray(warm["U"], np.float32), np.asarray(warm["V"], np.float32))
    X = interactions(arrays, relevant, (TRAIN, VALIDATION), choice["input"])
    U, V = fit_als(X, choice, seed=seed, start=start,
                   iterations=WARM_ITERATIONS if start is not None else ITERATIONS)
    metrics = trainer.evaluate((U, V, None), arrays, cfg)
    everything = interactions(arrays, relevant, (TRAIN, VALIDATION, TEST), choice["input"])
    U_all, V_all = fit_als(everything, choice, seed=seed, start=(U, V),
                           iterations=WARM_ITERATIONS)
    artifact = trainer.factor_artifact((U_all, V_all, None), arrays, fold_in={
        "method": "least_squares", "reg": float(choice["regularization"]),
        "alpha": float(choice["alpha"])})
    blended = None
    als_validated = trained.get(setting_key(choice))
    weight = last["blend_weight"] if last is not None else None
    if validated is not None and als_validated is not None:
        weight, blend_tried = _blend_weight(trainer, validated, (*als_validated, None),
                                            arrays, cfg, seed)
        tried += blend_tried
    if weight is not None:
        blended = (trainer.evaluate(blend(final, (U, V, None), weight, seed), arrays, cfg),
                   trainer.factor_artifact(blend(published, (U_all, V_all, None), weight,
                                                 seed), arrays), {"weight": weight})
    state = {"U": U_all, "V": V_all, "n_rows": np.array(n_rows),
             **{f"choice_{k}": np.array(v) for k, v in choice.items()},
             **({"blend_weight": np.array(weight)} if weight is not None else {})}
    return Challenger(name="als", metrics=metrics, artifact=artifact,
                      tried=tried + [{"chosen": choice, "source": source}],
                      fit_seconds=time.perf_counter() - started, warm=state, blend=blended)


def _blend_weight(trainer, first, second, arrays, cfg, seed) -> tuple[float, list]:
    """The weight of the best blend of two TRAIN fits on VALIDATION, and what was tried."""
    metric, tried, best = cfg.metric, [], None
    sign = 1.0 if trainer.family.higher_is_better(metric) else -1.0
    for w in BLEND_WEIGHTS:
        t = time.perf_counter()
        value = trainer.topk_metrics(blend(first, second, w, seed), arrays, cfg,
                                     VALIDATION).get(metric)
        tried.append({"params": {"blend_weight": w}, "validation": value,
                      "seconds": round(time.perf_counter() - t, 3)})
        if value is not None and (best is None or sign * value > sign * best[1]):
            best = (w, value)
    return (best[0] if best else 0.5), tried


def _last(warm: dict | None) -> dict | None:
    if not warm or "n_rows" not in warm:
        return None
    choice = {k[len("choice_"):]: np.asarray(v).item() for k, v in warm.items()
              if k.startswith("choice_")}
    if set(choice) != set(ALS_AXES) or choice["factors"] not in ALS_AXES["factors"]:
        return None
    return {"choice": choice, "n_rows": float(np.asarray(warm["n_rows"])),
            "blend_weight": (float(np.asarray(warm["blend_weight"]))
                             if "blend_weight" in warm else None)}
