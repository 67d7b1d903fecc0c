"""Pure numerics for rankstream: large-margin rankers with warm-startable duals.

No I/O beyond ``save``/``load``; no Kafka, no Redis. Estimators follow the scikit-learn
contract (keyword-only ``__init__``, ``fit`` returns ``self``, learned attributes end in ``_``).
Names are imported lazily so ``import solvers`` stays cheap (numba loads on first use).
"""

from importlib import import_module

from solvers._base import ConvergenceWarning

_LAZY = {
    "AltSVM": "solvers.altsvm",
    "pairs_from_ratings": "solvers.pairs",
    "TopPush": "solvers.toppush",
    "NPSVOR": "solvers.npsvor",
    "KernelRankSVM": "solvers.kernel_ranksvm",
    "metrics": "solvers.metrics",
}

__all__ = ["ConvergenceWarning", *_LAZY]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'solvers' has no attribute {name!r}")
    module = import_module(_LAZY[name])
    return module if module.__name__ == f"solvers.{name}" else getattr(module, name)
