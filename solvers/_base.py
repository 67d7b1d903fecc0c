"""The estimator base every rankstream solver derives from, and the input checks they share.

What a family writes: its keyword-only ``__init__`` (parameters only), the table
``_parameter_constraints`` (a :mod:`solvers._params` constraint for every parameter) and, for
what couples parameters, ``_check_joint_params``; ``fit`` (check, call its solver driver, set
the learned ``*_`` attributes), ``_warm_arrays()`` (the warm state),
``_state_arrays()``/``_from_state()`` (what ``save``/``load`` keep) and ``_tiny_problem()`` (a
small fit for :meth:`Estimator.warm_up`). The abstract ones are declared with :mod:`abc`: a
family that lacks one cannot be instantiated. The base gives every family the same behaviour for
the rest: ``get_params``/``set_params``, one :class:`NotFittedError`, warm-state checks that
name the algorithm and the missing keys, persistence without pickle through
:mod:`solvers.persist` with a per-algorithm format version, ``random_state`` handling, thread
counts for numba kernels, and the wording of the :class:`ConvergenceWarning`.
"""

from __future__ import annotations

import abc
import inspect
import numbers
import time
import warnings
from contextlib import contextmanager

import numpy as np

from solvers.persist import read_bundle, write_bundle

MODEL_FORMAT = "rankstream.model"


class ConvergenceWarning(UserWarning):
    """The solver stopped at ``max_iter`` before its stopping rule held."""


class DegenerateFitWarning(UserWarning):
    """The fitted model ranks (nearly) nothing: its scores are constant, or its objective hardly
    prefers it to the zero model. The message says which parameter to change."""


class CollapseWarning(DegenerateFitWarning):
    """A factor model ended at (or was asked for) a regularization at which its factors are
    zero: it predicts no more than its bias terms."""


class NotFittedError(ValueError, AttributeError):
    """A method that needs a fitted model was called before ``fit`` (or ``load``)."""


