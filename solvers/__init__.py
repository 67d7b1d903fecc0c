"""Pure numerics for rankstream: large-margin rankers with warm-startable duals.

No I/O beyond ``save``/``load``; no Kafka, no Redis. Every estimator derives from
:class:`solvers._base.Estimator` (keyword-only ``__init__``, ``fit`` returns ``self``, learned
attributes end in ``_``, warm state in and out, persistence without pickle). Names are imported
lazily so ``import solvers`` stays cheap (numba loads on first use).

Examples
--------
>>> import solvers
>>> sorted(solvers.ESTIMATORS)
['AltSVM', 'KernelRankSVM', 'NPSVOR', 'TopPush']
"""

from importlib import import_module

from solvers._base import CollapseWarning, ConvergenceWarning, DegenerateFitWarning, NotFittedError

# the estimator families: class name -> module (a new family adds one line here)
ESTIMATORS = {
    "AltSVM": "solvers.altsvm",
    "TopPush": "solvers.toppush",
    "NPSVOR": "solvers.npsvor",
    "KernelRankSVM": "solvers.kernel_ranksvm",
}
_LAZY = {
    **ESTIMATORS,
    "pairs_from_ratings": "solvers.pairs",
    "metrics": "solvers.metrics",
}

__all__ = ["CollapseWarning", "ConvergenceWarning", "DegenerateFitWarning", "NotFittedError",
           "warm_up", *_LAZY]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'solvers' has no attribute {name!r}")
    module = import_module(_LAZY[name])
    return module if module.__name__ == f"solvers.{name}" else getattr(module, name)


def scorer_estimator(kind: str):
    """The shipped estimator class whose published model is a request-time scorer of ``kind``
    (its ``scorer_kind``; ``pipeline.serving.scorers``), which rebuilds it with
    ``from_scorer``. Only for scorers published without the ``module:Class`` of their
    estimator (a scorer names it now, so a plugin's estimator is found too).

    >>> scorer_estimator("kernel").__name__
    'KernelRankSVM'
    """
    for name in ESTIMATORS:
        cls = __getattr__(name)
        if getattr(cls, "scorer_kind", "") == kind:
            return cls
    raise ValueError(f"no estimator makes a {kind!r} scorer")


# the kernels compiled together: each estimator family, the comparison samplers, top-K
WARM_UPS = (*ESTIMATORS, "pairs", "topk", "fold_in", "neighbours")


def warm_up(n_threads=None, only: str | None = None) -> dict:
    """Compile, or load from numba's disk cache, the kernels of every estimator family, the
    comparison samplers, the top-K selection, the fold-in and the item-kNN's neighbours (or
    ``only`` one of :data:`WARM_UPS`); returns the seconds each took. Call it at service
    start (the demo and the benchmarks do) so that first calls are not compile calls;
    ``infra/setup.sh`` compiles the groups in parallel processes.

    Examples
    --------
    >>> seconds = warm_up(n_threads=1)
    >>> sorted(seconds)
    ['AltSVM', 'KernelRankSVM', 'NPSVOR', 'TopPush', 'fold_in', 'neighbours', 'pairs', 'topk']
    """
    import importlib

    if only is not None and only not in WARM_UPS:
        raise ValueError(f"only is {only!r}, expected one of {', '.join(WARM_UPS)}")
    seconds = {}
    for name in WARM_UPS if only is None else (only,):
        if name in ESTIMATORS:
            seconds[name] = __getattr__(name).warm_up(n_threads=n_threads)
        else:
            seconds[name] = importlib.import_module(f"solvers.{name}").warm_up()
    return seconds
