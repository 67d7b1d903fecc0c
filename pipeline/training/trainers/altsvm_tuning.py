"""AltSVM's settings chosen per data set on the validation split, within a budget (``tune``).

What is searched, and why these ranges (the registry's ``tune_axes``; a config may narrow them):

* ``reg_ratio`` (λ as a fraction of reg_max, where every factor is 0): first a path down
  ``PATH_RATIOS`` from the config's setting (cheap: each point starts from the last one's
  duals; the first from zero, on a re-tune too: the last run's fit learned this run's
  validation rows, the split being stable, and a path continuing it would score validation on
  rows it was fitted to), then its grid neighbours beside the other axes. The grid spans 0.8
  to 0.01: past 0.8 the model is the global ranking, below 0.01 every data set here overfits.
* ``rank`` 5–100: top-10 quality on MovieLens-scale data rises until 20–50 and is flat by 100,
  while the fit's cost grows linearly with it.
* ``implicit_per_user`` 250–4,000 comparisons (a liked item beats a sampled unmet one) per
  user: quality rises with the sample and flattens by 2,000 on MovieLens 100K; the fit's cost
  is linear in it, so a data set whose curve flattens earlier gets a cheaper model.
* ``loss`` squared hinge (the paper's L2-SVM), hinge or logistic: their ranking of the sampled
  pairs differs most on noisy data.
* ``implicit_sampling`` uniform or by popularity: popularity-sampled losers are harder
  negatives. With at most ``implicit_max_per_positive`` losers per liked item they help
  everywhere measured (the shipped config starts there): amazon-beauty's AltSVM Recall@20
  0.0565 against 0.0210, MovieLens 100K P@10 0.2523 against 0.2421, Last.fm unchanged.

Of the settings within ``tune.tolerance`` (relative, default 0.5%) of the best validation
score, the cheapest (comparisons x rank) is chosen: a difference that small is the validation
split's noise, and the cheaper model retrains faster at every run.

The search is :func:`pipeline.training.tuning.coordinate_search` from the config's own
settings. Its budget is a count that depends on the data only: ``tune.max_settings`` scored
settings up to 100k training rows, fewer past that
(:func:`~pipeline.training.tuning.settings_for_size`; the λ path's points count), so a loaded
machine cannot silently shrink it; ``tune.budget_seconds`` stays a cap on wall time, and when
it ends the search a ``RuntimeWarning`` says so (the run summary's ``warnings``). A warm run
whose comparisons grew less than ``REUSE_GROWTH`` since the last tuning reuses its choice (λ
per comparison, so λ keeps its balance with the loss, a sum over comparisons) in one warm-
started fit; a run past that tunes again, starting from the last choice.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from pipeline.training.datasets import TEST, TRAIN, VALIDATION
from pipeline.training.selection import cheapest_near_best, setting_key
from pipeline.training.trainers import WARM_PREFIX
from pipeline.training.trainers.altsvm_comparisons import training_comparisons
from pipeline.training.tuning import REUSE_GROWTH, coordinate_search, settings_for_size

PATH_RATIOS = np.geomspace(0.8, 0.01, 10)   # cold paths: fractions of reg_max, decreasing
WARM_STEP = 1.6                             # warm paths: the last ratio x and / this
COMPARISON_AXES = ("implicit_per_user", "implicit_sampling")   # change the comparisons
MADE = "made_"     # the dataset's arrays: the comparison axes its comparisons were made with
MODEL_AXES = ("rank", "loss")                                  # change the estimator
# the order of a sweep, which decides what a small budget reaches: the loser sampling and the
# rank first (on amazon-beauty, popularity-sampled losers and rank 64 lift AltSVM's NDCG@10
# from 0.009 to 0.023 at λ 0.1 reg_max), then λ; comparisons per user last: under
# implicit_max_per_positive it binds only for users with more liked items than per_user / cap
SWEEP = ("implicit_sampling", "rank", "reg_ratio", "loss", "implicit_per_user")
REFIT_KNOWN = "refit_"     # the served refit's reg_max, V and b: the next refit's start


def comparisons(arrays: dict, family, params: dict, parts, seed: int) -> np.ndarray:
    """The comparisons of the met rows in ``parts`` under ``params`` (the config's ``params``
    with tuned values), made as the dataset builder makes them."""
    return training_comparisons(arrays, lambda name: family.dataset_param(params, name), parts,
                                seed)


def _axes(cfg, family) -> dict:
    """The grids searched: the tune table's, with the config's own value added where it is
    not on its grid; comparison axes only for implicit comparisons (the tuner rebuilds them)."""
    params = cfg.params
    implicit = family.dataset_param(params, "comparisons") == "implicit"
    axes = {}
    for axis in SWEEP:
        if axis == "reg_ratio" or axis in COMPARISON_AXES and not implicit:
            continue
        grid = list(cfg.tune[axis])
        own = _current(cfg, family, axis)
        if own not in grid:
            grid = sorted(grid + [own]) if isinstance(own, (int, float)) else grid + [own]
        axes[axis] = grid
    return axes


def _current(cfg, family, axis: str):
    if axis in family.dataset_params:
        return family.dataset_param(cfg.params, axis)
    return cfg.params.get(axis, family.estimator_class()().get_params()[axis])


def tune(model, arrays: dict, cfg, family, warm: dict | None, sizes: dict, score) -> dict:
    """Choose the settings on VALIDATION (fits on TRAIN), set them on ``model`` and return
    ``{"choice", "tried", "validated", "reg_ratio", ...}``: ``validated`` is the best TRAIN
    fit's factors (for a blend); ``users``, on a sample, how many users the fits learned from.
    ``arrays`` is the sample the search runs on (:func:`~.altsvm_data.tuning_view`); the
    final fit's comparisons are :func:`final_comparisons` of every user's rows."""
    seed = int(cfg.evaluation["seed"])
    axes = _axes(cfg, family)
    last = _last_choice(warm, axes)
    start = last["choice"] if last else {a: _current(cfg, family, a) for a in axes}
    budget = float(cfg.tune["budget_seconds"])
    n_rows = int((arrays["met_part"] != TEST).sum()) if "met_part" in arrays else 0
    max_settings = settings_for_size(int(cfg.tune["max_settings"]), n_rows)
    began = time.perf_counter()
    cache: dict = {}
    best = {"value": None}
    fits: dict = {}    # setting -> (λ per comparison, ratio) of its fit

    def fit_and_score(params: dict, ratios, path: bool = False):
        estimator = type(model)(**{**model.get_params(), **{a: params[a] for a in MODEL_AXES
                                                            if a in params}})
        c = _comparisons_of(arrays, family, cfg.params, params, (TRAIN,), seed, cache)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # the final fit warns as a plain fit does
            if path:
                estimator.fit_path(c, score=score, ratios=ratios, patience=2,
                                   max_seconds=budget, **sizes)
            else:
                estimator.reg, estimator.reg_ratio = None, float(ratios)
                estimator.fit(c, **sizes)
        value = score(estimator) if not path else max(p["score"] for p in estimator.path_)
        if path:
            for p in estimator.path_:
                fits[setting_key({**params, "reg_ratio": round(float(p["ratio"]), 5)})] = (
                    p["reg"] / len(c), float(p["ratio"]))
        else:
            fits[setting_key({**params, "reg_ratio": round(float(ratios), 5)})] = (
                estimator.reg_ / len(c), estimator.reg_ / estimator.reg_max_)
        if best["value"] is None or value > best["value"]:
            best.update(value=value, model=estimator, params=dict(params),
                        n=len(c), ratio=estimator.reg_ / estimator.reg_max_)
        return estimator, value

    # 1. the λ path at the start setting (from the last choice's ratio on a re-tune), cold:
    # the last fit learned this run's validation rows (a stable split), see the module
    ratios = PATH_RATIOS if last is None else np.array(
        [last["reg_ratio"] * WARM_STEP, last["reg_ratio"], last["reg_ratio"] / WARM_STEP])
    ratios = ratios[:max_settings]   # the path's points count
    path_model, _ = fit_and_score(start, ratios, path=True)
    tried = [{"params": {**start, "reg_ratio": round(float(p["ratio"]), 5)},
              "validation": p["score"], "seconds": round(p.get("seconds", 0.0), 3)}
             for p in path_model.path_]
    ratio0 = float(path_model.reg_ / path_model.reg_max_)
    ratio_grid = sorted({*np.round(PATH_RATIOS, 5).tolist(), round(ratio0, 5)}, reverse=True)
    # 2. one axis at a time around it, λ included, within what the path left of the budget
    first = {**start, "reg_ratio": round(ratio0, 5)}

    def setting_score(params: dict):
        if params == first:
            return best["value"] if best["params"] == start else None
        return fit_and_score(params, params["reg_ratio"])[1]

    left = max(budget - (time.perf_counter() - began), 0.0)
    grids = {**axes, "reg_ratio": ratio_grid}
    _, searched = coordinate_search({a: grids[a] for a in SWEEP if a in grids}, first,
                                    setting_score,
                                    max_settings=max(max_settings - len(tried) + 1, 1),
                                    budget_seconds=left)
    tried += searched[1:]
    _warn_if_clock(time.perf_counter() - began, budget, len(tried), max_settings)
    chosen = cheapest_near_best(tried, float(cfg.tune["tolerance"]), cost)
    for axis in MODEL_AXES:
        if axis in chosen["params"]:
            setattr(model, axis, chosen["params"][axis])
    choice = {a: chosen["params"][a] for a in axes}
    reg_per_comparison, ratio = fits[setting_key(chosen["params"])]
    return {"choice": choice, "tried": tried, "validated": best["model"],
            "validation": chosen["validation"], "reg_ratio": ratio,
            "reg_per_comparison": reg_per_comparison, **_searched_users(arrays),
            "seconds": time.perf_counter() - began, "source": "tuned"}


def confirm_rank(model, arrays: dict, cfg, family, tuning: dict, sizes: dict, score):
    """Where the search ran on a sample of users (:func:`by_ratio`), the chosen setting and the
    same at the next larger rank of the grid fitted on every user's TRAIN rows and scored on
    VALIDATION; the cheapest within ``tune.tolerance`` of the better is kept (``model``'s rank
    and ``tuning``'s choice, ``validated`` and ``confirmed`` say which). A sample's fits learn
    each item from a fraction of its rows, so they undervalue capacity: on amazon-beauty's
    10,000 of 52,000 users rank 20 and 50 scored within noise (NDCG@10 0.0092 and 0.0090) where
    rank 50 served 1.29x rank 20's Recall@20 on test. Returns the kept fit's warm state (the
    final fit continues it), or None where nothing was checked (the final fit starts afresh:
    the choice may have changed the rank)."""
    chosen = tuning["choice"].get("rank")
    larger = [r for r in _axes(cfg, family).get("rank", ()) if chosen is not None and r > chosen]
    if not by_ratio(arrays) or not larger:
        return None
    c = _comparisons_of(arrays, family, cfg.params, tuning["choice"], (TRAIN,),
                        int(cfg.evaluation["seed"]), {})
    tried = []
    for rank in (chosen, min(larger)):
        began = time.perf_counter()
        fit = type(model)(**{**model.get_params(), "rank": rank, "reg": None,
                             "reg_ratio": float(tuning["reg_ratio"])})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # the final fit warns as a plain fit does
            fit.fit(c, **sizes)
        tried.append({"params": {**tuning["choice"], "rank": rank}, "validation": score(fit),
                      "seconds": round(time.perf_counter() - began, 3), "fit": fit})
    kept = cheapest_near_best(tried, float(cfg.tune["tolerance"]), cost)
    model.rank = tuning["choice"]["rank"] = kept["params"]["rank"]
    tuning["validated"] = kept["fit"]
    tuning["confirmed"] = [{k: v for k, v in t.items() if k != "fit"} for t in tried]
    return kept["fit"].warm_view()   # read by the final fit before the kept fit is let go


def final_comparisons(arrays: dict, cfg, family, choice: dict) -> np.ndarray:
    """The comparisons of every user's TRAIN + VALIDATION rows under ``choice``: what the
    evaluated fit learns from."""
    return _comparisons_of(arrays, family, cfg.params, choice, (TRAIN, VALIDATION),
                           int(cfg.evaluation["seed"]), {})


def by_ratio(arrays: dict) -> bool:
    """Whether the fits of a tuned choice take λ as its ratio to reg_max (else as λ per
    comparison): where the search ran on a sample of users. A ratio carries over between
    comparison sets, a λ found on a sample does not; nor does λ per comparison grow as reg_max
    does. On synthetic-1m reg_max stayed at 148-150 from the sample's comparisons to the
    6.8M of training and the 8.3M of every row, so the tuned ratio 0.8 became 0.98 at the
    refit (the factors nearly gone) and past reg_max at the next warm refit."""
    return "tuning_users" in arrays


def refit(model, everything: np.ndarray, tuning: dict, arrays: dict, known: dict):
    """A fit of ``model``'s settings on ``everything`` (the comparisons of every met row of
    ``arrays``), warm-started from ``model`` and ``known`` (:func:`last_refit_known`: the last
    run's refit's reg_max, singular vector, V and b: :func:`with_last_refit`): at the tuned
    ratio to reg_max (:func:`by_ratio`; reg_max's secant starts at the last refit's: on
    synthetic-1m its σ_max took 1.7 s from the evaluated fit's singular vector, 1.2 s from
    the last refit's), else at λ per comparison kept (``tuning``'s). Where that λ is past
    reg_max (reg_max grows slower than the comparisons), it keeps the tuned ratio instead, and
    what the first fit said is not said of the one served.

    Returns the refit and what the next run's refit starts from (:func:`refit_known`)."""
    params = model.get_params()
    start = with_last_refit(model.warm_view(), known)
    sizes = {"n_users": len(arrays["user_ids"]), "n_items": len(arrays["item_ids"])}
    refitted = None
    if not by_ratio(arrays):
        refitted = type(model)(**{**params, "reg": tuning["reg_per_comparison"] * len(everything)})
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            refitted.fit(everything, warm_start=start, **sizes)
        if refitted.past_reg_max_:
            refitted = None   # its layout and duals go before the next fit makes its own
        else:
            for w in said:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if refitted is None:
        refitted = type(model)(**{**params, "reg": None, "reg_ratio": float(tuning["reg_ratio"])})
        refitted.fit(everything, warm_start=start, **sizes)
    return refitted, refit_known(refitted)


