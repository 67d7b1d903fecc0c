"""The servers of tests/multihost/test_celery.py, each started by its infra/ script and stopped by
pid: a private PostgreSQL (infra/postgres), and Airflow 3 on Celery workers
(infra/airflow/celery-start.sh), with a client for Airflow's REST API and a way to lose a
worker's host (its whole process tree SIGKILLed at once)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.servers import INFRA, free_port

AIRFLOW = INFRA / "airflow"
TERMINAL = {"success", "failed"}


def _run(script: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([script], env=env, capture_output=True, text=True, timeout=timeout)


@contextmanager
def postgres(tmp: Path):
    """Run infra/postgres/start.sh on a free port with its state under ``tmp``; yield the
    environment naming it (``RANKSTREAM_PG_PORT``, ``RANKSTREAM_PG_DIR``); stop.sh afterwards."""
    env = {"RANKSTREAM_PG_PORT": str(free_port()), "RANKSTREAM_PG_DIR": str(tmp / "pg")}
    full = {**os.environ, **env}
    start = _run(INFRA / "postgres" / "start.sh", full, 120)
    try:
        if start.returncode != 0:
            raise RuntimeError(f"infra/postgres/start.sh failed ({start.returncode}): "
                               f"{start.stdout}{start.stderr}")
        yield env
    finally:
        _run(INFRA / "postgres" / "stop.sh", full, 120)


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (what the pid files record), or None if PID is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


@dataclass
class CeleryAirflow:
    """Airflow 3 on Celery workers, as celery-start.sh runs it, and its REST API."""

    base_url: str
    state_dir: Path
    workers: list[str]
    env: dict
    _http: object = field(default=None, repr=False)

    @property
    def run_dir(self) -> Path:
        return self.state_dir / "run"

    def pid_of(self, name: str) -> int:
        """The pid in run/NAME.pid, after checking it is still the process started."""
        pid, started = (self.run_dir / f"{name}.pid").read_text().split()
        if _start_time(int(pid)) != started:
            raise RuntimeError(f"{name}: pid {pid} is gone or another process")
        return int(pid)

    def our_pids(self) -> set[int]:
        """Every live process celery-start.sh started, and their descendants."""
        pids = set()
        for pidfile in self.run_dir.glob("*.pid"):
            try:
                pid = self.pid_of(pidfile.stem)
            except RuntimeError:
                continue
            pids |= {pid, *descendants(pid)}
        return pids

    # ------------------------------------------------------------------ REST API

    def _client(self):
        """One HTTP client for the module, logged in as the generated admin user."""
        import httpx

        if self._http is None:
            passwords = self.state_dir / "airflow" / "simple_auth_manager_passwords.json.generated"
            password = json.loads(passwords.read_text())["admin"]
            got = httpx.post(f"{self.base_url}/auth/token", timeout=30,
                             json={"username": "admin", "password": password})
            got.raise_for_status()
            self._http = httpx.Client(
                base_url=f"{self.base_url}/api/v2", timeout=30,
                headers={"Authorization": f"Bearer {got.json()['access_token']}"})
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    def get(self, path: str) -> dict:
        got = self._client().get(path)
        got.raise_for_status()
        return got.json()

    def wait_for_dags(self, dag_ids, timeout: float = 120) -> None:
        """Until the dag-processor has parsed every one of ``dag_ids``."""
        deadline = time.monotonic() + timeout
        while True:
            known = {d["dag_id"] for d in self.get("/dags?limit=100")["dags"]}
            if set(dag_ids) <= known:
                return
            errors = self.get("/importErrors")["import_errors"]
            if errors:
                raise AssertionError(f"the DAG files do not import: {errors[0]['stack_trace']}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"DAGs {sorted(set(dag_ids) - known)} were not parsed in "
                                   f"{timeout:.0f} s (have {sorted(known)}); see "
                                   f"{self.run_dir / 'dag-processor.log'}")
            time.sleep(0.5)

    def trigger(self, dag_id: str) -> str:
        """A manual run of ``dag_id`` (unpaused first); its run id."""
        client = self._client()
        client.patch(f"/dags/{dag_id}", json={"is_paused": False}).raise_for_status()
        got = client.post(f"/dags/{dag_id}/dagRuns", json={"logical_date": None})
        got.raise_for_status()
        return got.json()["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}")["state"]

    def wait(self, runs: dict[str, str], timeout: float) -> dict[str, str]:
        """Until every run of ``{dag_id: run_id}`` has ended; ``{dag_id: state}``."""
        deadline, states = time.monotonic() + timeout, {}
        while True:
            states = {dag: self.run_state(dag, run) for dag, run in runs.items()}
            if set(states.values()) <= TERMINAL:
                return states
            if time.monotonic() > deadline:
                tis = {dag: [(t["task_id"], t["state"], t["hostname"])
                             for t in self.task_instances(dag, run)]
                       for dag, run in runs.items() if states[dag] not in TERMINAL}
                raise TimeoutError(f"runs not done in {timeout:.0f} s: {states}; {tis}")
            time.sleep(1.0)     # the api-server shares the two cores with the tasks

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]

    def tries(self, dag_id: str, run_id: str, task_id: str) -> list[dict]:
        """Every try of one task instance, first to last (hostname, state, try_number)."""
        got = self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/tries")
        return sorted(got["task_instances"], key=lambda t: t["try_number"])

    def task_log(self, worker: str) -> str:
        """The last lines of a worker's own log (for failure messages)."""
        return (self.run_dir / f"{worker}.log").read_text()[-3000:]

    # ------------------------------------------------------------------ losing a host

    def lose_host(self, worker: str) -> list[int]:
        """SIGKILL the worker's whole process tree at once, as if its host died: its process
        group (the Celery pool) and every descendant's group (Airflow runs a task in a group of
        its own). The tree is frozen first (SIGSTOP) so nothing forks while it is collected.
        Returns the pids killed."""
        pid = self.pid_of(worker)
        os.killpg(pid, signal.SIGSTOP)
        tree = [pid, *descendants(pid)]
        groups = set()
        for p in tree:
            try:
                groups.add(os.getpgid(p))
            except ProcessLookupError:
                pass
        for group in groups:
            try:
                os.kill(-group, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return tree


@contextmanager
def celery_airflow(tmp: Path, env: dict, workers: int = 2):
    """Run infra/airflow/celery-start.sh (api-server, scheduler, dag-processor and ``workers``
    Celery workers) with ``env`` and its state under ``tmp``; yield a :class:`CeleryAirflow`;
    celery-stop.sh (every process by pid) afterwards."""
    port = free_port()
    state = tmp / "airflow-celery"
    env = {**env, "RANKSTREAM_CELERY_DIR": str(state), "RANKSTREAM_AIRFLOW_PORT": str(port),
           "RANKSTREAM_CELERY_WORKERS": str(workers)}
    try:
        began = time.monotonic()
        start = _run(AIRFLOW / "celery-start.sh", env, 600)
        print(f"celery-start.sh took {time.monotonic() - began:.1f} s")
        if start.returncode != 0:
            raise RuntimeError(f"infra/airflow/celery-start.sh failed ({start.returncode}): "
                               f"{start.stdout[-3000:]}{start.stderr[-3000:]}")
        airflow = CeleryAirflow(f"http://127.0.0.1:{port}", state,
                                [f"worker-{n}" for n in range(1, workers + 1)], env)
        try:
            yield airflow
        finally:
            airflow.close()
    finally:
        began = time.monotonic()
        _run(AIRFLOW / "celery-stop.sh", env, 180)
        print(f"celery-stop.sh took {time.monotonic() - began:.1f} s")


def listening(pids: set[int]) -> list[tuple[str, int]]:
    """``(local address:port, pid)`` of every TCP socket in LISTEN state that one of ``pids``
    holds (``ss -ltnpH``)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=30).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()        # the process names at the end may hold spaces
        for pid in map(int, re.findall(r"pid=(\d+)", line)):
            if pid in pids and len(parts) > 3:
                found.append((parts[3], pid))
    return found
