"""Where the pipeline finds its servers and files: CLI flags > environment > TOML file > defaults.

Environment variables (all optional):

``RANKSTREAM_HOME``              working directory for the store, checkpoints, dead letters
                                 (default ``$XDG_DATA_HOME/rankstream``, i.e.
                                 ``~/.local/share/rankstream``: the same from any directory)
``RANKSTREAM_STORE``             where the event store, dead letters, run directories and
                                 checkpoints live: a local directory (default: ``HOME``) or an
                                 object store, ``s3://bucket/prefix`` (server and credentials
                                 from ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
                                 ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``; see
                                 :mod:`pipeline.storage`). With an object store, ``HOME`` keeps
                                 only this host's working copies, locks and caches
``RANKSTREAM_KAFKA_BOOTSTRAP``   e.g. ``127.0.0.1:9092``; unset means embedded (files) mode
``RANKSTREAM_KAFKA_SECURITY``    JSON object passed to kafka-python (``security_protocol``,
                                 ``sasl_mechanism``, ``sasl_plain_username``, ``ssl_cafile`` ...)
``RANKSTREAM_REDIS_URL``         ``redis://[:password@]host:port/db``, ``rediss://`` for TLS, or
                                 ``unix:///path.sock``; unset means an embedded private server
``RANKSTREAM_NAMESPACE``         Redis key namespace (default ``rankstream``)
``RANKSTREAM_REDIS_TIMEOUT``     seconds a top-K lookup waits for Redis (default ``0.1``)
``RANKSTREAM_REDIS_ON_ERROR``    lookups when Redis is down/slow: ``raise`` (default) or
                                 ``last_known`` (answer from the in-process cache)
``RANKSTREAM_DEAD_LETTER_TOPIC`` dead-letter topic (default ``rankstream.dead-letter``)
``RANKSTREAM_MAX_FUTURE_SECONDS`` events dated more than this after the ingesting machine's clock
                                 are dead letters (default ``86400``: one day)
``RANKSTREAM_MAX_FEATURE_INDEX`` larger feature indices are dead letters (default ``16777215``)
``RANKSTREAM_LEASE_TTL``         seconds a retrain's Redis lease on its model lives without
                                 renewal (default ``30``): how long a dead host blocks the next
                                 run, and how long a live one may stall before it loses it
``RANKSTREAM_RAY_ADDRESS``       ``HOST:PORT`` of a Ray cluster the AltSVM models' fits run on
                                 (``infra/ray/start.sh``); unset: in this process. A model's
                                 ``ray_address`` overrides it
``RANKSTREAM_CONFIG``            TOML file with a ``[rankstream]`` table of the same keys
                                 (lower case, without the prefix) and the model configs
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from pipeline.timestamps import parse_iso_ts

ENV_PREFIX = "RANKSTREAM_"
_SECRET_WORDS = ("password", "secret", "token", "key", "sasl_plain_username")


def redact(url: str) -> str:
    """The URL with its password replaced by ``***`` (for messages, logs and reports).

    Examples
    --------
    >>> redact("redis://:p%40ss@localhost:6379/0")
    'redis://:***@localhost:6379/0'
    >>> redact("unix:///tmp/r.sock?db=0&password=secret")
    'unix:///tmp/r.sock?db=0&password=***'
    """
    url = re.sub(r"(//[^:/@]*:)[^/]*@", r"\1***@", url)
    return re.sub(r"([?&]password=)[^&]*", r"\1***", url)


def default_home() -> Path:
    """Where the store, runs and checkpoints live unless told: the user's data directory,
    ``$XDG_DATA_HOME/rankstream`` (default ``~/.local/share/rankstream``), so a command run
    from another directory finds the same data and never litters the working directory."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / \
        "rankstream"


