"""Where the pipeline finds its servers and files: CLI flags > environment > TOML file > defaults.

Environment variables (all optional):

``RANKSTREAM_HOME``              working directory for the store, checkpoints, dead letters
                                 (default ``./.rankstream``)
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
``RANKSTREAM_CONFIG``            TOML file with a ``[rankstream]`` table of the same keys
                                 (lower case, without the prefix) and the model configs
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

ENV_PREFIX = "RANKSTREAM_"


@dataclass(frozen=True)
class Settings:
    home: Path = Path(".rankstream")
    kafka_bootstrap: str | None = None
    kafka_security: dict = field(default_factory=dict)
    redis_url: str | None = None
    namespace: str = "rankstream"
    redis_timeout: float = 0.1
    redis_on_error: str = "raise"
    dead_letter_topic: str = "rankstream.dead-letter"
    config: Path | None = None

    def __post_init__(self):
        object.__setattr__(self, "home", Path(self.home))
        if self.config is not None:
            object.__setattr__(self, "config", Path(self.config))

    @property
    def store_dir(self) -> Path:
        return self.home / "store"

    @property
    def dead_letter_dir(self) -> Path:
        return self.home / "dead-letter"

    @property
    def checkpoint_dir(self) -> Path:
        return self.home / "checkpoints"

    @classmethod
    def load(cls, overrides: dict | None = None, environ=None) -> "Settings":
        """Settings from defaults, then the TOML file, then the environment, then ``overrides``
        (e.g. CLI flags; ``None`` values are ignored)."""
        environ = os.environ if environ is None else environ
        overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        values: dict = {}
        config = overrides.get("config") or environ.get(ENV_PREFIX + "CONFIG")
        if config:
            with open(config, "rb") as fh:
                values.update(tomllib.load(fh).get("rankstream", {}))
            values["config"] = config
        for f in fields(cls):
            raw = environ.get(ENV_PREFIX + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = raw
        values.update(overrides)
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown settings {sorted(unknown)}; "
                             f"expected some of {[f.name for f in fields(cls)]}")
        if isinstance(values.get("kafka_security"), str):
            try:
                values["kafka_security"] = json.loads(values["kafka_security"])
            except json.JSONDecodeError as err:
                raise ValueError(f"RANKSTREAM_KAFKA_SECURITY is not a JSON object: {err}") from None
        if isinstance(values.get("redis_timeout"), str):
            try:
                values["redis_timeout"] = float(values["redis_timeout"])
            except ValueError:
                raise ValueError(f"redis_timeout is {values['redis_timeout']!r}, expected "
                                 "seconds") from None
        for key in ("home", "config"):
            if values.get(key) is not None:
                values[key] = Path(values[key])
        return replace(cls(), **values)
