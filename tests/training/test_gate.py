"""The gate's rule as a table: scores in, what users get out (no Redis, no files)."""

from __future__ import annotations

import pytest

from pipeline.training.gate import Current, Rule, Scores, decide
from pipeline.training.run_types import Choice, Decision, Served

POP = {"popularity": 0.10}
SERVED_V3 = Current(never_served=False, version=3, value=0.30)
NEVER = Current()
ROLLED_OFF = Current(never_served=False)          # versions exist, none is current
SERVED_BLEND = Current(never_served=False, version=3, value=0.23, served_as="blend-als")

# (case, scores, rule, current, what is published, words the reason holds)
CASES = [
    ("model beats trivial, nothing served",
     Scores("p@10", True, 0.25, POP), Rule(), NEVER, "model", "nothing served yet"),
    ("model within tolerance of the served version",
     Scores("p@10", True, 0.295, POP), Rule(tolerance=0.01), SERVED_V3, "model",
     "within tolerance 0.01 of served v3"),
    ("model worse than served by more than tolerance: keep what is served",
     Scores("p@10", True, 0.28, POP), Rule(tolerance=0.01), SERVED_V3, None,
     "worse than served v3"),
    ("trivial wins, nothing ever served: the trivial list, never nothing",
     Scores("p@10", True, 0.09, POP), Rule(), NEVER, "trivial-popularity",
     "nothing is served yet"),
    ("trivial wins, something served, reject",
     Scores("p@10", True, 0.09, POP), Rule(), SERVED_V3, None, "does not beat the trivial"),
    ("trivial wins, something served, publish_trivial",
     Scores("p@10", True, 0.09, POP), Rule(if_trivial="publish_trivial"), SERVED_V3,
     "trivial-popularity", "publishing the trivial list instead"),
    ("the margin is part of beating the trivial model",
     Scores("p@10", True, 0.105, POP), Rule(trivial_margin=0.01), ROLLED_OFF, None,
     "by the margin 0.01"),
    ("no metric at all and nothing served: the best trivial list",
     Scores("p@10", True, None, POP), Rule(), NEVER, "trivial-popularity", "no p@10"),
    ("no metric and no trivial model: nothing to publish",
     Scores("p@10", True, None, {}), Rule(), NEVER, None, "no p@10 could be computed"),
    ("challenger wins beyond its tolerance",
     Scores("p@10", True, 0.20, POP, "als", 0.26), Rule(challenger_tolerance=0.01), NEVER,
     "challenger-als", "loses to the challenger als"),
    ("challenger wins within its tolerance: the model stays",
     Scores("p@10", True, 0.255, POP, "als", 0.26), Rule(challenger_tolerance=0.01), NEVER,
     "model", "nothing served yet"),
    ("the blend beats both",
     Scores("p@10", True, 0.20, POP, "als", 0.26, blend_value=0.27, blend_weight=0.4),
     Rule(challenger_mode="blend"), NEVER, "blend-als", "the blend (weight 0.4)"),
    ("a better blend is not served in replace mode",
     Scores("p@10", True, 0.20, POP, "als", 0.26, blend_value=0.27),
     Rule(), NEVER, "challenger-als", "serving als"),
    ("a blend ahead by less than one standard error is served, its error said",
     Scores("p@10", True, 0.20, POP, "als", 0.26, blend_value=0.265, blend_weight=0.4,
            blend_margin=0.008),
     Rule(challenger_mode="blend"), NEVER, "blend-als",
     "by 0.0050 (one standard error of its holdout lead: 0.0080)"),
    ("a blend ahead by more than one standard error is served",
     Scores("p@10", True, 0.20, POP, "als", 0.26, blend_value=0.27, blend_weight=0.4,
            blend_margin=0.008),
     Rule(challenger_mode="blend"), NEVER, "blend-als", "the blend (weight 0.4)"),
    ("a blend that only ties the best is not served",
     Scores("p@10", True, 0.26, POP, "als", 0.20, blend_value=0.26),
     Rule(challenger_mode="blend"), NEVER, "model", "nothing served yet"),
    ("several challengers: the best one is served",
     Scores("p@10", True, 0.20, POP, challengers={"als": 0.24, "ease": 0.26}), Rule(), NEVER,
     "challenger-ease", "loses to the challenger ease"),
    ("several challengers, one not scored: the scored one",
     Scores("p@10", True, 0.20, POP, challengers={"als": 0.24, "ease": None}), Rule(), NEVER,
     "challenger-als", "serving als"),
    ("several challengers, the model beats them all",
     Scores("p@10", True, 0.30, POP, challengers={"als": 0.24, "ease": 0.26}),
     Rule(challenger_mode="blend"), NEVER, "model", "nothing served yet"),
    ("a blend of two challengers that beats every candidate",
     Scores("p@10", True, 0.20, POP, challengers={"als": 0.24, "ease": 0.26},
            blend_value=0.27, blend_weight=0.5, blend_name="als+ease"),
     Rule(challenger_mode="blend"), NEVER, "blend-als+ease", "beats every candidate"),
    ("a blend that beats the model and ALS but not EASE is not served",
     Scores("p@10", True, 0.20, POP, challengers={"als": 0.24, "ease": 0.28},
            blend_value=0.27, blend_name="als"),
     Rule(challenger_mode="blend"), NEVER, "challenger-ease", "serving ease"),
    ("several challengers within the tolerance: the model stays",
     Scores("p@10", True, 0.25, POP, challengers={"als": 0.24, "ease": 0.255}),
     Rule(challenger_tolerance=0.01), NEVER, "model", "nothing served yet"),
    ("validation and holdout together: a blend behind on the holdout alone is served",
     Scores("p@10", True, 0.2615, POP, challengers={"als": 0.25, "ease": 0.255},
            blend_value=0.26, blend_weight=0.5, blend_name="ease",
            validation={"model": 0.24, "als": 0.245, "ease": 0.25, "blend": 0.26}),
     Rule(challenger_mode="blend"), NEVER, "blend-ease",
     "(validation and holdout together: 0.2600 against 0.2525) beats every candidate by 0.0075"),
    ("validation and holdout together: a challenger behind on the holdout alone wins",
     Scores("p@10", True, 0.262, POP, challengers={"als": 0.26},
            validation={"model": 0.24, "als": 0.25}),
     Rule(), NEVER, "challenger-als",
     "(validation and holdout together: 0.2510 against 0.2550) by 0.0040"),
    ("one candidate without a validation metric: the holdout alone decides",
     Scores("p@10", True, 0.262, POP, challengers={"als": 0.26},
            validation={"als": 0.25}),
     Rule(), NEVER, "model", "nothing served yet"),
    ("no validation evidence: what is served stays against a lead within its error",
     Scores("p@10", True, 0.234, POP, challengers={"als": 0.216}, blend_value=0.2325,
            blend_weight=0.5, blend_name="als", holdout_errors={"blend": 0.004}),
     Rule(challenger_mode="blend"), SERVED_BLEND, "blend-als",
     "model leads what is served (blend-als) by 0.0015 on the holdout, within one standard "
     "error (0.0040)"),
    ("no validation evidence: a lead beyond the error of what is served wins",
     Scores("p@10", True, 0.30, POP, challengers={"als": 0.216}, blend_value=0.2325,
            blend_weight=0.5, blend_name="als", holdout_errors={"blend": 0.004}),
     Rule(challenger_mode="blend"), SERVED_BLEND, "model", "within tolerance"),
    ("validation evidence: the incumbent gets no say",
     Scores("p@10", True, 0.234, POP, challengers={"als": 0.216}, blend_value=0.2325,
            blend_weight=0.5, blend_name="als", holdout_errors={"blend": 0.004},
            validation={"model": 0.25, "als": 0.22, "blend": 0.248}),
     Rule(challenger_mode="blend"), SERVED_BLEND, "model", "within tolerance"),
    ("a served blend of another pair is not what this run's blend is",
     Scores("p@10", True, 0.234, POP, challengers={"als": 0.216}, blend_value=0.2325,
            blend_weight=0.5, blend_name="ease", holdout_errors={"blend": 0.004}),
     Rule(challenger_mode="blend"), SERVED_BLEND, "model", "within tolerance"),
    ("a trivial list served: the holdout's choice",
     Scores("p@10", True, 0.234, POP, challengers={"als": 0.216}),
     Rule(), Current(never_served=False, version=3, served_as="trivial"), "model",
     "nothing served yet"),
    ("lower is better: a smaller error wins",
     Scores("mae", False, 0.70, {"mean": 0.90}, "linear", 0.60), Rule(), NEVER,
     "challenger-linear", "loses to the challenger linear"),
    ("lower is better: the trivial model's smaller error beats the model",
     Scores("mae", False, 0.95, {"mean": 0.90}), Rule(), SERVED_V3, None,
     "does not beat the trivial mean"),
    ("a trivial lead inside the noise: the model stays, and the reason says why",
     Scores("ndcg@10", True, 0.44, {"best_feature": 0.4496},
            trivial_lifts={"model": [-0.05, 0.03]}, lift_over="best_feature",
            units="12 queries"),
     Rule(), NEVER, "model", "[-0.0500, +0.0300] over 12 queries reaches the margin 0.0"),
    ("a model kept inside the noise is not said to beat the trivial model",
     Scores("ndcg@10", True, 0.44, {"best_feature": 0.4496},
            trivial_lifts={"model": [-0.05, 0.03]}, lift_over="best_feature",
            units="12 queries"),
     Rule(), NEVER, "model", "ndcg@10 = 0.4400; behind best_feature 0.4496 inside the noise"),
    ("a trivial lead outside the noise replaces the model",
     Scores("ndcg@10", True, 0.40, {"best_feature": 0.45},
            trivial_lifts={"model": [-0.08, -0.02]}, lift_over="best_feature",
            units="200 queries"),
     Rule(), NEVER, "trivial-best_feature", "does not beat the trivial best_feature"),
    ("an interval short of the margin is outside the noise",
     Scores("p@10", True, 0.105, POP, trivial_lifts={"model": [-0.01, 0.008]},
            lift_over="popularity", units="900 users"),
     Rule(trivial_margin=0.01), ROLLED_OFF, None, "by the margin 0.01"),
    ("the noise rule reads the chosen candidate's interval",
     Scores("p@10", True, 0.05, POP, "als", 0.09,
            trivial_lifts={"model": [-0.07, -0.03], "challenger-als": [-0.04, 0.02]},
            lift_over="popularity", units="900 users"),
     Rule(), NEVER, "challenger-als", "does not replace challenger-als"),
    ("an interval over another trivial model than the best is not used",
     Scores("p@10", True, 0.09, {"popularity": 0.10, "global": 0.08},
            trivial_lifts={"model": [-0.01, 0.03]}, lift_over="global", units="900 users"),
     Rule(), SERVED_V3, None, "does not beat the trivial popularity"),
]


