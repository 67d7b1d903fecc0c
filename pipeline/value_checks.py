"""Checks of one value that ingest and serving share: feature lists and maps, and how a refused
value is named in the reason.

Ingest applies them to every event (:mod:`pipeline.ingest.event_checks`), serving to the
features of request candidates (:mod:`pipeline.serving.scorers`), so both refuse the same
values with the same words.

Examples
--------
>>> check_features("candidate 0", {"3": 0.5, "1": 2})
([1, 3], [2.0, 0.5])
>>> try:
...     check_features("candidate 0", [1.0, "x"])
... except Invalid as err:
...     print(err)
candidate 0: features: value at position 1 is 'x', expected a number
"""

from __future__ import annotations

import math

# Ratings and feature values beyond this magnitude are refused: no rating scale or feature
# needs more, and one such value squared overflows float32 (3.4e38) in a solver, or pulls the
# "auto" relevance threshold above every real rating.
MAX_ABS_NUMBER = 1e15
MAX_FEATURE_INDEX = 2**31 - 1      # feature indices are stored as int32


class _Missing:
    def __repr__(self):
        return "MISSING"


MISSING = _Missing()      # a field the event does not have


class Invalid(ValueError):
    """Raised by the per-value checks; ``str(err)`` is the reason."""


def show(value) -> str:
    """How a value is quoted in a reason: strings quoted (and shortened), JSON words for
    null/true/false, numbers as written, containers by type."""
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a map"
    return f"a {type(value).__name__}"


def field_error(kind: str, name: str, value, expected: str) -> Invalid:
    if value is MISSING or value is None:     # null counts as absent (a batch's nil is absent)
        return Invalid(f"{kind}: missing field '{name}'")
    return Invalid(f"{kind}: field '{name}' is {show(value)}, expected {expected}")


def check_features(kind: str, value, max_index: int = MAX_FEATURE_INDEX,
                   limit: str = "the limit (RANKSTREAM_MAX_FEATURE_INDEX)"
                   ) -> tuple[list[int], list[float]]:
    """``(indices, values)`` of a dense list or a sparse ``{index: value}`` map, sorted;
    ``limit`` says in an error what ``max_index`` is."""
    if type(value) is list:
        if len(value) > max_index + 1:
            raise Invalid(f"{kind}: features: a dense list of {len(value)} values, more than "
                          f"{max_index + 1}: {limit}")
        values = [_feature_value(kind, v, f"position {i}") for i, v in enumerate(value)]
        return list(range(len(values))), values
    if type(value) is not dict:
        raise field_error(kind, "features", value, "a list or a map")
    pairs = []
    for key, v in value.items():
        index = _feature_index(kind, key, max_index, limit)
        pairs.append((index, _feature_value(kind, v, f"index {index}")))
    pairs.sort()
    for (a, _), (b, _) in zip(pairs, pairs[1:]):
        if a == b:
            raise Invalid(f"{kind}: features: index {a} appears twice")
    return [i for i, _ in pairs], [v for _, v in pairs]


def _feature_index(kind: str, key, max_index: int, limit: str) -> int:
    if type(key) is str:
        digits = key[1:] if key[:1] == "-" else key
        if not (digits.isascii() and digits.isdigit()):
            raise Invalid(f"{kind}: features: index {show(key)} is not an integer")
        if len(digits) > 18:
            raise Invalid(f"{kind}: features: index {show(key)} > {max_index}, {limit}")
        key = int(key)
    elif type(key) is not int:
        raise Invalid(f"{kind}: features: index {show(key)} is not an integer")
    if key < 0:
        raise Invalid(f"{kind}: features: index {key} < 0")
    if key > max_index:
        raise Invalid(f"{kind}: features: index {key} > {max_index}, {limit}")
    return key


def _feature_value(kind: str, value, where: str) -> float:
    if type(value) is not int and type(value) is not float:
        raise Invalid(f"{kind}: features: value at {where} is {show(value)}, expected a number")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise Invalid(f"{kind}: features: value at {where} is {show(value)}, "
                      "expected a finite number")
    if abs(number) > MAX_ABS_NUMBER:
        raise Invalid(f"{kind}: features: value at {where} is {show(value)}, beyond "
                      f"±{MAX_ABS_NUMBER:g}, the largest magnitude accepted")
    return number
