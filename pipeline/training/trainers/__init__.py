"""Trainers: one per model family, between the generic retrain loop and the family's solver.

A trainer builds the family's dataset from the event store, fits its estimator (warm-started
from the previous checkpoint), evaluates it on the holdout, and turns the fitted model into
the :class:`~pipeline.serving.artifact.ModelArtifact` that is published and the checkpoint
arrays the next run starts from. Datasets and checkpoints travel as dicts of plain numpy arrays
(``np.savez``-able, no pickle); warm states are keyed by external ids through the persisted id
maps, so they survive growth of the data.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field

import numpy as np

from pipeline.training.idmap import IdMap
from pipeline.training.selection import collected_warnings

WARM_PREFIX = "warm_"
CHALLENGER_PREFIX = "challenger_"


def challenger_names(value) -> tuple[str, ...]:
    """``gate.challenger`` as a tuple of names: ``"none"`` -> (), ``"als"`` -> ("als",),
    ``["als", "ease"]`` as it is."""
    if value in (None, "none"):
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass
class Challenger:
    """The strong, cheap model a user would otherwise pick (``gate.challenger``), trained on
    the model's window, tuned on the same validation data with the same effort, scored on the
    same holdout. The gate publishes it (``served_as = "challenger-NAME"``) when the model
    loses to it.

    Attributes
    ----------
    name : str
        The ``gate.challenger`` value, e.g. ``"als"``.
    metrics : dict
        Holdout metrics under the names the family's ``evaluate`` uses.
    artifact : ModelArtifact
        Publishable, of the family's artifact kind.
    tried : list of dict
        Every setting tried: its parameters, ``validation`` score and ``seconds``.
    fit_seconds : float
        Tuning and the final fit, in all.
    warm : dict
        Plain arrays the next run's challenger starts from (stored in the checkpoint).
    blend : tuple or None
        ``(metrics, artifact, info)`` of a blend of the best two candidates on validation
        (the model and its challengers; scores combined with a weight chosen on validation),
        for ``challenger_mode = "blend"``; ``info["name"]`` names it (``"als"``: the model
        and ALS, ``"als+ease"``: two challengers).
    others : list of Challenger
        The further challengers of a config that names several (``gate.challenger = ["als",
        "ease"]``), each published as ``challenger-NAME`` when it wins.
    skipped : str or None
        Why the challenger was not fitted (too many items for the memory, say): then it has
        no metrics and no artifact, and the gate leaves it out.
    warning : str or None
        What the run summary should say about its tuning (the wall-clock cap ended it).
    validations : dict
        Every candidate's validation metric by name (``"model"``, each challenger's,
        ``"blend"``), set on the first challenger when all were tuned this run: the gate
        compares candidates on validation and holdout together (:mod:`pipeline.training.gate`).
    holdout_errors : dict
        By candidate name (``"model"``, each challenger's): one standard error of its paired
        per-user holdout difference to the best candidate there (on the first challenger).
    validated, evaluated, served, validation, fold_in
        In memory only, for a blend: the factors ``(U, V, b)`` fitted on TRAIN at the chosen
        setting (None when a warm run reused the last choice), on TRAIN + VALIDATION (what
        the holdout scores) and on every row (what is published); the validation score of
        the chosen setting; the published fit's fold-in spec. A family that scores rows
        keeps in ``evaluated`` its prediction for every row (the holdout's among them), for
        the holdout intervals (:meth:`Trainer.per_unit_holdout`).
    """

    name: str
    metrics: dict
    artifact: object
    tried: list = field(default_factory=list)
    fit_seconds: float = 0.0
    warm: dict = field(default_factory=dict)
    blend: tuple | None = None
    others: list = field(default_factory=list)
    skipped: str | None = None
    warning: str | None = None
    validated: tuple | None = field(default=None, repr=False)
    evaluated: tuple | None = field(default=None, repr=False)
    served: tuple | None = field(default=None, repr=False)
    validation: float | None = None
    fold_in: dict = field(default_factory=dict)
    validations: dict = field(default_factory=dict)
    holdout_errors: dict = field(default_factory=dict)


@dataclass
class Fitted:
    """One run's fit, handed from step to step instead of kept on the trainer: the evaluated
    ``model``, what the trainer chose on the way (``learned``: a tuner's choice, a λ path,
    factors fitted for validation), and the model users get (``served``: the model itself,
    or its settings refitted on every event)."""

    model: object
    learned: dict = field(default_factory=dict)
    served: object = None

    def __post_init__(self):
        if self.served is None:
            self.served = self.model


class Trainer(abc.ABC):
    """The interface every family's trainer implements (see the module docstring); the
    abstract methods are what a family must write, the rest has defaults.

    ``id_maps`` names the arrays of a dataset that are id maps: they are stored in the
    checkpoint, so the next run extends them instead of renumbering; ``carried`` names the
    dataset's other arrays the next run's dataset starts from (AltSVM's loser counts).
    """

    id_maps: tuple[str, ...] = ()
    carried: tuple[str, ...] = ()
    derived: tuple[str, ...] = ()
    """Arrays of a dataset made from its other arrays on demand: handed to the fit in memory,
    never written to the dataset bundle (a step in another process makes them again)."""

    def __init__(self, family):
        self.family = family

    @classmethod
    def check_params(cls, params: dict) -> None:
        """Refuse a config's dataset parameters the builder would refuse (``ValueError``
        naming the value), before any window is read; the estimator's are checked apart."""

    @abc.abstractmethod
    def build(self, store, cfg, previous: dict | None) -> tuple[dict, dict]:
        """``(arrays, info)`` of the current window; ``previous``: the last checkpoint's
        arrays (id maps to extend), or None. ``info`` has ``window``, ``stats``, ``n_train``."""

    def fit(self, arrays: dict, cfg, warm: dict | None) -> tuple[Fitted, dict]:
        """The :class:`Fitted` and ``{"fit_seconds", "n_iter", ...}``."""
        model = self.family.estimator_class()(**self.family.estimator_params(cfg.params))
        started = time.perf_counter()
        # the solver's warnings (no convergence, a degenerate fit) go in the report too
        with collected_warnings(reemit=True) as said:
            learned = self.fit_model(model, arrays, warm, cfg) or {}
        return Fitted(model, learned), {"fit_seconds": time.perf_counter() - started,
                                        "n_iter": int(model.n_iter_),
                                        **self.fit_info(model, learned),
                                        **({"warnings": said} if said else {})}

    @abc.abstractmethod
    def fit_model(self, model, arrays: dict, warm: dict | None, cfg) -> dict | None:
        """Fit the estimator ``model`` on the training part of ``arrays`` (warm-started from
        ``warm``, the last run's warm state, when given); returns what else it learned, for
        the later steps (:attr:`Fitted.learned`), or None."""

    def refit(self, fitted: Fitted, arrays: dict, cfg) -> dict:
        """Set ``fitted.served``, the model users get, and return what its fit took: the
        evaluated model itself (the default), or (families that can) its settings refitted on
        every event of the window, the holdout too, so the published model learns from all
        the user's data; the holdout metrics of the evaluated model stand for it."""
        return {}

    def fit_info(self, model, learned: dict) -> dict:
        return {}

    @abc.abstractmethod
    def evaluate(self, model, arrays: dict, cfg) -> dict:
        """Holdout metrics (names from the registry entry); {} when there is no holdout."""

    # where a family that can fit on a Ray cluster does (``HOST:PORT``; None: this process):
    # the model's ``ray_address`` or RANKSTREAM_RAY_ADDRESS, set by the train step
    ray_address: str | None = None

    def holdout_unit(self, arrays: dict, cfg) -> str | None:
        """What the gate metric averages over on the holdout (``"users"``, ``"queries"``,
        ...) when it is a mean of per-unit values :meth:`per_unit_holdout` gives, for
        bootstrap intervals; None when it is not (no interval, and the gate's plain rule)."""
        return None

    def per_unit_holdout(self, candidate, arrays: dict, cfg) -> np.ndarray:
        """The gate metric's per-unit holdout values (their mean is the metric) of
        ``candidate``: the evaluated model, a challenger's ``evaluated`` fit, or a trivial
        model's scores as :meth:`baselines` gives them. Empty when it cannot be scored."""
        return np.zeros(0)

    @abc.abstractmethod
    def baselines(self, arrays: dict, cfg) -> dict:
        """The trivial models the gate compares with: {name: (holdout metrics, one score per
        item)}. Every family has one (popularity, the global ranking, the best single
        feature); a model that does not beat it is not worth publishing."""

    @abc.abstractmethod
    def artifact(self, model, arrays: dict, cfg, **describe):
        """The :class:`~pipeline.serving.artifact.ModelArtifact` to publish (of the kind the
        family's registry entry names)."""

    def challenger(self, fitted: Fitted, arrays: dict, cfg,
                   warm: dict | None) -> Challenger | None:
        """The :class:`Challenger` named by ``cfg.gate["challenger"]`` (never ``"none"`` here:
        the retrain loop asks only when one is configured), fitted on the training part of
        ``arrays``; ``fitted`` is the run's fit (for a blend), ``warm`` the arrays the last
        run's challenger left (or None). A config naming several challengers (a list) gets
        the first, with the others in its ``others``."""
        raise NotImplementedError(f"{self.family.name} has no challenger")

    def trivial_artifact(self, scores, arrays: dict, **describe):
        """A trivial model's item scores as a global list (published by ``gate.if_trivial =
        "publish_trivial"`` when the model does not beat it)."""
        from pipeline.serving.artifact import ModelArtifact

        return ModelArtifact.global_list(item_ids=self.item_ids(arrays), scores=scores,
                                         **describe)

    def item_ids(self, arrays: dict):
        return arrays["item_ids"]

    def checkpoint(self, fitted: Fitted, arrays: dict) -> dict:
        """What the next run starts from: the id maps and the evaluated model's warm state.
        Not the served one's, where that learned the holdout too (:meth:`refit`): the split is
        stable, so a next fit started from it would begin knowing its own holdout rows. On a
        MovieLens subset that lifted a warm AltSVM's holdout NDCG@10 2.4% over a cold fit of
        the same rows (ALS's 3.2%, EASE's, which starts from nothing, 0%), and the gate
        served AltSVM over a blend 5% better on held-out data."""
        # a view, not a copy (AltSVM's 7M duals: 0.28 GB): the checkpoint is written at once,
        # and nothing fits the model again
        kept = [name for name in self.id_maps + self.carried if name in arrays]
        return {**{name: arrays[name] for name in kept},
                **{WARM_PREFIX + k: v for k, v in fitted.model.warm_view().items()}}


def warm_state(checkpoint_arrays: dict, prefix: str = WARM_PREFIX) -> dict:
    """The solver warm state stored in a checkpoint (its ``warm_*`` arrays; the challenger's
    with ``prefix=CHALLENGER_PREFIX``)."""
    n = len(prefix)
    return {k[n:]: v for k, v in checkpoint_arrays.items() if k.startswith(prefix)}


def idmap(arrays: dict | None, name: str) -> IdMap:
    """The id map ``name`` of a checkpoint's arrays (empty when there is none)."""
    return IdMap(arrays[name]) if arrays and name in arrays else IdMap()


def feature_scorer(found: dict | None, arrays: dict):
    """A best-single-feature baseline (``found``: its metrics with ``feature`` and ``sign``) as
    the linear scorer ``sign · x[feature]`` over the rows' columns (``X_shape``), or None: a
    trivial version scores request rows as it ranked the training ones."""
    from pipeline.serving.scorers import Scorer

    if not found or "feature" not in found:
        return None
    w = np.zeros(int(arrays["X_shape"][1]))
    w[int(found["feature"])] = float(found.get("sign", 1))
    return Scorer.linear(w)