@pytest.mark.parametrize("case, scores, rule, current, publishes, words", CASES,
                         ids=[c[0] for c in CASES])
def test_the_gate_rule(case, scores, rule, current, publishes, words):
    verdict = decide(scores, rule, current)
    assert (None if verdict.publishes is None else str(verdict.publishes)) == publishes
    assert words in verdict.reason, verdict.reason


def test_lift_and_margin_are_in_the_metric_direction():
    verdict = decide(Scores("mae", False, 0.70, {"mean": 0.90, "median": 0.80}, "lin", 0.75),
                     Rule(), NEVER)
    assert verdict.lift_over_trivial == {"mean": pytest.approx(0.2), "median": pytest.approx(0.1)}
    assert verdict.model_vs_challenger == pytest.approx(0.05)


def test_the_margin_is_to_the_best_of_several_challengers():
    verdict = decide(Scores("p@10", True, 0.20, POP, challengers={"als": 0.24, "ease": 0.26}),
                     Rule(), NEVER)
    assert verdict.model_vs_challenger == pytest.approx(-0.06)
    assert str(verdict.publishes) == "challenger-ease"


@pytest.mark.parametrize("text, served, name, directory", [
    ("model", Served.MODEL, None, "artifact"),
    ("challenger-ease", Served.CHALLENGER, "ease", "challenger-ease"),
    ("blend-als+ease", Served.BLEND, "als+ease", "blend-als+ease"),
    ("challenger-als", Served.CHALLENGER, "als", "challenger-als"),
    ("blend-als", Served.BLEND, "als", "blend-als"),
    ("trivial-best-feature", Served.TRIVIAL, "best-feature", "trivial-best-feature"),
])
def test_a_choice_round_trips_through_its_text(text, served, name, directory):
    choice = Choice.parse(text)
    assert (choice.served, choice.name, choice.dir_name, str(choice)) == (
        served, name, directory, text)


@pytest.mark.parametrize("text", ["nonsense", "challenger", "model-als"])
def test_a_choice_that_names_nothing_is_refused(text):
    with pytest.raises(ValueError):
        Choice.parse(text)


@pytest.mark.parametrize("published, decision", [
    ({"published": True}, Decision.PUBLISHED),
    ({"published": False, "fenced": True}, Decision.FENCED),
    ({"published": False}, Decision.REJECTED),
])
def test_a_publish_summary_maps_to_one_decision(published, decision):
    assert Decision.of_publish(published) is decision
