"""What a run serves and why, in words: the two sentences that open both the ``rankstream
train`` summary and the run's report page, and the list of the candidates it scored.

The first sentence says what users get now (the version published and what it serves, or the
version that stays served) with its holdout metric; the second says why: every candidate
scored (the model, each challenger, the blend, the trivial models) with its holdout metric,
the rule of the gate (:mod:`pipeline.training.gate`) that chose, and how the choice compares
with the trivial models and with what was served before. Numbers come from the run's JSON
files (``train.json``, ``gate.json``, ``published.json``), intervals from ``train.json``'s
``holdout_intervals`` (:mod:`pipeline.training.report_intervals`) when the run has them.

Examples
--------
>>> train = {"metrics": {"p@10": 0.1856},
...          "challenger": {"name": "als", "metrics": {"p@10": 0.2101},
...                         "others": [{"name": "ease", "metrics": {"p@10": 0.2050}}],
...                         "blend": {"name": "als+ease", "weight": 0.5,
...                                   "metrics": {"p@10": 0.2213}}},
...          "baselines": {"popularity": {"p@10": 0.2097}}}
>>> gate = {"metric": "p@10", "higher_is_better": True, "publish": True,
...         "publishes": "blend-als+ease", "candidate": "blend-als+ease",
...         "served_before": {"version": None, "value": None},
...         "rule": {"tolerance": 0.0, "trivial_margin": 0.0, "challenger_tolerance": 0.0,
...                  "if_trivial": "reject", "challenger_mode": "blend"}}
>>> what, why = served_sentences(train, gate, {"published": True, "version": 1})
>>> what
'published version 1: users now get the blend of als and ease, holdout p@10 0.2213.'
>>> print(why)    # doctest: +NORMALIZE_WHITESPACE
Scored on the holdout (higher is better): blend als+ease 0.2213, als 0.2101, trivial
popularity 0.2097, ease 0.2050, the model 0.1856; the blend beats every other candidate
(challenger_mode "blend"); its lift over the best trivial model, popularity, is +0.0116;
nothing was served before.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.training.report_data import finite_number, higher_is_better


@dataclass(frozen=True)
class Candidate:
    """One candidate of a run: ``choice`` as the gate names it (``"model"``,
    ``"challenger-als"``, ``"blend-als+ease"``, ``"trivial-popularity"``), its holdout
    ``value`` and ``interval`` (None when unknown), and why it has no value (``skipped``)."""

    choice: str
    value: float | None
    interval: tuple | None = None
    skipped: str | None = None

    @property
    def role(self) -> str:
        return self.choice.partition("-")[0]

    @property
    def name(self) -> str:
        return self.choice.partition("-")[2]

    @property
    def short(self) -> str:
        """How a list names it: ``model``, ``als``, ``blend als+ease``, ``trivial popularity``."""
        if self.role == "blend" and "+" not in self.name:
            return f"blend model+{self.name}"
        return {"model": "the model", "challenger": self.name}.get(
            self.role, f"{self.role} {self.name}")

    @property
    def label(self) -> str:
        """How a sentence names it: ``the blend of als and ease``."""
        if self.role == "blend":
            parts = self.name.split("+")
            pair = " and ".join(parts) if len(parts) == 2 else f"the model and {self.name}"
            return f"the blend of {pair}"
        if self.role == "trivial":
            return f"the trivial {self.name} list"
        return self.short


def _interval(train: dict, choice: str, metric: str) -> tuple | None:
    found = train.get("holdout_intervals") or {}
    entry = (found.get("candidates") or {}).get(choice) if found.get("metric") == metric else None
    return tuple(entry["interval"]) if entry else None


def candidates(train: dict, metric: str) -> list[Candidate]:
    """Every candidate of the run, in the gate's order: the model, each challenger (in the
    config's order; a skipped one with its reason), the blend, the trivial models."""
    def one(choice, metrics, skipped=None):
        return Candidate(choice, finite_number((metrics or {}).get(metric)),
                         _interval(train, choice, metric), skipped)

    out = [one("model", train.get("metrics"))]
    ch = train.get("challenger") or {}
    for c in [ch, *ch.get("others", [])] if ch else []:
        out.append(one(f"challenger-{c.get('name')}", c.get("metrics"), c.get("skipped")))
    blend = ch.get("blend")
    if blend:
        out.append(one(f"blend-{blend.get('name', ch.get('name'))}", blend.get("metrics")))
    for name, metrics in sorted((train.get("baselines") or {}).items()):
        out.append(one(f"trivial-{name}", metrics))
    return out


