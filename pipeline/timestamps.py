"""Event times: ISO-8601 text to epoch milliseconds, the one parser for settings and ingest.

Examples
--------
>>> parse_iso_ts("2024-05-01T12:00:00Z")
1714564800000
>>> parse_iso_ts("1990-01-01")        # a naive time is UTC
631152000000
"""

from __future__ import annotations

from datetime import datetime, timezone

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def parse_iso_ts(text: str) -> int:
    """Epoch milliseconds of an ISO-8601 time; a naive time is UTC. ``ValueError`` if unparsable.

    >>> parse_iso_ts("1970-01-01T00:00:01.5Z")
    1500
    """
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