class Estimator(abc.ABC):
    """Base of every rankstream estimator (see the module docstring for what a family adds).

    Class attributes a family sets: ``algorithm`` (its name in saved files and warm states),
    ``format_version`` (of its saved arrays; bump it when they change), ``fitted_attribute``
    (a learned attribute that exists once fitted), ``warm_keys`` (the arrays of its warm
    state), ``_parameter_constraints`` (constructor parameter -> constraint) and, for a model
    scored at request time, ``scorer_kind`` (with :meth:`from_scorer`).
    """

    algorithm: str = ""
    format_version: int = 1
    fitted_attribute: str = ""
    warm_keys: tuple[str, ...] = ()
    _parameter_constraints: dict = {}
    # a family whose published model scores candidates at request time names its kind of
    # scorer (a kind registered in pipeline.serving.scorers, or the module:Class of its own)
    # and rebuilds a predict-only model from it in from_scorer
    scorer_kind: str = ""

    @classmethod
    def from_scorer(cls, params: dict, arrays: dict):
        """A predict-only model from a published scorer's ``params`` and ``arrays`` (families
        with a ``scorer_kind``)."""
        raise NotImplementedError(f"{cls.__name__} publishes no request-time scorer")

    @abc.abstractmethod
    def fit(self, *args, **kwargs):
        """Learn from data; returns ``self``."""

    # ------------------------------------------------------------------ parameters

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

    def validate_params(self) -> None:
        """Check every constructor parameter without data (``ValueError`` naming it and its
        value): what a config loader asks before any training."""
        self._check_params()

    def _check_params(self):
        """Every constructor parameter against its entry of ``_parameter_constraints``, then
        :meth:`_check_joint_params`; returns what that returns (what ``fit`` needs, such as
        the thread count)."""
        for name, constraint in self._parameter_constraints.items():
            constraint(name, getattr(self, name))
        return self._check_joint_params()

    def _check_joint_params(self):
        """What couples parameters (a family overrides it); ``None`` by default."""
        return None

    @classmethod
    def param_names(cls) -> tuple[str, ...]:
        """Names the constructor takes (what a model config may set)."""
        return tuple(n for n in inspect.signature(cls.__init__).parameters if n != "self")

    def __repr__(self) -> str:
        defaults = {n: p.default for n, p in inspect.signature(type(self).__init__)
                    .parameters.items() if n != "self"}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items()
                   if not _same(v, defaults.get(k))]
        return f"{type(self).__name__}({', '.join(changed)})"

    # ------------------------------------------------------------------ fitted state

    def _check_fitted(self) -> None:
        if not hasattr(self, self.fitted_attribute):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit() "
                                 "first (or load() a saved model)")

    def warm_state(self) -> dict:
        """The state a later ``fit(..., warm_start=state)`` starts from: plain numpy arrays
        (``np.savez``-able, no pickle), tagged with ``"algorithm"``. Everything is a copy (the
        ``fresh_warm_keys`` that ``_warm_arrays`` makes afresh are not copied twice: AltSVM's
        keys widened to int64 were 170 MB more at a 7M-comparison retrain's peak)."""
        self._check_fitted()
        state = {k: v if k in self.fresh_warm_keys else np.array(v, copy=True)
                 for k, v in self._warm_arrays().items()}
        state["algorithm"] = np.array(self.algorithm)
        return state

    def warm_view(self) -> dict:
        """What :meth:`warm_state` gives, for a caller in this process that only reads it
        before the model fits again (a retrain's refit, its checkpoint); a solver whose
        warm state is large hands out its own arrays instead of copies. Here: a copy."""
        return self.warm_state()

    fresh_warm_keys: tuple = ()   # arrays _warm_arrays() makes afresh, owned by no one else

    @abc.abstractmethod
    def _warm_arrays(self) -> dict:
        """The arrays of the warm state (:meth:`warm_state` copies and tags them)."""

    def _check_warm_state(self, state) -> dict:
        """``state`` as {key: ndarray}, checked to be this algorithm's warm state with every
        key of ``warm_keys``; the errors name what is wrong."""
        name = type(self).__name__
        if not isinstance(state, dict):
            raise ValueError(f"warm_start is a {type(state).__name__}, expected the dict "
                             f"returned by {name}.warm_state()")
        tag = state.get("algorithm")
        if tag is not None and str(np.asarray(tag)) != self.algorithm:
            raise ValueError(f"warm_start comes from a {str(np.asarray(tag))!r} model, this is "
                             f"a {self.algorithm!r} model")
        missing = [k for k in self.warm_keys if k not in state]
        if missing:
            raise ValueError(f"warm_start lacks {missing}; a {name} warm state has "
                             f"{list(self.warm_keys)}")
        return {k: np.asarray(state[k]) for k in self.warm_keys}

    # ------------------------------------------------------------------ persistence

    def save(self, path):
        """Write the fitted model and its warm state to the directory ``path``
        (``arrays.npz`` + ``manifest.json``, atomically; nothing pickled)."""
        self._check_fitted()
        manifest = {"format": MODEL_FORMAT, "algorithm": self.algorithm,
                    "format_version": self.format_version, "params": self._json_params()}
        write_bundle(path, self._state_arrays(), manifest)

    @classmethod
    def load(cls, path):
        """Read a model written by :meth:`save` (``allow_pickle=False``)."""
        manifest, arrays = read_bundle(path, fmt=MODEL_FORMAT)
        if manifest.get("algorithm") != cls.algorithm:
            raise ValueError(f"{path} holds a {manifest.get('algorithm')!r} model, expected "
                             f"{cls.algorithm!r}")
        if manifest.get("format_version") != cls.format_version:
            raise ValueError(f"{path} has {cls.algorithm} format_version "
                             f"{manifest.get('format_version')!r}, this rankstream reads "
                             f"{cls.format_version}")
        model = cls(**manifest["params"])
        model._from_state(arrays)
        return model

    @abc.abstractmethod
    def _state_arrays(self) -> dict:
        """The learned arrays :meth:`save` writes."""

    @abc.abstractmethod
    def _from_state(self, arrays: dict) -> None:
        """Set the learned attributes from what :meth:`_state_arrays` gave."""

    def _json_params(self) -> dict:
        params = self.get_params()
        if "random_state" in params:
            params["random_state"] = seed_of(params["random_state"], keep_none=True)
        return params

    # ------------------------------------------------------------------ warm-up

    @classmethod
    def _tiny_problem(cls) -> tuple[tuple, dict]:
        """``(args, kwargs)`` of a small ``fit`` that runs every kernel of the family."""
        raise NotImplementedError

    @classmethod
    def warm_up(cls, n_threads=None) -> float:
        """Compile, or load from numba's disk cache, this family's kernels: a small cold fit
        and a warm refit. Returns the seconds it took."""
        started = time.perf_counter()
        args, kwargs = cls._tiny_problem()
        params = {"n_threads": n_threads} if "n_threads" in cls.param_names() else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = cls(**params).fit(*args, **kwargs)
            cls(**params).fit(*args, **kwargs, warm_start=model.warm_state())
        return time.perf_counter() - started

    # ------------------------------------------------------------------ messages

    def _warn_not_converged(self, detail: str) -> None:
        """The one wording of the ConvergenceWarning: what happened and what to change."""
        warnings.warn(f"{type(self).__name__} did not converge in max_iter={self.max_iter} "
                      f"iterations ({detail}); increase max_iter or tol, or start from "
                      "warm_start", ConvergenceWarning, stacklevel=3)