def with_last_refit(start: dict, known: dict) -> dict:
    """The evaluated fit's warm state ``start`` with what the last refit left (``known``):
    its reg_max and singular vector, and its V and b where they have ``start``'s rank. U is
    rebuilt from the evaluated fit's duals with that V, which knows the holdout's items too:
    on amazon-beauty (a fifth of the refit's comparisons held out) the refit then starts at
    1.05x its final objective, not 1.31x, and takes 5-6 iterations, not 9. The held-out
    comparisons' duals of the last refit on top changed nothing measured (6 iterations on
    amazon-beauty, 3 on synthetic-1m) and cost 0.5 GB of peak at 7M comparisons."""
    same_rank = "V" in known and np.shape(known["V"])[1:] == np.shape(start["V"])[1:]
    return {**start, **{k: v for k, v in known.items() if same_rank or k not in ("V", "b")}}


def refit_known(refitted) -> dict:
    """What :func:`refit` starts from next run: the refit's reg_max, singular vector, V and b
    (8 bytes x (rank + 1) per item)."""
    state = refitted.warm_view()
    return {**refitted.known_reg_max(), "V": state["V"], "b": state["b"]}


def last_refit_known(warm: dict | None) -> dict:
    """The last run's refit's reg_max, singular vector, V and b (:func:`refit`'s ``known``)
    from its warm state; {} without one."""
    names = ("known_reg_max", "sigma_vector", "V", "b")
    return {k: warm[REFIT_KNOWN + k] for k in names
            if warm is not None and REFIT_KNOWN + k in warm}


