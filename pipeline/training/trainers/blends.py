"""Blends of two candidates (the model, ALS, EASE): their factors, fold-in, and the choice of
the pair and weight.

A blend scores ``w · s₁ / σ₁ + (1 − w) · s₂ / σ₂`` (σ: each model's score spread over a sample
of (user, item) pairs, so that ``w`` weighs models of any scale alike). It is published as
factors ``[w U₁/σ₁, (1 − w) U₂/σ₂]`` against ``[V₁, V₂]`` with item bias ``w b₁/σ₁ + (1 − w)
b₂/σ₂``, so lookups stay one dot product; a new user is folded in the same way
(:func:`blend_fold_in`: each model's own fold-in on its columns, scaled).

The pair and ``w`` (of ``BLEND_WEIGHTS``) are those best on validation and holdout together
(:func:`choose`), among the pairs some mix of which beats both its parts on validation. Every
weight of every pair is scored on a split in one pass over the users (:func:`curves`): each
candidate's score rows are computed once per block of users and mixed per weight, instead of
one product per weight and pair with the concatenated factors (on Last.fm, 15k items and an
EASE 1,618 columns wide, 30 such products were 20 s of a 90 s run).
"""

from __future__ import annotations

import os
import time
from itertools import combinations

import numpy as np
import scipy.sparse as sp

from pipeline.training.datasets import TEST, VALIDATION
from pipeline.training.trainers.altsvm_data import tuning_view
from pipeline.training.trainers.factors import pair_scores

BLEND_WEIGHTS = (0.1, 0.25, 0.5, 0.75, 0.9)
# pairs are made of the best this many candidates on validation: 3 pairs, not the 6 of four
# candidates (on a 40k x 39k synthetic set the six pairs' curves were 34 s of a 250 s run; a
# blend of the two weakest would also have to beat the best candidate to serve)
BLEND_CANDIDATES = 3
MAX_BLOCK = 256             # users per block of score rows (fewer when the catalogue is large)
BLOCK_BYTES = 64 << 20      # a worker's score rows: every candidate's (each mix is a row at a time)


def spread(factors: tuple, seed: int, users=None) -> float:
    """Standard deviation of a model's scores over a sample of (user, item) pairs: of any
    user, or of ``users`` (the searched ones, for fits that learned from them alone)."""
    U, V, b = factors
    rng = np.random.default_rng(seed)
    u = (rng.integers(0, U.shape[0], 4096) if users is None
         else np.asarray(users)[rng.integers(0, len(users), 4096)])
    i = rng.integers(0, V.shape[0], 4096)
    s = pair_scores(U, V, None, u, i) + (0.0 if b is None else b[i])
    return float(np.std(s)) or 1.0


def blend_scales(first: tuple, second: tuple, weight: float, seed: int = 0) -> tuple:
    """``(weight / σ₁, (1 − weight) / σ₂)``: what :func:`blend` scales each model by."""
    return weight / spread(first, seed), (1.0 - weight) / spread(second, seed)


def blend(first: tuple, second: tuple, weight: float, seed: int = 0) -> tuple:
    """Factors of ``weight · first / σ₁ + (1 − weight) · second / σ₂`` (see the module)."""
    a, b = blend_scales(first, second, weight, seed)
    if any(sp.issparse(m) for m in (*first[:2], *second[:2])):   # an item-kNN's part
        U = sp.hstack([sp.csr_matrix(first[0]) * a, sp.csr_matrix(second[0]) * b],
                      format="csr", dtype=np.float32)
        V = sp.hstack([sp.csr_matrix(first[1]), sp.csr_matrix(second[1])], format="csr",
                      dtype=np.float32)
    else:
        U = np.hstack([first[0] * a, second[0] * b], dtype=np.float32)
        V = np.hstack([first[1], second[1]], dtype=np.float32)  # 15k x 1.6k on Last.fm: one copy
    bias = None if first[2] is None else (first[2] * a).astype(np.float32)
    if second[2] is not None:
        bias = (second[2] * b if bias is None else bias + second[2] * b).astype(np.float32)
    return U, V, bias


