"""Model configs: one TOML file holds many models; adding a model is a config change.

Example (``pipeline/models.example.toml`` is the full, tested version)::

    [models.movies]
    algorithm = "altsvm"              # altsvm | toppush (later: npsvor, kernel_ranksvm)
    kinds = ["rating"]                # event kinds it trains on
    window = { last_days = 30 }       # or { last_events = 1_000_000 }, or {} for everything
    schedule = "@hourly"
    params = { rank = 10, reg = 1000.0 }
    evaluation = { split = "per_user_last", holdout = 5, metric = "ndcg@10", seed = 0 }
    gate = { tolerance = 0.01 }       # publish unless metric < published metric - tolerance
    publish = { top_k = 100, keep_versions = 3 }
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ALGORITHMS = {
    "altsvm": {"kinds": {"rating", "comparison"}, "metrics": {"ndcg@10", "precision@10",
                                                               "pairwise_accuracy"}},
    "toppush": {"kinds": {"outcome"}, "metrics": {"pos@top", "average_precision", "auc",
                                                  "ndcg"}},
}
SPLITS = {"per_user_last", "random"}


@dataclass(frozen=True)
class ModelConfig:
    name: str
    algorithm: str
    kinds: tuple[str, ...]
    window: dict = field(default_factory=dict)
    schedule: str = "@hourly"
    params: dict = field(default_factory=dict)
    evaluation: dict = field(default_factory=dict)
    gate: dict = field(default_factory=dict)
    publish: dict = field(default_factory=dict)

    @property
    def metric(self) -> str:
        return self.evaluation["metric"]


def _defaults(algorithm: str) -> dict:
    if algorithm == "altsvm":
        return {"split": "per_user_last", "holdout": 5, "metric": "ndcg@10", "seed": 0}
    return {"split": "random", "fraction": 0.2, "metric": "pos@top", "seed": 0}


def parse_model(name: str, raw: dict, where: str) -> ModelConfig:
    """One validated model config from its table; ``where`` names the source in errors."""
    known = set(ModelConfig.__dataclass_fields__) - {"name"}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{where}: model {name!r} has unknown keys {sorted(unknown)}; "
                         f"expected some of {sorted(known)}")
    algorithm = raw.get("algorithm")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"{where}: model {name!r} has algorithm {algorithm!r}, "
                         f"expected one of {sorted(ALGORITHMS)}")
    spec = ALGORITHMS[algorithm]
    kinds = tuple(raw.get("kinds", sorted(spec["kinds"])[:1]))
    bad = set(kinds) - spec["kinds"]
    if not kinds or bad:
        raise ValueError(f"{where}: model {name!r} ({algorithm}) trains on kinds {list(kinds)}, "
                         f"expected a non-empty subset of {sorted(spec['kinds'])}")
    window = dict(raw.get("window", {}))
    if set(window) - {"last_days", "last_events"} or len(window) > 1:
        raise ValueError(f"{where}: model {name!r} window is {window}, expected {{}} or one of "
                         "{last_days = N} / {last_events = N}")
    for key, value in window.items():
        if not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{where}: model {name!r} window.{key} is {value!r}, "
                             "expected a number > 0")
    evaluation = {**_defaults(algorithm), **raw.get("evaluation", {})}
    if evaluation["metric"] not in spec["metrics"]:
        raise ValueError(f"{where}: model {name!r} metric is {evaluation['metric']!r}, "
                         f"expected one of {sorted(spec['metrics'])}")
    if evaluation["split"] not in SPLITS:
        raise ValueError(f"{where}: model {name!r} split is {evaluation['split']!r}, "
                         f"expected one of {sorted(SPLITS)}")
    gate = {"tolerance": 0.0, **raw.get("gate", {})}
    publish = {"top_k": 100, "keep_versions": 3, **raw.get("publish", {})}
    return ModelConfig(name=name, algorithm=algorithm, kinds=kinds, window=window,
                       schedule=raw.get("schedule", "@hourly"), params=dict(raw.get("params", {})),
                       evaluation=evaluation, gate=gate, publish=publish)


def load_models(path) -> dict[str, ModelConfig]:
    """All models of a TOML config file, validated; errors name the model, key and value."""
    path = Path(path)
    with open(path, "rb") as fh:
        raw = tomllib.load(fh)
    models = raw.get("models", {})
    if not models:
        raise ValueError(f"{path}: no [models.NAME] tables found")
    return {name: parse_model(name, spec, str(path)) for name, spec in models.items()}
