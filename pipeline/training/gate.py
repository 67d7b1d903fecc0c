"""The gate: a pure rule from a run's metrics (and what is served now) to what users get.

In the metric's own direction (``sign`` = +1 when higher is better, −1 when lower is):

1. the candidate is the model; its best challenger (of one or several: ALS, EASE, ...) when
   ``sign·(model − challenger)`` is below ``−challenger_tolerance``; the blend of the pair best
   on validation (``challenger_mode = "blend"``) when it beats the model and every challenger
   (by any amount: the best is served, as for a challenger; the paired standard error of its
   holdout lead is said with it). Candidates are compared on their holdout metric and, when
   every one of them has one, their validation metric too (the mean of the two): the fits on
   TRAIN scored on VALIDATION and those on TRAIN + VALIDATION scored on the holdout are two
   disjoint samples of the users' rows, so together they order close candidates on twice
   the evidence of either (with ~900 users one holdout's standard error is ~0.005 NDCG@10,
   as large as the gaps between ALS, EASE and their blends);
2. the candidate must beat every trivial model by ``trivial_margin``; otherwise
   ``if_trivial = "publish_trivial"`` serves the best trivial list instead, and so does a
   model that has nothing served yet (users are never served nothing). Where the run has a
   bootstrap interval of the candidate's lift over the best trivial model (over the holdout's
   users, queries, positives or events: :mod:`pipeline.training.report_intervals`), a
   shortfall counts only outside the noise: the candidate stays when the interval reaches
   the margin (12 held-out queries on which a single feature led a search model by 0.0096
   NDCG@10 are no evidence that the feature ranks new queries better);
3. and must not be worse than the served version by more than ``tolerance``.

:func:`decide` holds the rule and nothing else (no Redis, no files), so it is tested as a
table of cases; the gate step of the retrain reads its inputs and writes its verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.training.run_types import Choice, Served


@dataclass(frozen=True)
class Rule:
    """A model's ``[gate]`` table."""

    tolerance: float = 0.0
    trivial_margin: float = 0.0
    if_trivial: str = "reject"                 # or "publish_trivial"
    challenger_tolerance: float = 0.0
    challenger_mode: str = "replace"           # or "blend"

    @classmethod
    def of(cls, gate: dict) -> "Rule":
        return cls(float(gate["tolerance"]), float(gate["trivial_margin"]),
                   str(gate["if_trivial"]), float(gate.get("challenger_tolerance", 0.0)),
                   str(gate.get("challenger_mode", "replace")))


@dataclass(frozen=True)
class Scores:
    """One run's holdout metric for each candidate (None: could not be computed).

    One challenger is ``challenger`` and ``challenger_value``; several are ``challengers``
    (name -> value, in the config's order; ``challenger``, when given too, is one of them).
    ``blend_name`` names the blend (``"als"``: the model with ALS, ``"als+ease"``); by default
    the challenger's name."""

    metric: str
    higher_is_better: bool
    model: float | None
    trivial: dict = field(default_factory=dict)      # trivial model name -> value
    challenger: str | None = None                    # its algorithm's name
    challenger_value: float | None = None
    blend_value: float | None = None
    blend_weight: float | None = None
    challengers: dict = field(default_factory=dict)  # name -> value, for several
    blend_name: str | None = None
    # one standard error of the paired per-user difference between the blend and the best
    # single candidate on the holdout, said with the blend's lead
    blend_margin: float = 0.0
    # each candidate's validation metric (its TRAIN fit scored on VALIDATION) by name: "model",
    # a challenger's, "blend"; empty when the run reused its last choices and fitted none
    validation: dict = field(default_factory=dict)
    # by candidate name: one standard error of its paired per-user holdout difference to the
    # holdout's best candidate
    holdout_errors: dict = field(default_factory=dict)
    # by choice ("model", "challenger-als", ...): the bootstrap interval [low, high] of its
    # holdout lift over the trivial model ``lift_over`` (in the metric's direction), over
    # ``units`` ("12 queries")
    trivial_lifts: dict = field(default_factory=dict)
    lift_over: str | None = None
    units: str = ""

    @property
    def sign(self) -> float:
        return 1.0 if self.higher_is_better else -1.0

    @property
    def rivals(self) -> dict:
        """Every challenger's value, by name."""
        out = dict(self.challengers)
        if self.challenger is not None and self.challenger not in out:
            out[self.challenger] = self.challenger_value
        return out

    def evidence(self, values: dict) -> tuple[dict, bool]:
        """``({name: what the candidate is compared by}, pooled)``: the mean of its holdout
        ``values`` and its validation metric when every candidate with a holdout value has
        both, else the holdout value alone (candidates without one are left out)."""
        known = {n: v for n, v in values.items() if v is not None}
        if known and all(self.validation.get(n) is not None for n in known):
            return {n: (v + self.validation[n]) / 2 for n, v in known.items()}, True
        return known, False

    def best_rival(self) -> tuple[str | None, float | None]:
        """The challenger with the best value (the first on a tie; a valueless one only when
        none has a value)."""
        rivals = self.rivals
        known = [(n, v) for n, v in rivals.items() if v is not None]
        if not known:
            return (next(iter(rivals), None), None)
        return max(known, key=lambda nv: self.sign * nv[1])