def _searched_users(arrays: dict) -> dict:
    """``{"users": n}``, the users a search on a sample fitted ({} when it fitted all)."""
    if "tuning_users" not in arrays:
        return {}
    return {"users": int(np.unique(arrays["met_user"][arrays["met_part"] == TRAIN]).size)}


def _warn_if_clock(seconds: float, budget: float, n_tried: int, max_settings: int) -> None:
    """A ``RuntimeWarning`` (the run summary's ``warnings``) when the wall-clock cap, not the
    count, ended the search."""
    if seconds >= budget and n_tried < max_settings:
        warnings.warn(f"AltSVM's tuning stopped by the wall-clock cap (tune.budget_seconds "
                      f"{budget:g}) after {n_tried} of {max_settings} settings: the machine "
                      "was slower than the count assumes, so this choice depends on its load",
                      RuntimeWarning, stacklevel=3)


def cost(params: dict) -> float:
    """A fit's cost grows with its comparisons times its rank (+1: the bias)."""
    return params.get("implicit_per_user", 1) * (params["rank"] + 1)


def reuse(model, arrays: dict, cfg, family, warm: dict | None) -> dict | None:
    """The last tuning's choice, when a warm run's comparisons grew less than REUSE_GROWTH
    since it (None otherwise): set on ``model``, with the final fit's comparisons."""
    axes = _axes(cfg, family)
    last = _last_choice(warm, axes)
    if last is None:
        return None
    final = _comparisons_of(arrays, family, cfg.params, last["choice"], (TRAIN, VALIDATION),
                            int(cfg.evaluation["seed"]), {})
    if len(final) > REUSE_GROWTH * last["path_n"]:
        return None
    for axis in MODEL_AXES:
        if axis in last["choice"]:
            setattr(model, axis, last["choice"][axis])
    return {**last, "comparisons": final, "tried": [], "source": "last tuning"}


