"""The ``[core] hostname_callable`` of the Celery workers that infra/airflow/celery-start.sh
starts: the worker's own name (``RANKSTREAM_CELERY_HOSTNAME``, its ``-H``), so that task
instances record which of several workers on one machine ran them, as they would record the
host on separate machines; the machine's FQDN when unset."""

from __future__ import annotations

import os
import socket


def hostname() -> str:
    return os.environ.get("RANKSTREAM_CELERY_HOSTNAME") or socket.getfqdn()
