"""What is published of a model, read without changing anything: the version ``current``
names, the kept versions with their meta (:func:`versions`), and the answer counts lookup
clients reported (:func:`answer_counts`, :func:`fallback_share`).

Examples
--------
>>> import redis  # doctest: +SKIP
>>> r = redis.Redis.from_url("redis://127.0.0.1:6379/0")  # doctest: +SKIP
>>> [(v.version, v.current) for v in versions("movies", r)]  # doctest: +SKIP
[(6, False), (7, True)]
>>> age_seconds("2020-01-01T00:00:00+00:00") > 0
True
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np

from pipeline.serving.layout import LayoutError, ModelKeys, UnknownModelError, parse_current


@dataclass
class VersionInfo:
    """One published version as listed by :func:`versions`."""

    version: int
    current: bool
    status: str
    kind: str = ""
    algorithm: str = ""
    publish_id: str = ""
    trained_at: str = ""
    published_at: str = ""
    n_items: int = 0
    n_lists: int = 0
    metrics: dict = field(default_factory=dict)
    served_as: str = "model"
    watermark: dict = field(default_factory=dict)
    """``{"<topic>/<partition>": next_offset}``: the event-store offsets the version learned
    from (``{}``: not known)."""
    healed_at: str = ""
    """When it was published again because Redis had lost the model ("" for a plain publish)."""


def check_watermark(value) -> dict:
    """A version's watermark as given: ``{"<topic>/<partition>": next_offset}`` (offsets are
    non-negative ints); ``ValueError`` naming the first entry that is not one.

    Examples
    --------
    >>> check_watermark({"rankstream.rating/0": 42})
    {'rankstream.rating/0': 42}
    """
    if not isinstance(value, dict):
        raise ValueError(f"watermark is a {type(value).__name__}, expected a dict of "
                         "'<topic>/<partition>' -> next offset")
    for name, offset in value.items():
        topic, _, partition = name.rpartition("/") if isinstance(name, str) else ("", "", "")
        if not topic or not partition.isdigit() or isinstance(offset, bool) \
                or not isinstance(offset, (int, np.integer)) or offset < 0:
            raise ValueError(f"watermark entry {name!r}: {offset!r} is not "
                             "'<topic>/<partition>': a non-negative offset")
    return {name: int(offset) for name, offset in value.items()}


def parse_watermark(raw: str | None, key: str) -> dict:
    """The meta's ``watermark`` field parsed (``{}`` when absent); :class:`LayoutError` when
    it is not what :func:`check_watermark` accepts.

    Examples
    --------
    >>> parse_watermark('{"events/3": 7}', "k"), parse_watermark(None, "k")
    ({'events/3': 7}, {})
    """
    try:
        return check_watermark(json.loads(raw or "{}"))
    except ValueError as err:
        raise LayoutError(f"{key} field 'watermark' is {raw!r:.80}: {err}") from None


def read_current(client, keys: ModelKeys) -> tuple[int, str] | None:
    """(version, publish_id) that ``current`` points to, or ``None`` if nothing is published."""
    raw = current_raw(client, keys)
    return None if raw is None else parse_current(raw, keys.current)


def current_raw(client, keys: ModelKeys) -> bytes | None:
    import redis

    try:
        return client.get(keys.current)
    except redis.ResponseError as err:
        raise LayoutError(f"{keys.current} is not a string key ({err})") from None


def kept_versions(client, keys: ModelKeys) -> list[int]:
    """The version numbers in the version list, oldest first."""
    import redis

    try:
        raw = client.lrange(keys.versions, 0, -1)
    except redis.ResponseError as err:
        raise LayoutError(f"{keys.versions} is not a list ({err})") from None
    try:
        return [int(v) for v in raw]
    except ValueError:
        raise LayoutError(f"{keys.versions} holds {raw[:5]!r}..., expected version "
                          "numbers") from None


def versions(model: str, redis, *, namespace: str = "rankstream") -> list[VersionInfo]:
    """Kept versions of ``model``, oldest first, with their meta and which one is current.

    Examples
    --------
    >>> [(v.version, v.current) for v in versions("movies", r)]  # doctest: +SKIP
    [(6, False), (7, True)]
    """
    keys = ModelKeys(namespace, model)
    current = read_current(redis, keys)
    kept = kept_versions(redis, keys)
    if current is None and not kept:
        raise UnknownModelError(f"model {model!r} has no published version in namespace "
                                f"{namespace!r} ({keys.current} does not exist)")
    pipe = redis.pipeline(transaction=False)
    for v in kept:
        pipe.hgetall(keys.version(v).meta)
    out = []
    for v, meta in zip(kept, pipe.execute(raise_on_error=False)):
        if isinstance(meta, Exception):
            raise LayoutError(f"{keys.version(v).meta} is not a hash ({meta})")
        m = {k.decode(): val.decode() for k, val in meta.items()}
        try:
            metrics = json.loads(m.get("metrics", "{}"))
            info = VersionInfo(
                version=v, current=current is not None and current[0] == v,
                status=m.get("status", "missing"), kind=m.get("kind", ""),
                algorithm=m.get("algorithm", ""), publish_id=m.get("publish_id", ""),
                trained_at=m.get("trained_at", ""), published_at=m.get("published_at", ""),
                n_items=int(m.get("n_items", 0)), n_lists=int(m.get("n_lists", 0)),
                metrics=metrics, served_as=m.get("served_as", "model"),
                healed_at=m.get("healed_at", ""),
                watermark=parse_watermark(m.get("watermark"), keys.version(v).meta))
        except ValueError as err:
            raise LayoutError(f"{keys.version(v).meta} has a malformed field: {err}") from None
        out.append(info)
    return out


def served_versions(model: str, redis, *, namespace: str = "rankstream") -> list[VersionInfo]:
    """:func:`versions`, or ``[]`` for a model with nothing published."""
    try:
        return versions(model, redis, namespace=namespace)
    except UnknownModelError:
        return []


def current_version(model: str, redis, *, namespace: str = "rankstream") -> VersionInfo | None:
    """The version lookups are served from, or None."""
    return next((v for v in served_versions(model, redis, namespace=namespace) if v.current),
                None)


def age_seconds(iso: str) -> float | None:
    """Seconds since the ISO 8601 time ``iso`` (UTC when it names no zone); None when it is
    not one."""
    try:
        then = datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None
    if then.tzinfo is None:
        then = then.replace(tzinfo=timezone.utc)
    return round(time.time() - then.timestamp(), 1)


def fallback_share(model: str, redis, version: int, *,
                   namespace: str = "rankstream") -> tuple[float | None, int]:
    """(share of ``version``'s lookups answered from the fallback list, lookups counted)."""
    counts = answer_counts(model, redis, namespace=namespace).get(version, {})
    total = sum(counts.values())
    return (counts.get("fallback", 0) / total if total else None), total


def answer_counts(model: str, redis, *, namespace: str = "rankstream") -> dict:
    """{version: {source: answers}} that lookup clients reported for ``model``."""
    out: dict = {}
    for name, n in redis.hgetall(ModelKeys(namespace, model).lookups).items():
        version, _, source = name.decode().partition(":")
        out.setdefault(int(version), {})[source] = int(n)
    return out