def number(value, interval=None, *, signed: bool = False) -> str:
    """``0.2213 [0.205, 0.238]`` (``+0.0116 [-0.004, +0.027]`` when ``signed``)."""
    if value is None:
        return "none"
    sign = "+" if signed else ""
    text = f"{value:{sign}.4f}"
    if interval:
        text += f" [{interval[0]:{sign}.3f}, {interval[1]:{sign}.3f}]"
    return text


def ranked(found: list[Candidate], higher: bool) -> list[Candidate]:
    """Candidates with a value, best first; then those without, in their order."""
    known = sorted((c for c in found if c.value is not None),
                   key=lambda c: -c.value if higher else c.value)
    return known + [c for c in found if c.value is None]


def scored_list(found: list[Candidate], higher: bool, *, intervals: bool = False) -> str:
    """``als 0.2101, ease 0.2050, the model 0.1856`` (best first; a skipped one says why)."""
    return ", ".join(f"{c.short} " + (f"not fitted ({c.skipped})" if c.skipped else
                                      number(c.value, c.interval if intervals else None))
                     for c in ranked(found, higher))


def run_metric(train: dict, gate: dict | None, algorithm: str | None) -> str | None:
    """The metric the gate compares (a trial run: the interval's, else the family's)."""
    if gate and gate.get("metric"):
        return gate["metric"]
    if (train.get("holdout_intervals") or {}).get("metric"):
        return train["holdout_intervals"]["metric"]
    try:
        from pipeline.training.registry import family

        metric = family(algorithm).evaluation["metric"]
    except (KeyError, TypeError, ValueError):
        return None
    return metric if metric in (train.get("metrics") or {}) else None


def _lift(train: dict, gate: dict, chosen: Candidate, best: Candidate) -> str:
    found = train.get("holdout_intervals") or {}
    entry = (found.get("lift") or {}).get(chosen.choice)
    if entry and found.get("lift_over") == best.name and found.get("metric") == gate["metric"]:
        return number(entry["value"], entry["interval"], signed=True)
    higher = gate.get("higher_is_better", True)
    return number((chosen.value - best.value) * (1 if higher else -1), signed=True)


def _tol(rule: dict, key: str) -> str:
    return f" {rule[key]:g}" if isinstance(rule.get(key), (int, float)) else ""


def _why_chosen(found: dict, chosen: Candidate, rule: dict, sign: float) -> str | None:
    """Step 1 of the gate in words: why the model, a challenger or the blend."""
    model = found.get("model")
    blends = [c for c in found.values() if c.role == "blend"]
    has_rivals = any(c.role == "challenger" for c in found.values())
    tol = _tol(rule, "challenger_tolerance")
    if chosen.role == "blend":
        return "the blend beats every other candidate (challenger_mode \"blend\")"
    if chosen.role == "challenger":
        if model is None or model.value is None or chosen.value is None:
            return f"{chosen.name} is served: the model has no value to compare"
        return (f"{chosen.name} beats the model by {sign * (chosen.value - model.value):.4f}, "
                f"more than the challenger tolerance{tol}"
                + (", and the blend does not beat it" if blends else ""))
    if chosen.role == "model" and has_rivals:
        return (f"no challenger beats the model by more than the challenger tolerance{tol}"
                + (", nor does the blend beat every candidate" if blends else ""))
    return None


