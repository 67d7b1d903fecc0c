"""Model configs: one TOML file holds many models; adding a model is a config change.

Every table is validated when the file is loaded, against the algorithm's registry entry
(:mod:`pipeline.training.registry`): an unknown key, parameter, kind, metric or split is refused
there, with the model, the key and the allowed values named. Example (``dags/models.toml`` is
the shipped, tested version)::

    [models.movies]
    algorithm = "altsvm"              # a key of pipeline.training.registry.FAMILIES
    kinds = ["rating"]                # event kinds it trains on
    window = { last_days = 30 }       # or { last_events = 1_000_000 }, or {} for everything
    schedule = "@hourly"
    params = { rank = 10, reg = 1000.0 }
    evaluation = { split = "per_user_last", holdout = 5, k = 10, relevance = 4.0,
                   metric = "ndcg@10", seed = 0 }
    gate = { tolerance = 0.01 }       # publish unless metric is worse than served by more
    publish = { top_k = 100, keep_versions = 3 }
    item_titles = "ml-100k/u.item"   # optional, for the server's /ui pages only: item id ->
                                     # title (u.item, movies.dat, or a CSV with a title column)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.naming import check_name
from pipeline.training.registry import Family, family

# tolerance: how much worse than the served version a candidate may be; trivial_margin: how
# much better than the trivial models it must be; if_trivial: "reject" or "publish_trivial";
# challenger: a strong cheap model trained beside it ("none" or one of the family's), published
# instead when the model is worse than it by more than challenger_tolerance; challenger_mode
# "blend" publishes a blend of both when it beats either alone
GATE_KEYS = {"tolerance": 0.0, "trivial_margin": 0.0, "if_trivial": "reject",
             "challenger": "none", "challenger_tolerance": 0.0, "challenger_mode": "replace"}
PUBLISH_KEYS = {"top_k": 100, "keep_versions": 3}
# tune: settings chosen on the validation split; at most max_settings scored settings and
# budget_seconds for the model, and the same caps for its challenger (the same effort); of the
# settings within tolerance (relative) of the best validation score, the cheapest is chosen
# (the counts are the budget, per data size: pipeline.training.tuning.settings_for_size;
# budget_seconds is a cap on wall time, and a search it ends says so in the run summary);
# challenger_settings: the settings a challenger's search (ALS) may score at 100k rows, the
# count of a plain 24-point grid; ease_max_items: EASE (an items x items model) is fitted on
# every item up to this many, past it on the ease_max_items² / n_items most met
# keys the server's /ui pages read and training does not: kept out of ModelConfig, so that
# they are no part of a model's config digest (naming a titles file retrains nothing)
UI_KEYS = ("item_titles",)
TUNE_KEYS = {"budget_seconds": 30.0, "max_settings": 12, "tolerance": 0.005,
             "challenger_settings": 24, "ease_max_items": 5000, "sample_users": 10_000}


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
    tune: dict = field(default_factory=dict)
    ray_address: str | None = None     # HOST:PORT of a Ray cluster the model's fit runs on

    @property
    def metric(self) -> str:
        """The metric the gate compares."""
        return self.evaluation["metric"]

    @property
    def family(self) -> Family:
        return family(self.algorithm)


def _table(where: str, name: str, key: str, raw: dict, allowed: dict | tuple) -> dict:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"{where}: model {name!r} {key} is {value!r}, expected a table")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: model {name!r} has unknown {key} keys {unknown}; "
                         f"allowed: {sorted(allowed)}")
    return dict(value)


def parse_model(name: str, raw: dict, where: str) -> ModelConfig:
    """One validated model config from its table; ``where`` names the source in errors."""
    try:
        check_name("model name", name)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    known = set(ModelConfig.__dataclass_fields__) - {"name"} | set(UI_KEYS)
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"{where}: model {name!r} has unknown keys {sorted(unknown)}; "
                         f"expected some of {sorted(known)}")
    try:
        fam = family(raw.get("algorithm"))
    except ValueError as err:
        raise ValueError(f"{where}: model {name!r}: {err}") from None
    kinds = tuple(raw.get("kinds", fam.kinds[:1]))
    bad = set(kinds) - set(fam.kinds)
    if not kinds or bad:
        raise ValueError(f"{where}: model {name!r} ({fam.name}) trains on kinds {list(kinds)}, "
                         f"expected a non-empty subset of {list(fam.kinds)}")
    window = _table(where, name, "window", raw, ("last_days", "last_events"))
    if len(window) > 1:
        raise ValueError(f"{where}: model {name!r} window is {window}, expected {{}} or one of "
                         "{last_days = N} / {last_events = N}")
    for key, value in window.items():
        if not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{where}: model {name!r} window.{key} is {value!r}, "
                             "expected a number > 0")
    params = _table(where, name, "params", raw, fam.param_names)
    try:   # a wrong type or value is refused here, not after a window was read and built
        fam.estimator_class()(**fam.estimator_params(params)).validate_params()
        fam.trainer_class().check_params(params)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where}: model {name!r} params: {err}") from None
    evaluation = {**fam.evaluation, **_table(where, name, "evaluation", raw, fam.evaluation)}
    if "metric" not in raw.get("evaluation", {}) and "k" in evaluation:
        evaluation["metric"] = fam.evaluation["metric"].split("@")[0] + f"@{evaluation['k']}"
    metrics = fam.metric_names(evaluation)
    if evaluation["metric"] not in metrics:
        raise ValueError(f"{where}: model {name!r} metric is {evaluation['metric']!r}, "
                         f"expected one of {list(metrics)}")
    relevance = evaluation.get("relevance", "auto")
    if relevance != "auto" and not (isinstance(relevance, (int, float))
                                    and not isinstance(relevance, bool)):
        raise ValueError(f"{where}: model {name!r} evaluation.relevance is {relevance!r}, "
                         'expected a number (the least relevant rating) or "auto"')
    if evaluation["split"] not in fam.splits:
        raise ValueError(f"{where}: model {name!r} split is {evaluation['split']!r}, "
                         f"expected one of {list(fam.splits)}")
    gate = {**GATE_KEYS, **_table(where, name, "gate", raw, GATE_KEYS)}
    if gate["if_trivial"] not in ("reject", "publish_trivial"):
        raise ValueError(f"{where}: model {name!r} gate.if_trivial is {gate['if_trivial']!r}, "
                         "expected 'reject' or 'publish_trivial'")
    named = gate["challenger"]
    if isinstance(named, list):     # several challengers: each one of the family's, once
        if (not named or len(set(map(str, named))) != len(named)
                or not all(isinstance(n, str) and n in fam.challengers for n in named)):
            raise ValueError(f"{where}: model {name!r} gate.challenger is {named!r}, expected "
                             f"a list of distinct names from {list(fam.challengers)}")
    elif named not in ("none",) + fam.challengers:
        raise ValueError(f"{where}: model {name!r} gate.challenger is {named!r}, "
                         f"expected one of {['none', *fam.challengers]} (or a list of them)")
    if gate["challenger_mode"] not in ("replace", "blend"):
        raise ValueError(f"{where}: model {name!r} gate.challenger_mode is "
                         f"{gate['challenger_mode']!r}, expected 'replace' or 'blend'")
    publish = {**PUBLISH_KEYS, **_table(where, name, "publish", raw, PUBLISH_KEYS)}
    titles = raw.get("item_titles")
    if titles is not None and not (isinstance(titles, str) and titles.strip()):
        raise ValueError(f"{where}: model {name!r} item_titles is {titles!r}, expected the "
                         "path of an item metadata file (an id and a title per line)")
    tune = _tune(where, name, raw, fam)
    schedule = raw.get("schedule", "@hourly")
    if not valid_schedule(schedule):
        raise ValueError(f"{where}: model {name!r} schedule is {schedule!r}, expected an "
                         f"Airflow preset ({', '.join(SCHEDULE_PRESETS)}) or a cron "
                         "expression such as '0 * * * *'")
    return ModelConfig(name=name, algorithm=fam.name, kinds=kinds, window=window,
                       schedule=schedule, params=params,
                       evaluation=evaluation, gate=gate, publish=publish, tune=tune,
                       ray_address=_ray_address(where, name, raw.get("ray_address"), fam))


def _ray_address(where: str, name: str, address, fam: Family) -> str | None:
    """A model's ``ray_address``, checked: ``HOST:PORT``, of a family that fits on Ray."""
    if address is None:
        return None
    from solvers._params import Address

    try:
        Address()("ray_address", address)
    except ValueError as err:
        raise ValueError(f"{where}: model {name!r} {err}") from None
    if "ray_address" not in fam.estimator_class()._parameter_constraints:
        raise ValueError(f"{where}: model {name!r} ({fam.name}) has ray_address, but only "
                         "altsvm fits on a Ray cluster; remove it")
    return address