def dataset_axes(cfg, family, previous: dict | None) -> dict:
    """The comparison axes the dataset step makes its comparisons with: the last tuning's
    choice where ``previous`` (the last checkpoint's arrays) has one for these axes, which a
    warm run reuses while the data grows little (its fit's comparisons are then made once,
    not twice: 1.8 s of a 27 s warm retrain on synthetic-1m), else the config's."""
    own = {a: family.dataset_param(cfg.params, a) for a in COMPARISON_AXES}
    n = len(WARM_PREFIX)        # the tuning's scalars only, not the warm duals
    warm = {k[n:]: previous[k] for k in (previous or {}) if k.startswith(WARM_PREFIX) and (
        k[n:].startswith("tuned_") or k[n:] in ("path_n", "reg_ratio", "reg_per_comparison"))}
    tuned = cfg.tune and "reg" not in cfg.params and "reg_ratio" not in cfg.params
    last = _last_choice(warm, _axes(cfg, family)) if tuned else None   # as _fit_model tunes
    return {**own, **{a: v for a, v in (last or {"choice": {}})["choice"].items() if a in own}}


def made_with(arrays: dict, family, params: dict) -> dict:
    """The comparison axes of the dataset's comparisons (:func:`dataset_axes`, recorded in
    its ``made_<axis>`` arrays), the config's where they are not recorded."""
    return {a: np.asarray(arrays[MADE + a]).item() if MADE + a in arrays
            else family.dataset_param(params, a) for a in COMPARISON_AXES}


