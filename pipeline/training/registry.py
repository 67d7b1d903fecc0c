"""The algorithm registry: everything the pipeline knows about a model family, in one entry.

A family is its problem and kernels (``solvers/``), one trainer (``pipeline/training/trainers/``)
and one :class:`Family` entry below. Nothing else in the pipeline names an algorithm: model
configs are validated against the entry (parameters, event kinds, metrics, splits), the retrain
loop calls the entry's trainer, the gate reads the direction of the entry's metrics, and the
publisher takes the artifact the trainer made.

Examples
--------
>>> family("altsvm").kinds
('rating', 'interaction', 'comparison')
>>> family("altsvm").metric_names({"k": 5})[:3]
('topk_ndcg@5', 'topk_precision@5', 'topk_recall@5')
>>> family("toppush").higher_is_better("average_precision")
True
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cached_property

# the estimator parameters that say where a fit runs, not what it fits: not config params
ENGINE_PARAMS = ("ray_address", "ray_workers")


@dataclass(frozen=True)
class Family:
    """One model family as the pipeline sees it.

    Attributes
    ----------
    name : str
        The config's ``algorithm`` value.
    estimator : str
        Class name in :data:`solvers.ESTIMATORS`, or ``module:Class`` of an estimator on
        :class:`solvers._base.Estimator` that lives elsewhere; its constructor's parameters
        are what a config's ``params`` table may set (plus ``dataset_params``).
    trainer : str
        ``module:Class`` of its :class:`pipeline.training.trainers.Trainer`.
    kinds : tuple of str
        Event kinds it trains on; the first is the default.
    dataset_params : dict
        ``params`` keys read by the dataset builder rather than the estimator, with their
        defaults.
    metrics : dict
        Metric name (``{k}`` stands for ``evaluation.k``) -> +1 if higher is better, -1 if
        lower is.
    evaluation : dict
        Defaults of the ``[evaluation]`` table; its keys are the ones a config may set.
    splits : tuple of str
        Holdout splits it implements (``evaluation.split``); the first is the default.
    artifact_kind : str
        The :class:`pipeline.serving.artifact.ModelArtifact` kind it publishes.
    challengers : tuple of str
        The ``gate.challenger`` values its trainer implements (besides ``"none"``).
    tune_axes : dict
        Setting -> its default grid, for a config's ``tune`` table (the trainer's tuner
        searches them; ``{}``: the family does not tune).
    """

    name: str
    estimator: str
    trainer: str
    kinds: tuple[str, ...]
    metrics: dict
    evaluation: dict
    splits: tuple[str, ...]
    artifact_kind: str
    dataset_params: dict = field(default_factory=dict)
    challengers: tuple[str, ...] = ()
    tune_axes: dict = field(default_factory=dict)

    def estimator_class(self):
        return _resolve(self.estimator, "solvers")

    @cached_property
    def param_names(self) -> tuple[str, ...]:
        """Every key a config's ``params`` may hold: the estimator's parameters but where it
        runs (a model's ``ray_address`` says that, or RANKSTREAM_RAY_ADDRESS), and the
        dataset's."""
        return tuple(n for n in self.estimator_class().param_names()
                     if n not in ENGINE_PARAMS) + tuple(self.dataset_params)

    def estimator_params(self, params: dict) -> dict:
        """The part of a config's ``params`` that goes to the estimator's constructor."""
        return {k: v for k, v in params.items() if k not in self.dataset_params}

    def dataset_param(self, params: dict, name: str):
        """A dataset parameter from a config's ``params``, or its default."""
        return params.get(name, self.dataset_params[name])

    def trainer_class(self):
        return _resolve(self.trainer, "")

    def new_trainer(self):
        return self.trainer_class()(self)

    def metric_names(self, evaluation: dict) -> tuple[str, ...]:
        """The metrics its evaluation reports, for an ``[evaluation]`` table."""
        k = evaluation.get("k", self.evaluation.get("k"))
        return tuple(m.format(k=k) for m in self.metrics)

    def higher_is_better(self, metric: str) -> bool:
        for pattern, sign in self.metrics.items():
            if pattern.split("@")[0] == metric.split("@")[0]:
                return sign > 0
        raise KeyError(f"{self.name} has no metric {metric!r}")


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family(name="altsvm", estimator="AltSVM",
           trainer="pipeline.training.trainers.altsvm:AltSVMTrainer",
           kinds=("rating", "interaction", "comparison"),
           dataset_params={
               # which comparisons: "implicit" (a met item beats a sampled unmet one),
               # "explicit" (pairs of ratings, and comparison events) or "mixed"
               "comparisons": "implicit", "implicit_per_item": 10,
               "implicit_sampling": "uniform",
               # implicit: comparisons per user in all instead of per met item (0: per item),
               # and the least rating that makes a winner (0: every met item wins)
               "implicit_per_user": 0, "implicit_min_rating": 0.0,
               # implicit per user: at most this many per liked item (0: no cap), so the
               # comparisons, the fit's time and memory grow with the positives
               "implicit_max_per_positive": 0,
               # implicit comparisons of one fit in all (0: no budget): past it the cap per
               # liked row (or implicit_per_item) is lowered to fit, so the fit's memory
               # (about 130 bytes per comparison) stays bounded whatever the data's size
               "implicit_max_comparisons": 0,
               # comparisons of each kind per user (0: no cap); a bot with millions of
               # ratings would otherwise make all its pairs (the report says what was dropped)
               "max_pairs_per_user": 10_000,
               # the rating scale, [low, high]: ratings outside it are left out (counted)
               "rating_range": None,
               # choose λ on a validation split along a warm-started path (unless the config
               # gives reg or reg_ratio)
               "reg_path": True},
           metrics={"topk_ndcg@{k}": +1, "topk_precision@{k}": +1, "topk_recall@{k}": +1,
                    "ndcg@{k}": +1, "precision@{k}": +1, "pairwise_accuracy": +1},
           evaluation={"split": "per_user_last", "holdout": 5, "fraction": 0.2,
                       # "auto": lowest rating + 0.75 x the scale (4 on 1-5, 8 on 1-10)
                       "min_train": 5, "k": 10, "relevance": "auto", "metric": "topk_ndcg@10",
                       "seed": 0},
           splits=("per_user_last", "random"), artifact_kind="user_item",
           # implicit's ALS: the model recommendation teams would otherwise run; EASE: the
           # closed-form item-item model (trainers/ease.py); knn: the sparse item-item model
           # that scales past EASE's catalogue (trainers/item_knn.py); a config names any
           challengers=("als", "ease", "knn"),
           # why these grids: pipeline/training/trainers/altsvm_tuning.py
           tune_axes={"rank": [5, 10, 20, 50, 100],
                      "implicit_per_user": [250, 500, 1000, 2000, 4000],
                      "loss": ["squared_hinge", "hinge", "logistic"],
                      "implicit_sampling": ["uniform", "popularity"]}),
    Family(name="toppush", estimator="TopPush",
           trainer="pipeline.training.trainers.toppush:TopPushTrainer",
           kinds=("outcome",),
           # features of higher index are left out of the model (counted in the report)
           dataset_params={"max_features": 2**24},
           metrics={"pos@top": +1, "average_precision": +1, "auc": +1, "ndcg": +1},
           evaluation={"split": "random", "fraction": 0.2, "metric": "pos@top", "seed": 0},
           splits=("random",), artifact_kind="global_list",
           challengers=("logistic",)),
    Family(name="npsvor", estimator="NPSVOR",
           trainer="pipeline.training.trainers.npsvor:NPSVORTrainer",
           kinds=("ordinal",),
           # rows are [features | hashed text]: numeric feature indices of max_features or
           # more are left out (counted); text_features hashed n-gram columns (0: no text)
           # labels outside 1..levels are left out (counted): a stray label sizes nothing
           dataset_params={"max_features": 2**20, "text_features": 2**20, "levels": 10},
           # rating_ndcg: NDCG of the held-out list ordered by predict_score, gain = rating
           metrics={"mae": -1, "mse": -1, "accuracy": +1, "rating_ndcg": +1},
           # split "random": a stable hash of the event id holds out a fraction of events
           evaluation={"split": "random", "fraction": 0.2, "metric": "mae", "seed": 0},
           splits=("random",), artifact_kind="predicted_ratings",
           # the better (on validation) of mord's LogisticAT and scikit-learn's LinearSVR
           challengers=("linear_ordinal",),
           # C1 (C2 follows unless given) and the loss; why these grids:
           # pipeline/training/trainers/npsvor_tuning.py
           tune_axes={"C1": [0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
                      "loss": ["hinge", "squared_hinge"]}),
    Family(name="kernel_ranksvm", estimator="KernelRankSVM",
           trainer="pipeline.training.trainers.kernel_ranksvm:KernelRankSVMTrainer",
           kinds=("judgment",),
           # feature indices of that or more are left out (counted): the kernel's rows are dense
           dataset_params={"max_features": 1024},
           # ndcg and map count held-out queries without a relevant doc as 0 (LETOR's
           # convention); ndcg_relevant leaves them out
           metrics={"ndcg@{k}": +1, "ndcg_relevant@{k}": +1, "map": +1,
                    "pairwise_accuracy": +1},
           # split "query": a stable hash of the query holds out whole queries
           evaluation={"split": "query", "fraction": 0.2, "k": 10, "metric": "ndcg@10",
                       "seed": 0},
           splits=("query",), artifact_kind="query_docs",
           # the same solver with a linear kernel
           challengers=("linear",)),
)}


def _resolve(path: str, default_module: str):
    """The object ``module:Name`` names (``Name`` alone: in ``default_module``)."""
    module, _, name = path.rpartition(":")
    return getattr(importlib.import_module(module or default_module), name)


def register(entry: Family) -> Family:
    """Add a family (a plugin's, or a test's) to :data:`FAMILIES`; its name must be new."""
    if entry.name in FAMILIES:
        raise ValueError(f"algorithm {entry.name!r} is registered already")
    FAMILIES[entry.name] = entry
    return entry


def family(name: str) -> Family:
    """The registry entry of ``name``; ``ValueError`` naming the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"algorithm {name!r} is not known; expected one of "
                         f"{sorted(FAMILIES)}") from None
