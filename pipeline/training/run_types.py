"""The values one retrain hands from step to step: its :class:`RunContext`, the gate's
:class:`Choice` of what users get, and the run's :class:`Decision`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from pipeline.settings import Settings
from pipeline.training.config import ModelConfig, load_models
from pipeline.training.run_store import RunStore, open_run_store

DATASET_FORMAT = "rankstream.dataset"
KEEP_RUN_DIRS = 5


class Decision(StrEnum):
    """What a run did (``summary["decision"]``): a ``str``, so JSON and XCom carry it as is."""

    PENDING = "pending"            # the dataset is built; training comes next
    NO_DATA = "no_data"            # the window holds nothing to train on
    UNCHANGED = "unchanged"        # the window the last checkpoint was trained on
    REPUBLISHED = "republished"    # unchanged, and Redis had lost it: published again
    TRAINED = "trained"            # trained, and not meant to publish (a trial run)
    PUBLISHED = "published"
    REJECTED = "rejected"          # the gate kept what is served
    FENCED = "fenced"              # the run lost its lease on the model: its flip was refused

    @classmethod
    def of_publish(cls, published: dict) -> "Decision":
        """The run's decision from its publish step's summary."""
        if published.get("published"):
            return cls.PUBLISHED
        return cls.FENCED if published.get("fenced") else cls.REJECTED


class Served(StrEnum):
    """Which of a run's candidates a :class:`Choice` names."""

    MODEL = "model"
    CHALLENGER = "challenger"
    BLEND = "blend"                # the model blended with its challenger
    TRIVIAL = "trivial"


@dataclass(frozen=True)
class Choice:
    """What the gate serves: the model, a challenger or blend (``name``: the challenger's
    algorithm) or a trivial list (``name``: the trivial model). ``str`` of it is how JSON, the
    artifacts' ``served_as`` and the lookups' ``source`` spell it (``"challenger-als"``).

    Examples
    --------
    >>> Choice.parse("blend-als"), str(Choice(Served.TRIVIAL, "popularity"))
    (Choice(served=<Served.BLEND: 'blend'>, name='als'), 'trivial-popularity')
    >>> Choice(Served.MODEL).dir_name, Choice.parse("challenger-als").dir_name
    ('artifact', 'challenger-als')
    """

    served: Served
    name: str | None = None

    def __post_init__(self):
        if (self.name is None) != (self.served is Served.MODEL):
            raise ValueError(f"a {self.served} choice {'needs' if self.name is None else 'has no'}"
                             f" name (got {self.name!r})")

    def __str__(self) -> str:
        return str(self.served) if self.name is None else f"{self.served}-{self.name}"

    @classmethod
    def parse(cls, text: str) -> "Choice":
        served, _, name = str(text).partition("-")
        return cls(Served(served), name or None)

    @property
    def dir_name(self) -> str:
        """Where the choice's artifact lives in the run directory."""
        return "artifact" if self.served is Served.MODEL else str(self)


@dataclass(frozen=True)
class RunContext:
    """What every step of one model's run reads: the model's config (parsed once), the
    settings, the Redis URL (``None``: a run that does not publish) and, from the dataset
    step on, the run directory."""

    model: str
    cfg: ModelConfig
    settings: Settings
    redis_url: str | None = None
    run_dir: Path | None = None
    fence: int | None = None      # the model's Redis lease token its publish is checked against

    @classmethod
    def of(cls, config, model: str, settings: Settings | None = None,
           redis_url: str | None = None, run_dir=None) -> "RunContext":
        """``config``: a models TOML path, or a dict of parsed configs; ``run_dir``: a path, or
        the URL of a run directory in the object store (copied here first)."""
        settings = settings or Settings.load()
        models = config if isinstance(config, dict) else load_models(config)
        if model not in models:
            raise KeyError(f"model {model!r} is not configured; configured: {sorted(models)}")
        local = None if run_dir is None else open_run_store(settings).pull_run(run_dir)
        return cls(model, models[model], settings, redis_url, local)

    @property
    def runs(self) -> RunStore:
        """Where this run's directory and checkpoints are shared (chosen once per store)."""
        return open_run_store(self.settings)

    def at(self, run_dir) -> "RunContext":
        return replace(self, run_dir=Path(run_dir))

    def client(self):
        if self.redis_url is None:
            raise ValueError("publishing needs a Redis URL (settings.redis_url or redis_url=)")
        from pipeline.serving.redis_client import as_client

        return as_client(self.redis_url)