def param_of(made: dict, family, params: dict):
    """``param(name)``: the dataset parameter ``name`` of the config's ``params``, the
    comparison axes ``made``'s (:func:`dataset_axes`, :func:`made_with`)."""
    return lambda name: made.get(name, family.dataset_param(params, name))


def _comparisons_of(arrays, family, params, choice, parts, seed, cache) -> np.ndarray:
    """Comparisons under ``choice`` (the config's where it tunes no comparison axis): the
    dataset's own TRAIN + VALIDATION ones, made once, when the choice is theirs."""
    made = made_with(arrays, family, params)
    own = all(choice[a] == made[a] for a in COMPARISON_AXES if a in choice)
    if own and tuple(parts) == (TRAIN, VALIDATION) and "comparisons" in arrays:
        return arrays["comparisons"]
    key = (tuple(choice.get(a) for a in COMPARISON_AXES), tuple(parts))
    if key not in cache:
        cache[key] = comparisons(arrays, family, {**params, **{
            a: choice[a] for a in COMPARISON_AXES if a in choice}}, parts, seed)
    return cache[key]


def _last_choice(warm: dict | None, axes: dict) -> dict | None:
    """The choice a checkpoint recorded (``tuned_<axis>`` arrays), if it covers ``axes``."""
    if warm is None or not all(f"tuned_{a}" in warm for a in axes) or "path_n" not in warm:
        return None
    choice = {a: np.asarray(warm[f"tuned_{a}"]).item() for a in axes}
    return {"choice": choice, "path_n": float(np.asarray(warm["path_n"])),
            "reg_ratio": float(np.asarray(warm["reg_ratio"])),
            "reg_per_comparison": float(np.asarray(warm["reg_per_comparison"]))}


def checkpoint_arrays(tuning: dict, refit_next: dict) -> dict:
    """What the next run needs to reuse (or restart from) this choice, and what its refit
    starts from (``refit_next``: :func:`refit_known`, {} where the evaluated fit is served)."""
    out = {f"tuned_{a}": np.array(v) for a, v in tuning["choice"].items()}
    for k in ("path_n", "reg_ratio", "reg_per_comparison"):
        out[k] = np.array(float(tuning[k]))
    return {**out, **{REFIT_KNOWN + k: v for k, v in refit_next.items()}}
