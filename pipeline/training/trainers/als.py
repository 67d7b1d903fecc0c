"""AltSVM's challengers: implicit's ALS (Hu, Koren & Volinsky's weighted matrix factorization),
EASE (:mod:`.ease`) and item-kNN (:mod:`.item_knn`), each trained on the same window, tuned on
the same validation split, scored on the same holdout by the same top-K code, and published
as the same ``user_item`` artifact when AltSVM loses to it; and the blend of the best pair of
candidates.

What ALS searches, and why these ranges (:func:`pipeline.training.tuning.pattern_search`):

* a cold search first scores ``ALS_DESIGN``, the plain grid a user tunes in ten lines
  (factors 32/64/128 x regularization 0.1–100 x alpha 1/10, a decade apart, on the met
  matrix), then, while ``tune.challenger_settings`` lasts, moves from its best over finer
  axes: ``factors`` 16–256; ``regularization`` 0.01–1,000 and ``alpha`` (confidence of a met
  item) 1–100 in half-decade steps, moved together too (the two trade off along a diagonal
  ridge on whose flank a one-axis search stops); ``input``: every met item or the relevant
  ones only. A warm run moves from the last choice by single steps.
* Why a design first: a compass search from one start settles on the nearest ridge, and with
  24 noisy validation scores it chose settings that scored best on validation and worse on
  held-out data (on MovieLens 100K, 0.92x of the grid's held-out precision). The shipped
  budget, 24 at 100k rows, is the grid itself.
* Why the earlier search landed below a plain grid (0.81–0.92x of it): it started at
  ``input = "relevant"`` (the thinner matrix, flipped last), at regularization 50 with a grid
  floored at 1, moved one axis at a time along a diagonal ridge, and stopped at 20 wall
  seconds or 12 settings, so a loaded machine shrank it silently. The budget is now a count of
  settings per data size (:func:`~pipeline.training.tuning.settings_for_size`) with wall time
  only a cap that warns. Above all, the validation split itself was broken (a band of items
  per user: :func:`pipeline.training.datasets.stable_split`), so every search chose noise.

ALS runs ``ITERATIONS`` sweeps; a warm run starts from the last run's factors (users and
items keep their indices: id maps are extended, never renumbered) and runs
``WARM_ITERATIONS``, reusing the last choice until the data grew 25%.

**Memory.** implicit's ALS runs in this process, on every user (:func:`fit_bytes`: about 40
bytes per met row and 16 per factor of each user and item, the evaluated and the published
fit's). The search keeps to the ``factors`` whose fits need at most half the memory available
(the run summary says where that bound them); where even the fewest do not fit, ALS is skipped
with one line and the gate goes on without it.

The blend of the best pair of candidates, its weight and its factors: :mod:`.blends`.
"""

from __future__ import annotations

import time

import numpy as np

from pipeline.training.datasets import TEST, TRAIN, VALIDATION
from pipeline.training.progress import phase
from pipeline.training.selection import NearBest, setting_key
from pipeline.training.trainers import Challenger, blends, challenger_names, standing
from pipeline.training.tuning import REUSE_GROWTH, caps, pattern_search, skipped

ALS_AXES = {"input": ["met", "relevant"],
            "factors": [16, 32, 64, 128, 256],
            "regularization": [0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0,
                               1000.0],
            "alpha": [1.0, 3.0, 10.0, 30.0, 100.0]}
# a cold search first scores the plain grid a user would try (factors x regularization x
# alpha a decade apart, on the met matrix; middle values first, in case a large data set's
# budget ends it early), then moves from its best while the budget lasts: a compass search from
# one start settles on the nearest ridge (on MovieLens 100K, 0.92x of what the grid finds)
ALS_DESIGN = tuple({"input": "met", "factors": f, "regularization": r, "alpha": a}
                   for f in (64, 32, 128) for r in (10.0, 1.0, 100.0, 0.1) for a in (10.0, 1.0))
