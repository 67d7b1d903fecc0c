"""Shared estimator plumbing: the convergence warning, input checks that name both values,
and persistence without pickle (``np.savez`` + a JSON manifest with a format version)."""

from __future__ import annotations

import inspect
import json
import os
import tempfile
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1


class ConvergenceWarning(UserWarning):
    """The solver stopped at ``max_iter`` before its stopping rule held."""


class ParamsMixin:
    """``get_params``/``set_params`` from the keyword-only constructor's signature."""

    def get_params(self, deep=True) -> dict:
        """Constructor parameters as a dict."""
        names = inspect.signature(type(self).__init__).parameters
        return {name: getattr(self, name) for name in names if name != "self"}

    def set_params(self, **params):
        """Set constructor parameters; returns ``self``."""
        valid = self.get_params()
        for key, value in params.items():
            if key not in valid:
                raise ValueError(f"{type(self).__name__} has no parameter {key!r}; "
                                 f"valid: {sorted(valid)}")
            setattr(self, key, value)
        return self


def check_finite(name: str, a: np.ndarray) -> None:
    """Raise ``ValueError`` naming the first NaN/inf entry of ``a`` and its position."""
    bad = ~np.isfinite(a)
    if bad.any():
        pos = np.unravel_index(int(np.flatnonzero(bad.ravel())[0]), a.shape)
        pos = pos[0] if len(pos) == 1 else tuple(int(p) for p in pos)
        raise ValueError(f"{name} contains {a[pos].item()!r} at position {pos}; "
                         "expected finite values")


def check_choice(name: str, value, choices) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} is {value!r}, expected one of {sorted(choices)}")


def check_positive(name: str, value, *, allow_zero: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number > 0 (or >= 0)."""
    ok = np.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} is {value!r}, expected a finite number {bound}")


def save_npz(path, *, algorithm: str, params: dict, arrays: dict, extra: dict | None = None):
    """Write ``path`` (a directory) atomically: ``arrays.npz`` plus ``manifest.json``.

    The manifest holds the format version, the algorithm name, the constructor parameters and
    any ``extra`` JSON-able metadata. Nothing is pickled.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    np.savez(tmp / "arrays.npz", **{k: np.asarray(v) for k, v in arrays.items()})
    manifest = {"format_version": FORMAT_VERSION, "algorithm": algorithm, "params": params,
                "extra": extra or {}}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if path.exists():
        old = path.with_name(f".{path.name}.old")
        os.replace(path, old)
        os.replace(tmp, path)
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    else:
        os.replace(tmp, path)


def load_npz(path, *, algorithm: str):
    """Read what :func:`save_npz` wrote; check algorithm and format version.

    Returns ``(params, arrays, extra)``; arrays are loaded with ``allow_pickle=False``.
    """
    path = Path(path)
    manifest = json.loads((path / "manifest.json").read_text())
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} has format_version {manifest.get('format_version')!r}, "
                         f"this rankstream reads {FORMAT_VERSION}")
    if manifest.get("algorithm") != algorithm:
        raise ValueError(f"{path} holds a {manifest.get('algorithm')!r} model, "
                         f"expected {algorithm!r}")
    with np.load(path / "arrays.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return manifest["params"], arrays, manifest.get("extra", {})