def _why_kept(gate: dict, chosen: Candidate, best: Candidate | None, sign: float) -> str:
    """Steps 2 and 3 of a gate that published nothing."""
    rule, before = gate.get("rule") or {}, gate.get("served_before") or {}
    margin = float(rule.get("trivial_margin", 0.0) or 0.0)
    if best is not None and (chosen.value is None
                             or sign * (chosen.value - best.value) < margin):
        return (f"{chosen.label} ({number(chosen.value)}) does not beat the best trivial "
                f"model, {best.name} ({number(best.value)}), by the margin"
                f"{_tol(rule, 'trivial_margin')}")
    served = (f"the served version {before['version']} ({number(before.get('value'))})"
              if before.get("version") is not None else "the served version")
    return (f"{chosen.label} ({number(chosen.value)}) is worse than {served} by more than the "
            f"tolerance{_tol(rule, 'tolerance')}")


def _why_published(train: dict, gate: dict, chosen: Candidate, served: Candidate,
                   best: Candidate | None, sign: float) -> list[str]:
    """Steps 2 and 3 of a gate that chose to publish."""
    rule, before = gate.get("rule") or {}, gate.get("served_before") or {}
    if served.role == "trivial":
        return [f"{chosen.label} ({number(chosen.value)}) does not beat the trivial "
                f"{served.name} ({number(served.value)}) by the margin"
                f"{_tol(rule, 'trivial_margin')}, so the trivial list is served rather than "
                + ("nothing (nothing was served before)" if before.get("version") is None
                   else "the model (if_trivial = \"publish_trivial\")")]
    parts = []
    if best is not None:
        parts.append(f"its lift over the best trivial model, {best.name}, is "
                     f"{_lift(train, gate, served, best)}")
    if before.get("version") is None:
        parts.append("nothing was served before" if "served_before" in gate else
                     "what was served before is not recorded")
    elif before.get("value") is None or served.value is None:
        parts.append(f"the served version {before['version']} has no {gate['metric']} to "
                     "compare")
    else:
        ahead = sign * (served.value - before["value"]) >= 0
        parts.append(f"it is {'no worse than' if ahead else 'within the tolerance'}"
                     f"{'' if ahead else _tol(rule, 'tolerance') + ' of'} the served version "
                     f"{before['version']} ({number(before['value'])})")
    return parts


# who gets a family's answers, by the shape it serves, for the first sentence
AUDIENCE = {"user_item": "users now get", "query_docs": "queries now get",
            "global_list": "lookups now get", "predicted_ratings": "lookups now get"}


def _audience(algorithm: str | None) -> str:
    from pipeline.training.registry import family

    try:
        return AUDIENCE.get(family(algorithm or "").artifact_kind, "users now get")
    except (KeyError, ValueError):
        return "users now get"


def _what(gate: dict, published: dict | None, served: Candidate | None, metric: str,
          algorithm: str | None = None) -> str:
    """The first sentence: what users (a search model's queries, ...) get now."""
    before = gate.get("served_before") or {}
    holdout = "" if served is None else (f", holdout {metric} "
                                         f"{number(served.value, served.interval)}")
    if published and published.get("published"):
        return (f"published version {published.get('version')}: "
                f"{_audience(algorithm)} {served.label}{holdout}.")
    if gate.get("publish"):
        if published is None:
            return f"not published yet: the gate chose {served.label}{holdout}."
        why = published.get("reason", "the publish failed")
        lost = "fenced: " if published.get("fenced") else ""     # another run holds the model
        return (f"not published ({lost}{why}): what users get did not change; the gate had "
                f"chosen {served.label}{holdout}.")
    if before.get("version") is not None:
        return (f"nothing published: version {before['version']} stays served (holdout {metric} "
                f"{number(before.get('value'))} when it was published).")
    return ("nothing published: the served version stays." if "served_before" not in gate
            else "nothing published: nothing is served for this model yet.")


