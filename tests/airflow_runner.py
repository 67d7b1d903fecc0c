"""Run the real Airflow 3 CLI against a private SQLite ``AIRFLOW_HOME`` (see infra/airflow)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

INFRA_AIRFLOW = Path(__file__).resolve().parent.parent / "infra" / "airflow"


def airflow_executable() -> str | None:
    """The ``airflow`` script of this interpreter's environment, or None if not installed."""
    local = Path(sys.executable).with_name("airflow")
    return str(local) if local.exists() else shutil.which("airflow")


def airflow_env(home: Path, dags_folder: Path, extra: dict | None = None) -> dict:
    """Environment for the Airflow CLI: private home, our DAG folder, no examples."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    })
    env.update(extra or {})
    return env


def migrate(env: dict) -> None:
    """``airflow db migrate`` (creates the SQLite metadata DB)."""
    run = subprocess.run([airflow_executable(), "db", "migrate"], env=env, capture_output=True,
                         text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{run.stdout[-3000:]}\n"
                           f"{run.stderr[-3000:]}")


def dags_test(env: dict, dag_id: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``airflow dags test DAG_ID``; returns the completed process (output in ``.stdout``)."""
    return subprocess.run([airflow_executable(), "dags", "test", dag_id], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