@dataclass(frozen=True)
class Current:
    """What is served now: ``version``, its ``value`` of the metric (None: nothing, or no
    metric) and what it serves (``served_as``); ``never_served``: the model has no version
    at all."""

    never_served: bool = True
    version: int | None = None
    value: float | None = None
    served_as: str | None = None       # what it serves: "model", "blend-ease", ...


@dataclass(frozen=True)
class Verdict:
    candidate: Choice
    value: float | None               # the candidate's metric
    publishes: Choice | None          # None: what is served stays
    reasons: tuple[str, ...]
    lift_over_trivial: dict
    model_vs_challenger: float | None

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def _fmt(value) -> str:
    return "none" if value is None else f"{value:.4f}"


def _candidate(s: Scores, rule: Rule,
               current: Current) -> tuple[Choice, float | None, list[str]]:
    """Step 1: the model, its challenger or their blend (see the module)."""
    choice, value, notes = Choice(Served.MODEL), s.model, []
    if not s.rivals:
        return choice, value, notes
    blending = rule.challenger_mode == "blend" and s.blend_value is not None
    evidence, pooled = s.evidence({"model": s.model, **s.rivals,
                                   **({"blend": s.blend_value} if blending else {})})
    on = " (validation and holdout together: {} against {})" if pooled else ""
    rivals = {n: v for n, v in evidence.items() if n in s.rivals}
    if rivals:
        name = max(rivals, key=lambda n: s.sign * rivals[n])      # the first on a tie
        mine = evidence.get("model")
        if mine is None or s.sign * (mine - rivals[name]) < -rule.challenger_tolerance:
            choice, value = Choice(Served.CHALLENGER, name), s.rivals[name]
            lost_by = None if mine is None else s.sign * (rivals[name] - mine)
            notes.append(f"the model's {s.metric} {_fmt(s.model)} loses to the challenger "
                         f"{name}'s {value:.4f}{on.format(_fmt(mine), _fmt(rivals[name]))} "
                         f"by {_fmt(lost_by)} (tolerance {rule.challenger_tolerance}): "
                         f"serving {name}")
    singles = [v for n, v in evidence.items() if n != "blend"]
    best = max(singles, key=lambda v: s.sign * v) if singles else None
    by = None if "blend" not in evidence or best is None else s.sign * (evidence["blend"] - best)
    if by is not None and by > 0:
        # the lead's standard error is said, not required: a margin of one standard error
        # kept a blend 5% better on held-out data unserved (a MovieLens subset: ahead by 0.0011
        # on the run's holdout, 0.27 standard errors), where a challenger ahead by as little is
        # served; the blend beat both its parts on validation before it got here
        choice = Choice(Served.BLEND, s.blend_name or s.challenger or next(iter(s.rivals)))
        value = s.blend_value
        notes.append(f"the blend (weight {s.blend_weight}) {s.blend_value:.4f}"
                     f"{on.format(_fmt(evidence['blend']), _fmt(best))} beats "
                     f"{'both' if len(singles) <= 2 else 'every candidate'} by {by:.4f} (one "
                     f"standard error of its holdout lead: {s.blend_margin:.4f}): serving it "
                     f"({choice})")
    return (choice, value, notes) if pooled else _kept(s, current, choice, value, notes,
                                                       evidence)