def state_dir(*parts: str) -> Path:
    """A directory for rankstream's own state under the user's home, never a shared /tmp:
    ``$XDG_STATE_HOME/rankstream/...`` (default ``~/.local/state/rankstream/...``), created with
    mode 0700."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    path = base.joinpath("rankstream", *parts)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


ON_ERROR = ("raise", "last_known")   # what lookups do when Redis is down or slow


@dataclass(frozen=True)
class Settings:
    home: Path = field(default_factory=lambda: default_home())
    store: str | None = None
    kafka_bootstrap: str | None = None
    kafka_security: dict = field(default_factory=dict)
    redis_url: str | None = None
    namespace: str = "rankstream"
    redis_timeout: float = 0.1
    redis_on_error: str = "raise"
    dead_letter_topic: str = "rankstream.dead-letter"
    max_future_seconds: float = 86_400.0
    max_feature_index: int = 2**24 - 1
    min_event_time: str = "1990-01-01"
    lease_ttl: float = 30.0
    config: Path | None = None
    ray_address: str | None = None

    def __repr__(self) -> str:
        """No secret in a log or report: the Redis URL's password and the Kafka security
        settings that hold secrets are shown as ``***``."""
        shown = {f.name: getattr(self, f.name) for f in fields(self)}
        if shown["redis_url"]:
            shown["redis_url"] = redact(shown["redis_url"])
        shown["kafka_security"] = {k: "***" if any(w in k for w in _SECRET_WORDS) else v
                                   for k, v in self.kafka_security.items()}
        return "Settings(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    def __post_init__(self):
        object.__setattr__(self, "home", Path(self.home))
        if self.config is not None:
            object.__setattr__(self, "config", Path(self.config))

    @property
    def remote(self) -> bool:
        """Whether the store is an object store (``s3://``) rather than local directories."""
        from pipeline.storage import is_object_url

        return is_object_url(self.store)

    @property
    def root(self) -> Path:
        """The local directory of the store, runs and checkpoints: ``store`` when it is a local
        path, else ``home`` (with an object store: this host's working copies and caches)."""
        return Path(self.store).expanduser() if self.store and not self.remote else self.home

    @property
    def store_dir(self) -> Path:
        return self.root / "store"

    @property
    def dead_letter_dir(self) -> Path:
        return self.root / "dead-letter"

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @classmethod
    def load(cls, overrides: dict | None = None, environ=None) -> "Settings":
        """Settings from defaults, then the TOML file, then the environment, then ``overrides``
        (e.g. CLI flags; ``None`` values are ignored)."""
        environ = os.environ if environ is None else environ
        overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        values: dict = {}
        where: dict = {}    # setting -> where its value came from, for error messages
        config = overrides.get("config") or environ.get(ENV_PREFIX + "CONFIG")
        if config:
            with open(config, "rb") as fh:
                try:
                    table = tomllib.load(fh).get("rankstream", {})
                except tomllib.TOMLDecodeError as err:
                    raise ValueError(f"{config}: not valid TOML: {err}") from None
            values.update(table)
            where.update({k: f"{config} [rankstream] {k}" for k in table})
            values["config"] = config
        for f in fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = raw
                where[f.name] = ENV_PREFIX + f.name.upper()
        values.update(overrides)
        where.update({k: f"--{k.replace('_', '-')}" for k in overrides})
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown settings {sorted(unknown)}; "
                             f"expected some of {[f.name for f in fields(cls)]}")
        if isinstance(values.get("kafka_security"), str):
            try:
                values["kafka_security"] = json.loads(values["kafka_security"])
            except json.JSONDecodeError as err:
                raise ValueError(f"RANKSTREAM_KAFKA_SECURITY is not a JSON object: {err}") from None
        for f in fields(cls):   # numbers given as text (environment variables)
            value = values.get(f.name)
            if f.type in ("float", "int") and isinstance(value, (str, bool)):
                try:
                    if isinstance(value, bool):
                        raise ValueError
                    values[f.name] = float(value) if f.type == "float" else int(value)
                except ValueError:
                    raise ValueError(f"{where.get(f.name, f.name)} is {value!r}, expected "
                                     f"a number") from None
        store = values.get("store")
        if store is not None and str(store).startswith("s3://"):
            from pipeline.storage import split_url

            try:
                split_url(str(store))
            except ValueError as err:
                raise ValueError(f"{where.get('store', 'store')}: {err}") from None
        elif store is not None and "://" in str(store):
            raise ValueError(f"{where.get('store', 'store')} is {store!r}: expected a local "
                             "directory or s3://bucket/prefix")
        on_error = values.get("redis_on_error", "raise")
        if on_error not in ON_ERROR:
            raise ValueError(f"{where.get('redis_on_error', 'redis_on_error')} is "
                             f"{on_error!r}, expected one of {', '.join(ON_ERROR)}")
        if "min_event_time" in values:
            try:
                parse_iso_ts(str(values["min_event_time"]))
            except ValueError:
                raise ValueError(f"{where.get('min_event_time', 'min_event_time')} is "
                                 f"{values['min_event_time']!r}, expected an ISO-8601 date "
                                 "such as 1990-01-01") from None
        for key in ("home", "config"):
            if values.get(key) is not None:
                values[key] = Path(values[key])
        return replace(cls(), **values)
