"""What a run's searches tried, for the report's validation curves: each search as a
:class:`Curve` (its settings and validation scores, the chosen one marked), and each searched
hyper-parameter as a :class:`ParameterPlot`: the validation metric over the values tried of
that parameter, on a log axis when the values span a decade or more, the chosen value marked.

Searches: the model's λ path (validation score per λ / λ_max), the model's tuner, and each
challenger's tuner (ALS, EASE, ...) and the blend's weight. A multi-parameter search (the
tuner, ALS's pattern search) gives one plot per parameter it varied; points at the same value
of one parameter differ in the others, and the line through such a plot joins the best score
at each value (the profile), so the plot shows how much the parameter matters at its best.

Examples
--------
>>> curve = Curve("challenger ease: tuner", [{"lambda": 1.0}, {"lambda": 10.0},
...               {"lambda": 100.0}], [0.30, 0.32, 0.31], chosen=1)
>>> (plot,) = parameter_plots(curve)
>>> plot.param, plot.xs, plot.scale, plot.xs[plot.chosen]
('lambda', [1.0, 10.0, 100.0], 'log', 10.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pipeline.training.report_data import Run, finite_number

# How a plot's axis names a parameter; any other is named as the config names it.
PARAM_LABELS = {"reg_ratio": "λ / λ_max", "lambda": "λ (EASE's ridge)",
                "blend_weight": "blend weight w (of the first model)",
                "regularization": "regularization λ", "alpha": "alpha (confidence)"}


@dataclass
class Curve:
    """Validation scores of the settings one search tried, in the order tried."""

    title: str
    settings: list           # dict of params per point
    values: list             # float per point (unscored settings are left out)
    chosen: int | None       # index of the chosen point
    skipped: list = field(default_factory=list)   # reasons of settings never scored
    table: bool = True       # whether the report lists the settings (a path's are its axis)


@dataclass
class ParameterPlot:
    """The validation metric over the values of one parameter a search tried."""

    title: str               # the search's title and the parameter
    param: str
    xs: list                 # the parameter's value at each point
    values: list
    chosen: int | None       # index of the chosen point
    scale: str               # "log", "linear" or "category"
    others_vary: bool        # other parameters varied too (the line is the profile)

    @property
    def xlabel(self) -> str:
        label = PARAM_LABELS.get(self.param, self.param)
        return label + (" (log scale)" if self.scale == "log" else "")


def _numeric(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _scale(param: str, xs: list) -> str:
    if not all(_numeric(x) for x in xs):
        return "category"
    if param != "blend_weight" and min(xs) > 0 and max(xs) >= 10 * min(xs):
        return "log"
    return "linear"


def parameter_plots(curve: Curve) -> list[ParameterPlot]:
    """One plot per parameter the search varied (one, of its first parameter, when it varied
    none), in the order the parameters first appear."""
    params = list(dict.fromkeys(k for p in curve.settings for k in p))
    varying = [k for k in params
               if len({repr(p.get(k)) for p in curve.settings}) > 1]
    plots = []
    for param in varying or params[:1]:
        xs = [p.get(param) for p in curve.settings]
        scale = _scale(param, xs)
        if scale != "category":
            xs = [float(x) for x in xs]
        title = curve.title if len(params) == 1 else f"{curve.title} · {param}"
        plots.append(ParameterPlot(title, param, xs, list(curve.values),
                                   curve.chosen, scale, len(varying) > 1))
    return plots


def profile(plot: ParameterPlot, higher: bool) -> tuple[list, list]:
    """``(values of x, best score at each)``, in the order of x (categories: as first tried)."""
    best: dict = {}
    for x, v in zip(plot.xs, plot.values):
        key = repr(x) if plot.scale == "category" else x
        if key not in best or (v > best[key][1] if higher else v < best[key][1]):
            best[key] = (x, v)
    points = list(best.values())
    if plot.scale != "category":
        points.sort(key=lambda xv: xv[0])
    return [x for x, _ in points], [v for _, v in points]


# ------------------------------------------------------------------- the run's searches

def _scored(tried: list) -> tuple[list, list, list]:
    """(params, values, skip reasons) of ``tried`` entries; a setting without a score (not
    fitted, or its metric undefined) cannot be plotted, and is counted with its reason."""
    params, values, skipped = [], [], []
    for t in tried:
        value = finite_number(t.get("validation"))
        if value is None:
            skipped.append(t.get("skipped") or "no validation score")
        else:
            params.append(t.get("params", {}))
            values.append(value)
    return params, values, skipped


def _best(values: list, higher: bool) -> int | None:
    best = None
    for i, v in enumerate(values):
        if best is None or (v > values[best] if higher else v < values[best]):
            best = i
    return best


def _path_curve(train: dict) -> Curve | None:
    """The λ path: validation score per ratio of reg_max; the chosen ratio is the run's."""
    path = [p for p in train.get("path") or [] if finite_number(p.get("score")) is not None]
    if not path:
        return None
    ratios = [float(p["ratio"]) for p in path]
    chosen_ratio = finite_number(train.get("reg_ratio"))
    chosen = None if chosen_ratio is None or chosen_ratio <= 0 else min(
        range(len(ratios)), key=lambda i: abs(math.log(ratios[i] / chosen_ratio)))
    return Curve("model: λ path", [{"reg_ratio": r} for r in ratios],
                 [float(p["score"]) for p in path], chosen, table=False)