ALS_START = ALS_DESIGN[0]
ALS_RIDGES = (("regularization", "alpha"),)
ITERATIONS = 15
WARM_ITERATIONS = 6
# each item-item challenger's warm arrays among the challengers' (ALS's keep no prefix)
PREFIXES = {"ease": "ease_", "knn": "knn_"}


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


def fit_als_on_met(X, params: dict, *, iterations: int, seed: int):
    """:func:`fit_als` of the rows and columns of ``X`` that hold an interaction, scattered
    back into factors of ``X``'s shape (zero elsewhere, as ALS's own solution for a row
    without data): a search on a sample of users (amazon-beauty: 10k of 52k users meet 26k of
    54k items) then pays for what the sample met, not for the whole catalogue. Equal to a fit
    of ``X`` itself when every row and column holds an interaction."""
    rows, cols = np.flatnonzero(X.getnnz(axis=1)), np.flatnonzero(X.getnnz(axis=0))
    if len(rows) == X.shape[0] and len(cols) == X.shape[1]:
        return fit_als(X, params, iterations=iterations, seed=seed)
    U_met, V_met = fit_als(X[rows][:, cols], params, iterations=iterations, seed=seed)
    U = np.zeros((X.shape[0], U_met.shape[1]), np.float32)
    V = np.zeros((X.shape[1], V_met.shape[1]), np.float32)
    U[rows], V[cols] = U_met, V_met
    return U, V


def _grown(old: np.ndarray, n: int, rng) -> np.ndarray:
    out = (rng.random((n, old.shape[1]), dtype=np.float32) * 0.01)
    out[:min(n, len(old))] = old[:n]
    return out


def fit_bytes(n_rows: int, n_users: int, n_items: int, factors: int) -> int:
    """About the bytes the ALS fits of a run hold at once: 40 per met row (the COO the matrix
    is built from, its CSR and implicit's transpose) and 16 per factor of each user and item
    (float32 U and V of the evaluated fit and of the published one).

    >>> round(fit_bytes(10**6, 40_000, 40_000, 64) / 2**30, 3)    # synthetic-1m's size
    0.114
    """
    return 40 * int(n_rows) + 16 * int(factors) * (int(n_users) + int(n_items))