def _served(gate: dict, found: dict) -> Candidate | None:
    """The candidate the gate publishes (None: none); a gate that publishes without naming
    what (older runs, before challengers) published the model."""
    if not gate.get("publish"):
        return None
    choice = gate.get("publishes") or "model"
    return found.get(choice) or Candidate(choice, None)


def served_sentences(train: dict, gate: dict | None, published: dict | None = None, *,
                     algorithm: str | None = None) -> tuple[str, str]:
    """``(what, why)``: what users get after the run, and why (see the module); ``what``
    starts lower-case (it follows ``model NAME (ALGORITHM): `` in the summary)."""
    if not gate:
        metric = run_metric(train, None, algorithm)
        what = "trained only, not gated or published (a trial run): nothing changed for users."
        if metric is None:
            return what, "The run has no holdout metric to compare."
        higher = higher_is_better(algorithm, metric)
        scored = scored_list(candidates(train, metric), higher, intervals=True)
        return what, (f"Scored on the holdout ({'higher' if higher else 'lower'} is better): "
                      f"{metric} of {scored}.")
    metric = gate["metric"]
    higher = gate.get("higher_is_better", higher_is_better(algorithm, metric))
    sign = 1.0 if higher else -1.0
    found = {c.choice: c for c in candidates(train, metric)}
    pick = gate.get("candidate") or gate.get("publishes") or "model"
    chosen = found.get(pick) or Candidate(pick, finite_number(gate.get("value")))
    served = _served(gate, found)
    trivial = [c for c in found.values() if c.role == "trivial" and c.value is not None]
    best = max(trivial, key=lambda c: sign * c.value) if trivial else None
    parts = [f"Scored on the holdout ({'higher' if higher else 'lower'} is better): "
             f"{scored_list(list(found.values()), higher)}"]
    step1 = _why_chosen(found, chosen, gate.get("rule") or {}, sign)
    parts += [step1] if step1 else []
    if served is None:
        parts.append(_why_kept(gate, chosen, best, sign))
    else:
        parts += _why_published(train, gate, chosen, served, best, sign)
    return _what(gate, published, served, metric, algorithm), "; ".join(parts) + "."


def served_rows(train: dict, gate: dict | None, published: dict | None, metric: str,
                higher: bool) -> list[tuple[str, str]]:
    """The report header's first rows: what users get after the run with its holdout metric
    (and interval), its lift over the best trivial model, then every other candidate."""
    gate, found = gate or {}, candidates(train, metric)
    served = _served(gate, {c.choice: c for c in found})
    if served is None:
        before = gate.get("served_before") or {}
        what = ("nothing new: this run was not gated (a trial run)" if not gate else
                f"version {before['version']} as before, holdout {metric} "
                f"{number(before.get('value'))}" if before.get("version") is not None else
                "nothing new: the served version stays")
        return [("serves", what), (f"scored ({metric})", scored_list(found, higher,
                                                                     intervals=True))]
    rows = [("serves" if (published or {}).get("published") else "chosen, not published",
             f"{served.label}: holdout {metric} {number(served.value, served.interval)}")]
    found_intervals = train.get("holdout_intervals") or {}
    lift = (found_intervals.get("lift") or {}).get(served.choice)
    if lift and found_intervals.get("metric") == metric:
        rows.append((f"lift over {found_intervals['lift_over']}",
                     number(lift["value"], lift["interval"], signed=True)))
    others = [c for c in ranked(found, higher) if c.choice != served.choice]
    rows.append(("others scored", scored_list(others, higher, intervals=True)))
    return rows


def interval_method(train: dict) -> str | None:
    """How the run's intervals were made, in words (None: it has none)."""
    found = train.get("holdout_intervals") or {}
    if not found.get("units"):
        return None
    return (f"{found['level']:.0%} percentile bootstrap over the {found['units']:,} holdout "
            f"{found['unit']} ({found['resamples']:,} resamples, seed {found['seed']})")