def _tuner_curve(tuning: dict) -> Curve | None:
    """The model's tuner: the chosen point is the tried setting of the choice (its reg_ratio
    the nearest to the chosen ratio: the tuner records it rounded)."""
    params, values, skipped = _scored(tuning.get("tried") or [])
    if not params:
        return None
    choice, ratio = tuning.get("choice") or {}, finite_number(tuning.get("reg_ratio"))
    matching = [i for i, p in enumerate(params) if all(p.get(k) == v for k, v in choice.items())]
    if ratio is not None and ratio > 0:
        matching.sort(key=lambda i: abs(math.log(max(params[i].get("reg_ratio", ratio), 1e-12)
                                                 / ratio)))
    return Curve("model: tuner", params, values, matching[0] if matching else None,
                 skipped=skipped)


def _challenger_curves(ch: dict, higher: bool, blend: dict | None) -> list[Curve]:
    """One curve per kind of setting a challenger's search tried (its settings; for the
    first challenger, the blend's weight too); the chosen one is the recorded choice, else
    the best score (the rule the grid search chooses by)."""
    groups: dict = {}
    chosen_params = None
    for t in ch.get("tried") or []:
        if "chosen" in t:
            chosen_params = t["chosen"]
            continue
        # a blend's weights, one curve per pair tried ("pair": its name)
        groups.setdefault((tuple(sorted(t.get("params", {}))), t.get("pair")), []).append(t)
    served_pair = "+".join((blend or {}).get("pair") or ["model", str(ch.get("name"))])
    curves = []
    for (keys, name), tried in groups.items():
        params, values, skipped = _scored(tried)
        if not params:
            continue
        if keys == ("blend_weight",):
            pair = served_pair if name is None else name if "+" in name else f"model+{name}"
            title = f"blend {pair}: weight"
            weight = (blend or {}).get("weight") if name in (None, _short(served_pair)) else None
            pick = [i for i, p in enumerate(params) if p["blend_weight"] == weight]
        else:
            title = f"challenger {ch.get('name')}: tuner"
            pick = [i for i, p in enumerate(params) if p == chosen_params]
        chosen = pick[0] if pick else _best(values, higher)
        curves.append(Curve(title, params, values, chosen, skipped=skipped))
    return curves


def _short(pair: str) -> str:
    """A pair's name as its blend is named: the model left out (``model+ease`` is ``ease``)."""
    return "+".join(n for n in pair.split("+") if n != "model")


def validation_curves(run: Run, higher: bool) -> tuple[list[Curve], list[str]]:
    """Every search the run made, and a note for each it did not make and why."""
    tr, curves, notes = run.train, [], []
    path = _path_curve(tr)
    tuning = tr.get("tuning") if isinstance(tr.get("tuning"), dict) else None
    if path is not None:
        curves.append(path)
    elif tr.get("reg_source") == "last path":
        notes.append("λ was kept from the last run's path (the data grew little): no path "
                     "this run")
    elif tuning is None:
        notes.append("the model was fitted with its config's settings (no λ path, no tuner)")
    if tuning is not None:
        curve = _tuner_curve(tuning)
        if curve is not None:
            curves.append(curve)
        else:
            notes.append(f"the model's settings came from the {tuning.get('source', 'last')} "
                         f"choice ({tuning.get('choice')}): nothing was tried this run")
    first = tr.get("challenger")
    for ch in [first, *first.get("others", [])] if first is not None else []:
        found = _challenger_curves(ch, higher, first.get("blend"))
        curves += found
        if not found and not ch.get("skipped"):
            notes.append(f"the challenger {ch.get('name')} tried no setting this run (it "
                         "reused its last tuning, or has nothing to tune)")
        elif ch.get("skipped"):
            notes.append(f"the challenger {ch.get('name')} was not fitted: {ch['skipped']}")
    return curves, notes