def _kept(s: Scores, current: Current, choice: Choice, value, notes: list, holdout: dict):
    """Without validation evidence (a warm run that reused its last choices), what is served
    stays unless the holdout's choice leads it by more than one standard error: the holdout
    rows are the same every run (a stable split), so such a run's order of two close
    candidates is the warm starts' noise, and flipping on it would change users' lists for
    nothing (a MovieLens subset: the cold run served a blend 6% better on held-out data, the
    next warm run AltSVM, ahead of it by 0.0015 on the holdout, 0.4 standard errors)."""
    try:
        served = Choice.parse(current.served_as or "")
    except ValueError:          # nothing served, or a trivial list ("trivial"): no candidate
        return choice, value, notes
    name = {Served.MODEL: "model", Served.CHALLENGER: served.name,
            Served.BLEND: "blend" if served.name == s.blend_name else None}.get(served.served)
    mine = {Served.MODEL: "model", Served.CHALLENGER: choice.name,
            Served.BLEND: "blend"}[choice.served]
    if name is None or name == mine or name not in holdout or mine not in holdout:
        return choice, value, notes
    lead, error = s.sign * (holdout[mine] - holdout[name]), s.holdout_errors.get(name, 0.0)
    if lead > error:
        return choice, value, notes
    notes.append(f"{choice} leads what is served ({served}) by {lead:.4f} on the holdout, "
                 f"within one standard error ({error:.4f}), and this run has no validation "
                 f"evidence (it reused its last choices): keeping {served}")
    return served, holdout[name], notes


def _within_noise(s: Scores, rule: Rule, candidate: Choice, best: str | None) -> bool:
    """Whether the candidate's lift interval over the best trivial model (when the run has
    one) reaches the margin: its shortfall could be the draw of held-out users or queries."""
    span = s.trivial_lifts.get(str(candidate))
    return (span is not None and best is not None and s.lift_over == best
            and span[1] >= rule.trivial_margin)


def decide(s: Scores, rule: Rule, current: Current) -> Verdict:
    """What users get, and why (see the module docstring)."""
    candidate, value, notes = _candidate(s, rule, current)
    publishes: Choice | None = candidate
    lift = {name: None if value is None else round(s.sign * (value - v), 5)
            for name, v in s.trivial.items()}
    best = max(s.trivial, key=lambda n: s.sign * s.trivial[n]) if s.trivial else None
    short = value is None or (best is not None
                              and s.sign * (value - s.trivial[best]) < rule.trivial_margin)
    if short and _within_noise(s, rule, candidate, best):
        low, high = s.trivial_lifts[str(candidate)]
        notes.append(f"the trivial {best}'s {s.metric} {s.trivial[best]:.4f} against "
                     f"{value:.4f}: the lift's 95% interval [{low:+.4f}, {high:+.4f}] over "
                     f"{s.units} reaches the margin {rule.trivial_margin}, so the lead is "
                     f"inside the noise and the trivial model does not replace {candidate}")
        short = False
    if short:
        why = (f"no {s.metric} could be computed (empty or one-class holdout)" if value is None
               else f"{s.metric} {value:.4f} does not beat the trivial {best} model "
                    f"({s.trivial[best]:.4f}) by the margin {rule.trivial_margin}")
        if best is not None and (rule.if_trivial == "publish_trivial" or current.never_served):
            publishes = Choice(Served.TRIVIAL, best)
            why += ("; publishing the trivial list instead" if not current.never_served else
                    "; nothing is served yet, so the trivial list is published (marked "
                    "'trivial') rather than nothing")
        else:
            publishes = None
        notes.append(why)
    else:
        ahead = best is not None and s.sign * (value - s.trivial[best]) >= 0
        beats = (f"; beats {best} {s.trivial[best]:.4f}" if ahead else
                 f"; behind {best} {s.trivial[best]:.4f} inside the noise" if best else "")
        if current.value is None:
            notes.append(f"nothing served yet; {s.metric} = {value:.4f}{beats}")
        elif s.sign * (value - current.value) >= -rule.tolerance:
            notes.append(f"{s.metric} {value:.4f} is within tolerance {rule.tolerance} of "
                         f"served v{current.version} {current.value:.4f}{beats}")
        else:
            publishes = None
            notes.append(f"{s.metric} {value:.4f} is worse than served v{current.version} "
                         f"{current.value:.4f} by more than tolerance {rule.tolerance}")
    best_rival = s.best_rival()[1]
    vs = (None if best_rival is None or s.model is None
          else round(s.sign * (s.model - best_rival), 5))
    return Verdict(candidate, value, publishes, tuple(notes), lift, vs)