def _same(a, b) -> bool:
    try:
        return bool(a == b) if not isinstance(a, np.ndarray) else False
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------- random state, threads

def seed_of(random_state, *, keep_none: bool = False):
    """An integer seed from ``random_state`` (None, an integer or a ``numpy.random.Generator``).

    With ``keep_none`` an unseeded state stays ``None`` (for saved parameters, where a
    Generator cannot be stored and None says "not reproducible").

    Examples
    --------
    >>> seed_of(7), seed_of(None, keep_none=True)
    (7, None)
    """
    if random_state is None:
        return None if keep_none else int(np.random.default_rng().integers(0, 2**63))
    if isinstance(random_state, np.random.Generator):
        return None if keep_none else int(random_state.integers(0, 2**63))
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        return int(random_state)
    raise ValueError(f"random_state is {random_state!r}, expected None, an integer or a "
                     "numpy.random.Generator")


def rng_of(random_state) -> np.random.Generator:
    """A ``numpy.random.Generator`` for ``random_state`` (a Generator is used as it is)."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    return np.random.default_rng(seed_of(random_state, keep_none=True))


def available_threads() -> int:
    """Threads numba may use (``NUMBA_NUM_THREADS``)."""
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


def check_threads(n_threads) -> int:
    """The thread count to use for ``n_threads`` (None: all numba threads)."""
    available = available_threads()
    if n_threads is None:
        return available
    if not isinstance(n_threads, numbers.Integral) or isinstance(n_threads, bool) \
            or n_threads < 1:
        raise ValueError(f"n_threads is {n_threads!r}, expected an integer >= 1 or None")
    if n_threads > available:
        raise ValueError(f"n_threads is {n_threads}, but numba has {available} threads "
                         "(NUMBA_NUM_THREADS)")
    return int(n_threads)


@contextmanager
def numba_threads(n_threads: int, chunksize: int | None = None):
    """Within the block numba's parallel kernels use ``n_threads`` threads, one included (a
    parallel kernel then runs on the caller's thread), and hand out ``chunksize`` iterations
    at a time when given; the previous settings come back after."""
    import numba

    previous = numba.get_num_threads(), numba.get_parallel_chunksize()
    numba.set_num_threads(n_threads)
    if chunksize is not None:
        numba.set_parallel_chunksize(chunksize)
    try:
        yield
    finally:
        numba.set_num_threads(previous[0])
        numba.set_parallel_chunksize(previous[1])


# ---------------------------------------------------------------------- input checks

def check_aligned(**arrays: np.ndarray) -> None:
    """Every array is 1-D and all have one length (the metrics' inputs, row by row); the error
    names each array with its shape or length."""
    def listed(words):
        return ", ".join(words[:-1]) + " and " + words[-1]

    shapes = [a.shape for a in arrays.values()]
    if any(len(shape) != 1 for shape in shapes):
        raise ValueError(f"{listed(list(arrays))} must be 1-D; got shapes "
                         f"{', '.join(map(str, shapes))}")
    lengths = [str(shape[0]) for shape in shapes]
    if len(set(lengths)) > 1:
        raise ValueError(f"{listed(list(arrays))} have lengths {listed(lengths)}; expected "
                         "equal lengths")


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
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} is {value!r}, expected one of {sorted(choices)}")


def check_positive(name: str, value, *, allow_zero: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is a finite number > 0 (or >= 0)."""
    ok = (isinstance(value, numbers.Real) and not isinstance(value, bool)
          and np.isfinite(value) and (value >= 0 if allow_zero else value > 0))
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} is {value!r}, expected a finite number {bound}")


def check_int(name: str, value, *, minimum: int = 0) -> int:
    """``value`` as an int, or ``ValueError`` unless it is an integer >= ``minimum``."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} is {value!r}, expected an integer >= {minimum}")
    return int(value)


def check_bool(name: str, value) -> bool:
    """``value`` as a bool, or ``ValueError`` unless it is True or False."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} is {value!r}, expected True or False")
    return bool(value)


