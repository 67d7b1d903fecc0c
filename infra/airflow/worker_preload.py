"""The ``[celery] celery_config_options`` of the workers that infra/airflow/celery-start.sh
starts: Airflow's own Celery config, unchanged, plus rankstream's heavy modules imported once in
the worker's main process before it forks its pool (what Airflow's ``on_celery_import_modules``
does for numpy). A task runs in a process forked from the pool, so it starts with them instead
of importing them again: about 2-4 s less per task on two cores (numba, scikit-learn,
matplotlib, the solvers, pyarrow, kafka-python). Only imports: no numba kernel runs here, so no
thread pool exists when the worker forks.

A worker keeps the pipeline code it started with: restart the workers after changing it (DAG
files are still parsed afresh by every task).
"""

from __future__ import annotations

import logging
from importlib import import_module

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG
from celery.signals import import_modules

CELERY_CONFIG = DEFAULT_CELERY_CONFIG

PRELOAD = (
    "pipeline.training.airflow_tasks", "pipeline.training.retrain", "pipeline.training.report",
    "pipeline.training.lock", "pipeline.ingest.kafka", "pipeline.serving.publish",
    "solvers.altsvm", "solvers.toppush", "solvers.kernel_ranksvm", "solvers.npsvor",
    "solvers.topk", "solvers.metrics", "sklearn.linear_model", "sklearn.svm",
    "matplotlib.figure", "matplotlib.backends.backend_agg",
)


@import_modules.connect
def preload(*args, **kwargs) -> None:
    """Import what the retraining tasks use, each trainer included; a module that fails to
    import is logged and left to the task that needs it (which then fails saying why)."""
    names = list(PRELOAD)
    try:
        from pipeline.training.registry import FAMILIES

        names += [f.trainer.split(":")[0] for f in FAMILIES.values()]
    except ImportError as err:
        logging.getLogger(__name__).warning("not preloading the trainers: %s", err)
    for name in names:
        try:
            import_module(name)
        except ImportError as err:
            logging.getLogger(__name__).warning("not preloading %s: %s", name, err)