SCHEDULE_PRESETS = ("@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly",
                    "@quarterly", "@yearly", "@annually")


def valid_schedule(schedule) -> bool:
    """Whether Airflow takes ``schedule``: a preset or a cron expression (checked by croniter,
    Airflow's own parser, where it is installed; else five fields of cron's characters).

    >>> valid_schedule("@hourly"), valid_schedule("*/15 * * * *"), valid_schedule("every hour")
    (True, True, False)
    """
    if not isinstance(schedule, str):
        return False
    if schedule in SCHEDULE_PRESETS:
        return True
    try:
        from croniter import croniter
    except ImportError:
        import re

        return bool(re.fullmatch(r"([0-9A-Za-z*/,?#LW-]+\s+){4}[0-9A-Za-z*/,?#LW-]+",
                                 schedule.strip()))
    return bool(croniter.is_valid(schedule))


def _tune(where: str, name: str, raw: dict, fam: Family) -> dict:
    """The ``tune`` table: {} (no tuning), or budget caps and optional grids of the family's
    tuning axes (each a non-empty list), over :data:`TUNE_KEYS`' defaults."""
    if "tune" not in raw:
        return {}
    if not fam.tune_axes:
        raise ValueError(f"{where}: model {name!r} ({fam.name}) has a tune table, but only "
                         "families with tuning axes accept one")
    tune = {**TUNE_KEYS, **_table(where, name, "tune", raw, (*TUNE_KEYS, *fam.tune_axes))}
    for key in TUNE_KEYS:
        least = 0 if key == "tolerance" else 1e-300
        if not (isinstance(tune[key], (int, float)) and not isinstance(tune[key], bool)
                and tune[key] >= least):
            raise ValueError(f"{where}: model {name!r} tune.{key} is {tune[key]!r}, expected a "
                             f"number {'>= 0' if key == 'tolerance' else '> 0'}")
    estimator = fam.estimator_class()
    for axis, default in fam.tune_axes.items():
        grid = tune.setdefault(axis, list(default))
        if not (isinstance(grid, list) and grid):
            raise ValueError(f"{where}: model {name!r} tune.{axis} is {grid!r}, expected a "
                             f"non-empty list such as {list(default)}")
        if axis in estimator.param_names():   # each value as the estimator would refuse it
            for value in grid:
                try:
                    estimator(**{axis: value}).validate_params()
                except (ValueError, TypeError) as err:
                    raise ValueError(f"{where}: model {name!r} tune.{axis}: {err}") from None
    return tune


def load_models(path) -> dict[str, ModelConfig]:
    """All models of a TOML config file, validated; errors name the model, key and value."""
    path = Path(path)
    return {name: parse_model(name, spec, str(path)) for name, spec in load_raw(path).items()}


def load_raw(path: Path) -> dict:
    """The ``[models.NAME]`` tables of a config file, as TOML has them."""
    with open(path, "rb") as fh:
        try:
            raw = tomllib.load(fh)
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"{path}: not valid TOML: {err}") from None
    models = raw.get("models", {})
    if not models:
        raise ValueError(f"{path}: no [models.NAME] tables found")
    return models


def item_titles(path) -> dict[str, str]:
    """``{model: item metadata file}`` of the models of a config file that name one
    (``item_titles``; a relative path is relative to the config file). Validated as
    :func:`load_models` validates it."""
    path = Path(path)
    out = {}
    for name, spec in load_raw(path).items():
        titles = spec.get("item_titles") if isinstance(spec, dict) else None
        if isinstance(titles, str) and titles.strip():
            out[name] = str(path.parent / Path(titles).expanduser())
    return out