def check_X(X, name: str = "X"):
    """A feature matrix as the kernels take it: a C-contiguous float32/float64 array or a CSR
    matrix with sorted indices (other sparse formats become CSR, other dtypes float64), with
    no NaN or inf (the error names the first one's position)."""
    import scipy.sparse as sp

    if sp.issparse(X):
        if X.ndim != 2:
            raise ValueError(f"{name} has {X.ndim} dimensions, expected 2")
        X = X.tocsr() if X.format != "csr" else X
        if X.dtype not in (np.float32, np.float64):
            X = X.astype(np.float64)
        bad = ~np.isfinite(X.data)
        if bad.any():
            p = int(np.flatnonzero(bad)[0])
            row = int(np.searchsorted(X.indptr, p, side="right") - 1)
            raise ValueError(f"{name} contains {X.data[p]!r} at position ({row}, "
                             f"{int(X.indices[p])}); expected finite values")
        return X if X.has_sorted_indices else X.sorted_indices()
    X = np.asarray(X)
    if X.ndim != 2:
        raise ValueError(f"{name} has {X.ndim} dimensions (shape {X.shape}), expected 2")
    if X.dtype not in (np.float32, np.float64):
        try:
            X = X.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name} has dtype {X.dtype}, expected numbers") from exc
    check_finite(name, X)
    return np.ascontiguousarray(X)


def check_ids(ids, n_rows: int) -> np.ndarray:
    """Unique instance ids (integers or strings) that key dual variables across warm starts;
    default the row positions ``0..n_rows-1``."""
    if ids is None:
        return np.arange(n_rows)
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.shape[0] != n_rows:
        raise ValueError(f"ids has shape {ids.shape}, expected ({n_rows},) to match the "
                         f"{n_rows} rows of X")
    if ids.dtype.kind not in "iuUS":
        raise ValueError(f"ids has dtype {ids.dtype}; expected integers or strings")
    uniq, counts = np.unique(ids, return_counts=True)
    if uniq.size != n_rows:
        dup = uniq[counts > 1][:5].tolist()
        raise ValueError(f"ids are not unique: {dup} appear more than once")
    return ids


def map_by_id(old_ids: np.ndarray, old_values: np.ndarray, new_ids: np.ndarray,
              name: str = "values") -> np.ndarray:
    """Rows of ``old_values`` (keyed by ``old_ids``) at ``new_ids``; zeros where an id is new.

    ``old_values`` has shape (len(old_ids), ...); the result (len(new_ids), ...).

    Examples
    --------
    >>> map_by_id(np.array([3, 7]), np.array([0.5, 0.25]), np.array([7, 9, 3])).tolist()
    [0.25, 0.0, 0.5]
    """
    old_ids, old_values = np.asarray(old_ids), np.asarray(old_values, dtype=np.float64)
    if old_values.shape[:1] != old_ids.shape:
        raise ValueError(f"warm_start has {old_ids.size} ids but {old_values.shape[0]} {name} "
                         "rows")
    out = np.zeros((new_ids.shape[0],) + old_values.shape[1:])
    if (old_ids.dtype.kind in "US") != (new_ids.dtype.kind in "US") and old_ids.size \
            and new_ids.size:
        raise ValueError(f"ids have dtype {new_ids.dtype} but the warm start's ids have dtype "
                         f"{old_ids.dtype}")
    pos = positions_by_id(old_ids, new_ids)
    found = pos >= 0
    out[found] = old_values[pos[found]]
    return out


def positions_by_id(old_ids: np.ndarray, new_ids: np.ndarray) -> np.ndarray:
    """For each of ``new_ids`` its position in ``old_ids`` (unique), or −1 where it is new
    (also when one side holds strings and the other integers).

    Examples
    --------
    >>> positions_by_id(np.array([3, 7]), np.array([7, 9, 3])).tolist()
    [1, -1, 0]
    """
    out = np.full(new_ids.shape[0], -1, dtype=np.int64)
    if old_ids.size == 0 or new_ids.size == 0 \
            or (old_ids.dtype.kind in "US") != (new_ids.dtype.kind in "US"):
        return out
    order = np.argsort(old_ids, kind="stable")
    old_sorted = old_ids[order]
    pos = np.minimum(np.searchsorted(old_sorted, new_ids), old_sorted.size - 1)
    found = old_sorted[pos] == new_ids
    out[found] = order[pos[found]]
    return out
