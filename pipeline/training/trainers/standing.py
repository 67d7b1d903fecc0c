"""Which challengers a warm run refits: those that can still be served.

A run that fits every candidate records each one's standing on the holdout: its metric and one
standard error of its paired per-user difference to the best candidate there
(``als._holdout_errors``). A warm run that reused the model's tuning, whose met rows grew at
most ``REUSE_GROWTH`` since that comparison (the rule that keeps a tuning's choice), refits
only the challengers that can still be served: every one that trailed the best by at most
``STANDING_ERRORS`` of its standard errors, and the last blend's members while the blend did.
The others keep their last warm state and are skipped with the reason (the gate leaves a
skipped challenger out); once the rows grow past that, a run fits them all again. On
synthetic-1m (40k users) ALS and the item-kNN trailed the served blend by 0.001-0.004
NDCG@10, 7-13 standard errors, and took 8 s of a 38 s warm retrain; on amazon-beauty ALS and
its blend with the model trailed the served item-kNN.
"""

from __future__ import annotations

import numpy as np

from pipeline.training.tuning import REUSE_GROWTH

STANDING = "standing_"      # warm state: standing_NAME = [holdout metric, standard error]
ROWS = STANDING + "rows"    # the met rows (train + validation) when every one was compared
STANDING_ERRORS = 3.0


def out_of_reach(warm: dict, n_rows: int, higher: bool) -> dict:
    """``{challenger name: why this warm run skips it}`` (see the module); {} where the last
    comparison is older than ``REUSE_GROWTH`` or absent."""
    if not warm or ROWS not in warm or n_rows > REUSE_GROWTH * float(np.asarray(warm[ROWS])):
        return {}
    last = {k[len(STANDING):]: np.asarray(v, np.float64).ravel() for k, v in warm.items()
            if k.startswith(STANDING) and k != ROWS}
    if not last:
        return {}
    sign = 1.0 if higher else -1.0
    best = max(last, key=lambda n: sign * last[n][0])

    def behind(name: str) -> bool:
        value, error = last[name]
        return sign * (last[best][0] - value) > STANDING_ERRORS * error

    pair = (str(np.asarray(warm["blend_pair"]).item()).split(",")    # the blend's members,
            if "blend_pair" in warm and not ("blend" in last and behind("blend")) else [])
    out = {}
    for name, (value, error) in last.items():
        lead = sign * (last[best][0] - value)
        if name in ("model", "blend", *pair) or not behind(name):
            continue
        errors = f" ({lead / error:.0f} standard errors)" if error > 0 else ""
        out[name] = (f"not refitted in this warm run: it trailed {best} by {lead:.4g} on the "
                     f"last comparison's holdout{errors}; every challenger is refitted once the "
                     f"rows pass {REUSE_GROWTH:g}x that comparison's "
                     f"{float(np.asarray(warm[ROWS])):,.0f}")
    return out


def record(state: dict, warm: dict, means: dict, errors: dict, skipped, n_rows: int) -> None:
    """Each candidate's standing into ``state`` (the next run's warm arrays): this run's for
    the candidates it scored, the last one's for those it skipped; the rows of the comparison:
    this run's where it skipped none."""
    for name, value in means.items():
        if name in errors:
            state[STANDING + name] = np.array([value, errors[name]])
    for name in skipped:
        if STANDING + name in warm:
            state[STANDING + name] = np.asarray(warm[STANDING + name])
    if skipped and ROWS in warm:
        state[ROWS] = np.asarray(warm[ROWS])
    elif means:
        state[ROWS] = np.array(float(n_rows))
