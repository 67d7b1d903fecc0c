"""Declared parameter constraints: each estimator's ``_parameter_constraints`` table maps every
constructor parameter to one of these, and :meth:`solvers._base.Estimator._check_params`
checks them all (as scikit-learn's ``_parameter_constraints``); what couples two parameters
is the family's ``_check_joint_params``. A failed check is a ``ValueError`` naming the
parameter and its value.

Examples
--------
>>> Int(1)("max_iter", 0)
Traceback (most recent call last):
...
ValueError: max_iter is 0, expected an integer >= 1
>>> Optional(Positive())("reg", None), Positive()
(None, Positive(allow_zero=False))
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from solvers._base import check_bool, check_choice, check_int, check_positive, check_threads
from solvers._base import seed_of as _seed_of


@dataclass(frozen=True)
class Int:
    """An integer >= ``minimum``."""

    minimum: int = 0

    def __call__(self, name: str, value) -> None:
        check_int(name, value, minimum=self.minimum)


@dataclass(frozen=True)
class Positive:
    """A finite real number > 0 (>= 0 with ``allow_zero``)."""

    allow_zero: bool = False

    def __call__(self, name: str, value) -> None:
        check_positive(name, value, allow_zero=self.allow_zero)


@dataclass(frozen=True)
class Finite:
    """Any finite real number."""

    def __call__(self, name: str, value) -> None:
        if not isinstance(value, numbers.Real) or isinstance(value, bool) \
                or not np.isfinite(value):
            raise ValueError(f"{name} is {value!r}, expected a finite number")


@dataclass(frozen=True)
class Choice:
    """One of ``options`` (strings)."""

    options: tuple

    def __call__(self, name: str, value) -> None:
        check_choice(name, value, self.options)


@dataclass(frozen=True)
class Bool:
    """True or False."""

    def __call__(self, name: str, value) -> None:
        check_bool(name, value)


@dataclass(frozen=True)
class Threads:
    """None (every numba thread) or an integer from 1 to ``NUMBA_NUM_THREADS``."""

    def __call__(self, name: str, value) -> None:
        check_threads(value)


@dataclass(frozen=True)
class Seed:
    """None, an integer or a ``numpy.random.Generator``."""

    def __call__(self, name: str, value) -> None:
        _seed_of(value, keep_none=True)


@dataclass(frozen=True)
class Address:
    """``HOST:PORT`` of a server (a Ray cluster's head).

    >>> Address()("ray_address", "127.0.0.1:6390")
    >>> Address()("ray_address", "localhost")
    Traceback (most recent call last):
    ...
    ValueError: ray_address is 'localhost', expected HOST:PORT, e.g. 127.0.0.1:6390
    """

    def __call__(self, name: str, value) -> None:
        host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{name} is {value!r}, expected HOST:PORT, e.g. 127.0.0.1:6390")


@dataclass(frozen=True)
class Optional:
    """None, or what ``inner`` accepts."""

    inner: object

    def __call__(self, name: str, value) -> None:
        if value is not None:
            self.inner(name, value)

    def __repr__(self) -> str:
        return f"Optional({self.inner!r})"