def blend_fold_in(first_spec: dict, second_spec: dict, ranks: tuple, scales: tuple) -> dict:
    """The fold-in spec of a blend (``pipeline.serving.item_queries.BlendFoldIn``): each
    model's own spec on its columns (``ranks``: each model's rank), scaled as :func:`blend`
    scales it; ``{}`` when either model has none."""
    if not first_spec or not second_spec:
        return {}
    r1, r2 = (int(r) for r in ranks)
    return {"method": "blend", "parts": [
        {**first_spec, "columns": [0, r1], "scale": float(scales[0])},
        {**second_spec, "columns": [r1, r1 + r2], "scale": float(scales[1])}]}


def blend_name(pair: tuple) -> str:
    """The blend's name: the challenger blended with the model, or ``"a+b"`` of two."""
    return "+".join(n for n in pair if n != "model")


def choose(trainer, candidates: dict, arrays, cfg) -> tuple[tuple | None, float | None,
                                                              float | None, list]:
    """``(pair, weight, the blend's validation metric, tried)``: of every two of
    ``candidates`` (name -> :class:`~pipeline.training.trainers.Challenger` with TRAIN fits
    ``validated`` scored on VALIDATION as ``validation``, and ``evaluated`` fits; the best
    :data:`BLEND_CANDIDATES` on validation are paired), the pair and weight whose blend is
    best on validation and holdout together (the mean of the two metrics: two disjoint
    samples of the users' rows), among the pairs some weight of which
    beats both parts on validation; ``(None, None, None, tried)`` when no pair does. ``tried``
    has one entry per pair and weight: its ``validation`` and, for such pairs, ``holdout``.

    Why both splits: on Last.fm the validation split alone chose the AltSVM+ALS blend at 0.75
    (0.997x the grid's ALS on held-out data); together, ALS+EASE (1.034x). The blend's holdout
    figure is then the best of the pairs and weights tried there: a small optimism that the
    gate's comparison on both splits halves. Past ``tune.sample_users`` users both splits are
    scored on the searched sample (:func:`~.altsvm_data.tuning_view`): on amazon-beauty every
    pair and weight ranked over 57k items for 47k holdout users was minutes of a run."""
    seed, metric = int(cfg.evaluation["seed"]), cfg.metric
    sign = 1.0 if trainer.family.higher_is_better(metric) else -1.0
    ranked = sorted(candidates, key=lambda n: (candidates[n].validation is None,
                                               -sign * (candidates[n].validation or 0.0)))
    pairs = [("model", next(n for n in p if n != "model")) if "model" in p else p
             for p in combinations(ranked[:BLEND_CANDIDATES], 2)]
    started = time.perf_counter()
    on_validation = curves(trainer, {n: c.validated for n, c in candidates.items()}, pairs,
                           arrays, cfg, VALIDATION, seed)
    each = (time.perf_counter() - started) / max(1, len(on_validation))
    tried, eligible = [], []
    for pair in pairs:
        curve = [{"params": {"blend_weight": w}, "validation": on_validation[pair, w],
                  "seconds": round(each, 3), "pair": blend_name(pair)} for w in BLEND_WEIGHTS]
        tried += curve
        scored = [t["validation"] for t in curve if t["validation"] is not None]
        parts = [candidates[n].validation for n in pair if candidates[n].validation is not None]
        # no mix beats both its parts where weights were chosen: this pair's blend would only
        # be a coin flip on the holdout (seen on MovieLens: ALS+EASE served at 0.97x ALS)
        if scored and all(sign * (max(scored, key=lambda v: sign * v) - p) > 0 for p in parts):
            eligible.append((pair, curve))
    if not eligible:
        return None, None, None, tried
    # on a sample of users, its holdout rows alone: a choice is made on the searched users
    on_holdout = curves(trainer, {n: c.evaluated for n, c in candidates.items()},
                        [pair for pair, _ in eligible], tuning_view(arrays), cfg, TEST, seed)
    best = None       # (validation and holdout together, pair, weight, validation)
    for pair, curve in eligible:
        for t in curve:
            w = t["params"]["blend_weight"]
            t["holdout"] = on_holdout[pair, w]
            both = (t["validation"] if t["holdout"] is None or t["validation"] is None
                    else (t["validation"] + t["holdout"]) / 2)
            if both is not None and (best is None or sign * both > sign * best[0]):
                best = (both, pair, w, t["validation"])
    return best[1], best[2], best[3], tried


