"""Trainers: one per model family, between the generic retrain loop and the family's solver.

A trainer builds the family's dataset from the event store, fits its estimator (warm-started
from the previous checkpoint), evaluates it on the holdout, and turns the fitted model into
the :class:`~pipeline.serving.artifact.ModelArtifact` that is published and the checkpoint
arrays the next run starts from. Datasets and checkpoints travel as dicts of plain numpy arrays
(``np.savez``-able, no pickle); warm states are keyed by external ids through the persisted id
maps, so they survive growth of the data.
"""

from __future__ import annotations

import time
import warnings

from pipeline.training.idmap import IdMap

WARM_PREFIX = "warm_"


class Trainer:
    """The interface every family's trainer implements (see the module docstring).

    ``id_maps`` names the arrays of a dataset that are id maps: they are stored in the
    checkpoint, so the next run extends them instead of renumbering.
    """

    id_maps: tuple[str, ...] = ()

    def __init__(self, family):
        self.family = family

    def build(self, store, cfg, previous: dict | None) -> tuple[dict, dict]:
        """``(arrays, info)`` of the current window; ``previous``: the last checkpoint's
        arrays (id maps to extend), or None. ``info`` has ``window``, ``stats``, ``n_train``."""
        raise NotImplementedError

    def fit(self, arrays: dict, cfg, warm: dict | None):
        """The fitted estimator and ``{"fit_seconds", "n_iter", ...}``."""
        model = self.family.estimator_class()(**self.family.estimator_params(cfg.params))
        started = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.fit_model(model, arrays, warm, cfg)
        said = []   # the solver's warnings (no convergence, a degenerate fit) go in the report
        for w in caught:
            line = f"{w.category.__name__}: {w.message}"
            if line not in said:
                said.append(line)
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return model, {"fit_seconds": time.perf_counter() - started,
                       "n_iter": int(model.n_iter_), **self.fit_info(model),
                       **({"warnings": said} if said else {})}

    def fit_model(self, model, arrays: dict, warm: dict | None, cfg) -> None:
        raise NotImplementedError

    def fit_info(self, model) -> dict:
        return {}

    def evaluate(self, model, arrays: dict, cfg) -> dict:
        """Holdout metrics (names from the registry entry); {} when there is no holdout."""
        raise NotImplementedError

    def baselines(self, arrays: dict, cfg) -> dict:
        """The trivial models the gate compares with: {name: (holdout metrics, one score per
        item)}. Every family has one (popularity, the global ranking, the best single
        feature); a model that does not beat it is not worth publishing."""
        raise NotImplementedError

    def artifact(self, model, arrays: dict, cfg, **describe):
        """The :class:`~pipeline.serving.artifact.ModelArtifact` to publish."""
        raise NotImplementedError

    def trivial_artifact(self, scores, arrays: dict, **describe):
        """A trivial model's item scores as a global list (published by ``gate.if_trivial =
        "publish_trivial"`` when the model does not beat it)."""
        from pipeline.serving.artifact import ModelArtifact

        return ModelArtifact.global_list(item_ids=self.item_ids(arrays), scores=scores,
                                         **describe)

    def item_ids(self, arrays: dict):
        return arrays["item_ids"]

    def checkpoint(self, model, arrays: dict) -> dict:
        """What the next run starts from: the id maps and the estimator's warm state."""
        return {**{name: arrays[name] for name in self.id_maps},
                **{WARM_PREFIX + k: v for k, v in model.warm_state().items()}}


def warm_state(checkpoint_arrays: dict) -> dict:
    """The solver warm state stored in a checkpoint (its ``warm_*`` arrays)."""
    n = len(WARM_PREFIX)
    return {k[n:]: v for k, v in checkpoint_arrays.items() if k.startswith(WARM_PREFIX)}


def idmap(arrays: dict | None, name: str) -> IdMap:
    """The id map ``name`` of a checkpoint's arrays (empty when there is none)."""
    return IdMap(arrays[name]) if arrays and name in arrays else IdMap()
