"""NPSVOR's C and loss chosen per data set on a validation part of the training events (a
config's ``tune`` table).

What is searched (the registry's ``tune_axes``; a config may narrow them), and why:

* ``C1`` from 2^-3 to 2^5 (C2 follows it unless the config sets C2). The paper chooses C in
  2^-5..2^5 by 5-fold CV. On the text sets of ``bench/npsvor_text.py`` the CV choice fell in
  2^-1..2^5 (Treebank 2^-1 to 2^0, Pang & Lee 2^1 to 2^5, SST-5 2^3 to 2^5), and at 2^-3
  each of them already underfits by 0.1 MAE or more.
* ``loss``: ``hinge`` (the paper's problem 4) or ``squared_hinge`` (both losses squared, the
  authors' ``-m 2``). Each is the better one on some set, at its own C.

The validation part is a fifth of the training events by a stable hash of the event
(:func:`~pipeline.training.tuning.validation_mask`), so an event stays on its side from run to
run. Each setting is fitted cold on the rest and scored on it by the gate's metric. The search
is :func:`~pipeline.training.tuning.pattern_search` from the config's own setting (its C1 is
added to the grid when it is not on it). Its budget is a count that depends on the data only:
``tune.max_settings`` settings up to 100k training events, fewer past that. Of the settings
within ``tune.tolerance`` of the best, the smallest C is chosen: it is the most regularised,
and it fits in the fewest passes. A single split, not the paper's 5-fold CV, keeps a retrain
at a fifth of the cost; the choice it made matched or beat the shipped C1 = 1 on each set
(``bench/npsvor_text.py``, row "NPSVOR as shipped (tuned)").

The final fit takes every training event at the choice, warm-started from the last run's
duals (clipped into the chosen loss's box). A warm run whose training events grew less than
``REUSE_GROWTH`` since the last tuning keeps its choice and fits once.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from pipeline.training.tuning import REUSE_GROWTH, caps, pattern_search, validation_mask

AXES = ("C1", "loss")


def grids(cfg, model) -> dict:
    """The grids searched: the tune table's, with the model's own value added when absent."""
    out = {}
    for axis in AXES:
        grid, own = list(cfg.tune[axis]), getattr(model, axis)
        if own not in grid:
            grid = sorted([*map(float, grid), float(own)]) if axis == "C1" else [*grid, own]
        out[axis] = grid
    return out


def last_choice(warm: dict | None) -> dict | None:
    """The choice a checkpoint recorded (``tuned_C1``, ``tuned_loss``, ``tuned_n``), if any."""
    if not warm or not all(f"tuned_{k}" in warm for k in (*AXES, "n")):
        return None
    return {"choice": {"C1": float(np.asarray(warm["tuned_C1"])),
                       "loss": str(np.asarray(warm["tuned_loss"]))},
            "n_rows": int(np.asarray(warm["tuned_n"]))}


def tune(model, X, y, ids, cfg, score, higher_is_better: bool, warm: dict | None) -> dict:
    """Choose C1 and loss, set them on ``model`` and return ``{"choice", "source", "tried",
    "validation", "seconds", "n_rows"}``. ``score(fitted, X_val, y_val)`` is the gate's
    metric on the validation rows; ``source`` is ``"tuned"``, ``"last tuning"`` or
    ``"config"`` (the validation part could not choose: ``tried`` says why)."""
    started = time.perf_counter()
    n_rows = len(y)
    last = last_choice(warm)
    if last is not None and n_rows <= REUSE_GROWTH * last["n_rows"]:
        model.set_params(**last["choice"])
        return {"choice": last["choice"], "source": "last tuning", "tried": [],
                "validation": None, "seconds": 0.0, "n_rows": last["n_rows"]}
    val = validation_mask(ids, int(cfg.evaluation["seed"]))
    rest = ~val
    missing = sorted(set(np.unique(y).tolist()) - set(np.unique(y[rest]).tolist()))
    if not val.any() or missing:
        reason = (f"{int(val.sum())} validation events" if not val.any() else
                  f"rank {missing[0]} has no event outside the validation part")
        choice = {a: getattr(model, a) for a in AXES}
        return {"choice": choice, "source": "config", "validation": None, "n_rows": n_rows,
                "tried": [{"params": choice, "validation": None, "seconds": 0.0,
                           "skipped": f"{reason}: no choice to make"}],
                "seconds": time.perf_counter() - started}
    X_rest, y_rest, ids_rest, X_val, y_val = X[rest], y[rest], ids[rest], X[val], y[val]
    axes = grids(cfg, model)

    def setting_score(params: dict):
        fitted = type(model)(**{**model.get_params(), **params})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # the final fit warns as a plain fit does
            fitted.fit(X_rest, y_rest, ids=ids_rest)
        return score(fitted, X_val, y_val)

    start = last["choice"] if last else {a: getattr(model, a) for a in AXES}
    start = {a: start[a] if start[a] in axes[a] else getattr(model, a) for a in AXES}
    best, tried, warning = pattern_search(
        axes, start, setting_score, higher_is_better=higher_is_better,
        cost=lambda p: p["C1"], tolerance=float(cfg.tune["tolerance"]),
        first_step=1 if last else 2, **caps(cfg, n_rows, key="max_settings"))
    if warning:
        warnings.warn(f"NPSVOR's {warning}", RuntimeWarning, stacklevel=2)
    model.set_params(**best["params"])
    return {"choice": dict(best["params"]), "source": "tuned", "tried": tried,
            "validation": best["validation"], "n_rows": n_rows,
            "seconds": time.perf_counter() - started}


def checkpoint_arrays(tuning: dict) -> dict:
    """What the next run needs to reuse (or restart from) this choice; nothing when the
    config's settings were fitted because the validation part could not choose."""
    if tuning.get("source") == "config":
        return {}
    return {"tuned_C1": np.array(float(tuning["choice"]["C1"])),
            "tuned_loss": np.array(str(tuning["choice"]["loss"])),
            "tuned_n": np.array(int(tuning["n_rows"]))}