def fitting_factors(arrays: dict, available: int | None) -> tuple[list[int], str | None]:
    """``(the factors on ALS_AXES whose fits take at most half of ``available`` bytes (None:
    unknown, every one), why the others are left out or None)``."""
    grid = ALS_AXES["factors"]
    if available is None:
        return list(grid), None
    sizes = (len(arrays["met_user"]), len(arrays["user_ids"]), len(arrays["item_ids"]))
    fits = [f for f in grid if fit_bytes(*sizes, f) <= available // 2]
    if len(fits) == len(grid):
        return fits, None
    left = min(f for f in grid if f not in fits)
    return fits, (f"{sizes[0]:,} met rows of {sizes[1]:,} users and {sizes[2]:,} items need "
                  f"{fit_bytes(*sizes, left) / 2**30:.1f} GiB for ALS with {left} factors, over "
                  f"half of the {available / 2**30:.1f} GiB of memory available")


def challenger(trainer, validated, final, published, arrays: dict, cfg,
               warm: dict | None, fold_in: dict | None = None) -> Challenger:
    """Every challenger ``gate.challenger`` names (ALS, EASE), tuned, fitted and scored, and
    the blend of the best two candidates on validation; the first challenger is returned,
    the others in its ``others``. ``validated``, ``final`` and ``published`` are AltSVM's
    TRAIN fit (None when the run reused the last tuning), its evaluated fit (TRAIN +
    VALIDATION) and the fit it publishes, as factors; ``fold_in`` the published fit's own
    fold-in spec. Like AltSVM's, every published fit learned from every met row."""
    from pipeline.training.trainers import ease, item_knn

    warm = dict(warm or {})
    own = {k: v for k, v in warm.items()
           if not k.startswith((*PREFIXES.values(), standing.STANDING, "blend_"))}
    n_rows = int((arrays["met_part"] != TEST).sum())
    skip = {} if validated is not None else standing.out_of_reach(
        warm, n_rows, trainer.family.higher_is_better(cfg.metric))
    fits = []
    for name in challenger_names(cfg.gate["challenger"]):
        phase(f"challenger {name}")
        prefix = PREFIXES.get(name, "")
        own_warm = own if name == "als" else {k[len(prefix):]: v for k, v in warm.items()
                                              if prefix and k.startswith(prefix)}
        if name == "knn" and "ease" in skip and standing.STANDING + name not in warm:
            skip[name] = "not fitted in the last comparison, where EASE covered every item"
        if name in skip:
            fits.append(Challenger(name=name, metrics={}, artifact=None, skipped=skip[name],
                                   warm=own_warm))
        elif name == "als":
            fits.append(als_challenger(trainer, arrays, cfg, own))
        elif name in PREFIXES:
            if name == "ease":
                fits.append(ease.challenger(trainer, arrays, cfg, own_warm))
            else:       # skipped where an EASE fitted before it covers every item
                fits.append(item_knn.challenger(trainer, arrays, cfg, own_warm, ease=next(
                    (c for c in fits if c.name == "ease"), None)))
    first, others = fits[0], fits[1:]
    state = dict(first.warm) if first.name == "als" else {}
    for ch in fits:
        if ch.name in PREFIXES:
            state.update({PREFIXES[ch.name] + k: v for k, v in ch.warm.items()})
    model = Challenger(name="model", metrics={}, artifact=None, validated=validated,
                       evaluated=final, served=published, fold_in=fold_in or {})
    validations = {}        # every candidate's validation metric, for the gate
    phase("blends")
    blended, blend_tried, pair, weight = _blend(trainer, model, fits, arrays, cfg, warm,
                                                validations)
    means = {}
    errors = _holdout_errors(trainer, {
        **{c.name: c.evaluated for c in [model, *fits] if c.skipped is None
           and c.evaluated is not None},
        **({"blend": blended[2].pop("evaluated")} if blended else {})}, arrays, cfg, means)
    standing.record(state, warm, means, errors, skip, n_rows)
    if blended:
        blended[2]["margin"] = errors.get("blend", 0.0)
    if pair is not None:
        state.update(blend_pair=np.array(",".join(pair)), blend_weight=np.array(weight))
    first.tried[-1:-1] = blend_tried      # the last entry stays the chosen setting
    first.others, first.blend, first.warm = others, blended, state
    first.validations, first.holdout_errors = validations, errors
    return first


def als_challenger(trainer, arrays: dict, cfg, warm: dict) -> Challenger:
    """Tune (see the module), fit and score ALS; ``warm``: its arrays of the last run."""
    from pipeline.training.trainers.altsvm_data import tuning_view
    from pipeline.training.trainers.ease import available_memory

    started = time.perf_counter()
    factors, bound = fitting_factors(arrays, available_memory())
    if not factors:
        reason = f"ALS skipped: {bound}"
        return Challenger(name="als", metrics={}, artifact=None, skipped=reason,
                          tried=[skipped({"factors": min(ALS_AXES["factors"])}, reason)])
    seed = int(cfg.evaluation["seed"])
    relevant = trainer._relevant(arrays, cfg)
    metric = cfg.metric
    n_rows = int((arrays["met_part"] != TEST).sum())
    last = _last(warm)
    if last is not None and last["choice"]["factors"] not in factors:
        last = None                      # a choice that no longer fits: tune afresh
    axes = {**ALS_AXES, "factors": factors}
    tolerance = float(cfg.tune.get("tolerance", 0.0))
    higher = trainer.family.higher_is_better(metric)
    tried, trained, warning, value = [], NearBest(tolerance, higher), None, None
    if last is not None and n_rows <= REUSE_GROWTH * last["n_rows"]:
        choice, source = last["choice"], "last tuning"
    else:
        view = tuning_view(arrays)     # the searched users' rows (every user's, up to a count)
        view_relevant = trainer._relevant(view, cfg)

        def score(params: dict):
            X = interactions(view, view_relevant, (TRAIN,), params["input"])
            fit = fit_als if view is arrays else fit_als_on_met   # a sample: what it met
            U, V = fit(X, params, iterations=ITERATIONS, seed=seed)
            value = trainer.topk_metrics((U, V, None), view, cfg, VALIDATION).get(metric)
            trained.offer(setting_key(params), value, (U, V))
            return value

        start = last["choice"] if last else {
            **ALS_START, "factors": min(max(factors), ALS_START["factors"])}
        best, tried, warning = pattern_search(
            axes, start, score, higher_is_better=higher, cost=lambda p: p["factors"],
            ridges=ALS_RIDGES, first_step=1 if last else 2, tolerance=tolerance,
            design=() if last else tuple(d for d in ALS_DESIGN if d["factors"] in factors),
            **caps(cfg, n_rows))
        choice, source, value = best["params"], "tuned", best["validation"]
        if bound is not None:     # said with the search's own warning
            warning = "; ".join(filter(None, [warning, f"factors kept to {max(factors)} or "
                                              f"fewer: {bound}"]))
    # the last factors, when they have the chosen width: the evaluated fit continues the last
    # evaluated one, which never saw a holdout row (the split is stable; the last published
    # fit saw them all, and starting from it lifted the holdout metric 3% over a cold fit),
    # the published fit the last published one
    start = {}
    for key, name in (("evaluated", "eval_"), ("published", "")):
        if last is not None and f"{name}U" in warm \
                and np.shape(warm[f"{name}U"])[1] == int(choice["factors"]):
            start[key] = (np.asarray(warm[f"{name}U"], np.float32),
                          np.asarray(warm[f"{name}V"], np.float32))
    X = interactions(arrays, relevant, (TRAIN, VALIDATION), choice["input"])
    U, V = fit_als(X, choice, seed=seed, start=start.get("evaluated"),
                   iterations=WARM_ITERATIONS if "evaluated" in start else ITERATIONS)
    metrics = trainer.evaluate((U, V, None), arrays, cfg)
    everything = interactions(arrays, relevant, (TRAIN, VALIDATION, TEST), choice["input"])
    # what is published is what a user fits on all of it: from the last run's factors when
    # there are some, else a plain fit (continuing the holdout's fit instead scored 0.5% lower)
    U_all, V_all = fit_als(everything, choice, seed=seed, start=start.get("published"),
                           iterations=WARM_ITERATIONS if "published" in start else ITERATIONS)
    # input and min_rating: which of a new user's items count, as this fit counted them
    spec = {"method": "least_squares", "reg": float(choice["regularization"]),
            "alpha": float(choice["alpha"]), "input": choice["input"],
            "min_rating": float(arrays.get("relevance", cfg.evaluation["relevance"]))}
    artifact = trainer.factor_artifact((U_all, V_all, None), arrays, fold_in=spec)
    state = {"U": U_all, "V": V_all, "eval_U": U, "eval_V": V, "n_rows": np.array(n_rows),
             **{f"choice_{k}": np.array(v) for k, v in choice.items()}}
    validated = trained.get(setting_key(choice))
    return Challenger(name="als", metrics=metrics, artifact=artifact,
                      tried=tried + [{"chosen": choice, "source": source}],
                      fit_seconds=time.perf_counter() - started, warm=state, warning=warning,
                      validated=None if validated is None else (*validated, None),
                      evaluated=(U, V, None), served=(U_all, V_all, None), validation=value,
                      fold_in=spec)


def _blend(trainer, model: Challenger, fits: list, arrays, cfg, warm: dict,
           validations: dict):
    """``(blend or None, tried, pair, weight)``: the blend of the pair and weight
    :func:`~.blends.choose` finds (a warm run that reused its choices: the last pair and
    weight), scored on the holdout, and its publishable artifact; ``validations`` gets each
    candidate's validation metric. Every pair, not the best two alone: on MovieLens 100K the
    best two on validation, AltSVM and EASE, blended to 0.2559 P@10 on held-out data, and ALS
    and EASE to 0.2646."""
    seed, metric = int(cfg.evaluation["seed"]), cfg.metric
    by_name = {c.name: c for c in [model, *fits] if c.skipped is None and c.served is not None}
    tried, pair, weight = [], None, None
    scorable = {n: c for n, c in by_name.items() if c.validated is not None}
    if len(scorable) >= 2:
        for c in scorable.values():
            if c.validation is None:
                c.validation = trainer.topk_metrics(c.validated, arrays, cfg,
                                                    VALIDATION).get(metric)
        validations.update({n: c.validation for n, c in scorable.items()})
        pair, weight, value, tried = blends.choose(trainer, scorable, arrays, cfg)
        if pair is None:
            return None, tried, None, None
        validations["blend"] = value
    elif "blend_weight" in warm:
        last = (str(np.asarray(warm["blend_pair"]).item()).split(",")
                if "blend_pair" in warm else ["model", fits[0].name])
        if len(last) == 2 and all(n in by_name for n in last):
            pair, weight = tuple(last), float(np.asarray(warm["blend_weight"]))
    if pair is None:
        return None, tried, None, None
    a, b = by_name[pair[0]], by_name[pair[1]]
    spec = blends.blend_fold_in(a.fold_in, b.fold_in,
                                (a.served[1].shape[1], b.served[1].shape[1]),
                                blends.blend_scales(a.served, b.served, weight, seed))
    evaluated = blends.blend(a.evaluated, b.evaluated, weight, seed)
    blended = (trainer.evaluate(evaluated, arrays, cfg),
               trainer.factor_artifact(blends.blend(a.served, b.served, weight, seed), arrays,
                                       fold_in=spec),
               {"weight": weight, "name": blends.blend_name(pair), "pair": list(pair),
                "evaluated": evaluated})
    return blended, tried, pair, weight


def _holdout_errors(trainer, evaluated: dict, arrays, cfg, means: dict | None = None) -> dict:
    """One standard error of the per-user difference on the holdout between each candidate
    (``evaluated``: name -> its evaluated factors; ``"blend"`` among them) and the best of
    them there (paired: the same users' lists), under its name; for the blend, to the best
    single candidate instead; ``means`` (given) gets each one's holdout metric. The gate
    says the blend's with its lead, and keeps what is served on a run without validation
    evidence unless it trails by more than its own. {} where the metric has no per-user form.
    With ~900 users it is about 0.005 NDCG@10: two candidates closer than that are ordered
    by the holdout's draw."""
    from pipeline.training.per_user_metrics import per_user_holdout, topk_kind

    kind = topk_kind(cfg.metric, cfg.evaluation.get("k"))
    if kind is None or not hasattr(trainer, "topk_lists"):
        return {}
    sign = 1.0 if trainer.family.higher_is_better(cfg.metric) else -1.0
    each = {n: per_user_holdout(trainer, f, arrays, cfg, kind) for n, f in evaluated.items()}
    n_users = max((len(v) for v in each.values()), default=0)
    each = {n: v for n, v in each.items() if len(v) == n_users}
    if n_users < 2 or len(each) < 2:
        return {}

    def error_to_best(name: str, among) -> float:
        best = max(among, key=lambda n: sign * float(each[n].mean()))
        return float(np.std(each[name] - each[best], ddof=1) / np.sqrt(n_users))

    if means is not None:
        means.update({n: float(v.mean()) for n, v in each.items()})
    singles = [n for n in each if n != "blend"]
    return {n: error_to_best(n, singles if n == "blend" else each) for n in each}


def _last(warm: dict | None) -> dict | None:
    if not warm or "n_rows" not in warm:
        return None
    choice = {k[len("choice_"):]: np.asarray(v).item() for k, v in warm.items()
              if k.startswith("choice_")}
    if set(choice) != set(ALS_AXES) or any(choice[k] not in grid
                                           for k, grid in ALS_AXES.items()):
        return None   # another grid's choice (an older release's): tune afresh
    return {"choice": choice, "n_rows": float(np.asarray(warm["n_rows"]))}