def _mixed_topk(first, second, weights, indptr, indices, start, k, idx, top, counts, small):
    """Each weight's top-K of the mix of two blocks of score rows
    (:func:`solvers._topk_kernels.mixed_block_topk`); a tiny run mixes in numpy instead."""
    from solvers import topk as T
    from solvers._topk_kernels import mixed_block_topk

    if not small:
        mixed_block_topk(first, second, weights, indptr, indices, start, k, idx, top, counts)
        return
    for x, w in enumerate(weights):
        mixed = first * w
        mixed += (np.float32(1.0) - w) * second
        T._block_topk_numpy(mixed, indptr, indices, start, k, idx[x], top[x], counts[x])


def curves(trainer, fits: dict, pairs: list, arrays, cfg, part, seed: int,
           weights=BLEND_WEIGHTS) -> dict:
    """``{(pair, weight): cfg.metric on part}`` of the blend of each pair of ``fits`` (name ->
    factors) at each weight: the lists ``trainer.topk_metrics`` would score for
    :func:`blend`'s factors (the same top-K selection and exclusions; the scores are a sum of
    two products instead of one product of the concatenation, equal up to float32 rounding),
    with each candidate's score rows computed once per block of users. Memory is a block's
    score rows per candidate and worker (``BLOCK_BYTES`` at most, whatever the catalogue), and
    a running sum per pair and weight: each block's users are scored and forgotten."""
    from concurrent.futures import ThreadPoolExecutor

    from solvers import topk as T

    keys = [(pair, w) for pair in pairs for w in weights]
    rows = trainer.split_rows(arrays, cfg, part)
    if rows is None:
        return dict.fromkeys(keys)
    users, exclude, positives, k = rows
    indptr = np.ascontiguousarray(exclude.indptr, np.int64)
    indices = np.ascontiguousarray(exclude.indices, np.int32)
    names = sorted({n for pair in pairs for n in pair})
    searched = arrays.get("tuning_users") if part == VALIDATION else None
    scales = {n: 1.0 / spread(fits[n], seed, searched) for n in names}
    n_items = len(arrays["item_ids"])
    k = min(k, n_items)
    block = int(max(1, min(MAX_BLOCK, BLOCK_BYTES // (4 * n_items * len(names)))))
    small = len(users) * n_items <= T.SMALL     # no jitted kernel to load for a tiny run
    mix_weights = np.asarray(weights, np.float32)
    rows_of = {}        # each candidate's factors of the scored users, sparse where it pays
    for n in names:
        U, V, b = (T.as_factors(f) if f is not None else None for f in fits[n])
        U = U[users]
        rows_of[n] = (T.factor_pairs(U, V), None if b is None else np.asarray(b, np.float32))

    def run(start: int) -> list[float]:
        """The block's sum of the metric over its users, per key (every user of
        ``split_rows`` has a positive, so the mean over users is the sum over n_users)."""
        stop = min(start + block, len(users))
        scores = {}
        for n in names:       # in place: (U Vᵀ + b) · scale
            products, b = rows_of[n]
            s = T.pairs_scores(products, slice(start, stop),
                               np.empty((stop - start, n_items), np.float32))
            if b is not None:
                s += b
            s *= np.float32(scales[n])
            scores[n] = s
        idx, top = (np.empty((len(weights), stop - start, k), t)
                    for t in (np.int32, np.float32))
        counts = np.empty((len(weights), stop - start), np.int32)
        sums = []
        for first, second in pairs:
            _mixed_topk(scores[first], scores[second], mix_weights, indptr, indices, start, k,
                        idx, top, counts, small)
            for x in range(len(weights)):
                ranked = np.where(np.arange(k) < counts[x][:, None], idx[x], -1)
                value = trainer.hit_metrics(ranked, positives[start:stop], k).get(cfg.metric)
                sums.append(None if value is None else value * (stop - start))
        return sums

    starts = range(0, len(users), block)
    workers = max(1, min(os.cpu_count() or 1, len(starts)))
    with T._blas_single_thread(), ThreadPoolExecutor(workers, thread_name_prefix="blend") as pool:
        per_block = list(pool.map(run, starts))       # in order: the same sums every run
    return {key: None if any(b[j] is None for b in per_block)
            else sum(b[j] for b in per_block) / len(users) for j, key in enumerate(keys)}
