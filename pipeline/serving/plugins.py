"""What every registry of serving code shares: entries added by name once, and plugin code
named ``module:Class`` in what a version published, imported on first use (so a serving
process needs no registration step for a plugin, and never asks the training registry).

Published versions are trusted: the names they hold decide which code on the path is
imported.
"""

from __future__ import annotations

import importlib


def class_path(cls) -> str:
    """``module:Class`` of a class, as published versions name code."""
    return f"{cls.__module__}:{cls.__qualname__}"


def named_class(path: str, base: type, what: str):
    """The class ``module:Class`` names, checked to derive from ``base``; ``ValueError``
    naming ``what`` otherwise."""
    module, _, name = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"{what} {path!r} cannot be imported ({type(err).__name__}: "
                         f"{err})") from None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{what} {path!r} is not a {base.__name__}")
    return cls


def registered(registry: dict, name, base: type, what: str):
    """``registry[name]``; a ``module:Class`` name not yet in it is imported, instantiated
    and registered (a plugin's own entry); ``ValueError`` naming the known ones otherwise."""
    entry = registry.get(name) if isinstance(name, str) else None
    if entry is None and isinstance(name, str) and ":" in name:
        entry = registry.setdefault(name, named_class(name, base, what)())
    if entry is None:
        raise ValueError(f"{what} is {name!r}, expected one of {tuple(registry)} or "
                         "module:Class")
    return entry


def add_entry(registry: dict, name: str, entry, what: str):
    """``registry[name] = entry``; ``ValueError`` when ``name`` is taken."""
    if name in registry:
        raise ValueError(f"{what} {name!r} is registered already")
    registry[name] = entry
    return entry
