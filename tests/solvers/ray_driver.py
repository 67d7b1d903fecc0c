"""A Ray driver in a process of its own (``ray.init`` stays out of the pytest process):

    python tests/solvers/ray_driver.py ADDRESS WORKERS IN.npz OUT.npz

fits AltSVM on the Ray cluster at ADDRESS with WORKERS workers: cold on IN's ``first``
comparisons, then warm on its ``second`` (``params``: the estimator's as JSON), and writes
each fit's :func:`fit_arrays` to OUT (``cold_*``, ``warm_*``)."""

from __future__ import annotations

import json
import sys

import numpy as np


def fit_arrays(model) -> dict:
    """What "the same bits" covers: factors, duals, objective and iteration count."""
    return {"U": model.user_factors_, "V": model.item_factors_, "b": model.item_bias_,
            "alpha": model._alpha, "beta": model._beta, "objective": model.objective_,
            "n_iter": np.array(model.n_iter_), "comparisons": model._comparisons}


def fits(first, second, params: dict, **engine):
    """The cold fit on ``first`` and the warm fit on ``second``."""
    from solvers import AltSVM

    cold = AltSVM(**params, **engine).fit(first)
    warm = AltSVM(**params, **engine).fit(second, warm_start=cold.warm_state())
    return cold, warm


def main(address: str, workers: str, src: str, out: str) -> None:
    data = np.load(src)
    cold, warm = fits(data["first"], data["second"], json.loads(str(data["params"])),
                      ray_address=address, ray_workers=int(workers))
    np.savez(out, **{f"cold_{k}": v for k, v in fit_arrays(cold).items()},
             **{f"warm_{k}": v for k, v in fit_arrays(warm).items()},
             retried=np.array(len(cold.ray_retried_) + len(warm.ray_retried_)))


if __name__ == "__main__":
    main(*sys.argv[1:])
