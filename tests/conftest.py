"""Shared fixtures: the real data sets in ../shared/data and the real servers of ``infra/``.

Kafka and Redis are started once per session through ``infra/`` on free loopback ports (or taken
from ``RANKSTREAM_KAFKA_BOOTSTRAP`` / ``RANKSTREAM_REDIS_URL`` when set) and stopped by pid at
the end; a 6-node Redis Cluster likewise, only when a test asks for ``redis_cluster_url``. If a
server cannot start, its tests are skipped with the reason, except under CI
(``CI=true``), where that is a failure: integration tests are never silently skipped in CI.
Tests that use a server fixture get its marker (``kafka``, ``redis``, ``airflow``) automatically.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.servers import infra_server, ray_cluster, redis_cluster

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("RANKSTREAM_DATA", REPO.parent / "shared" / "data"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SERVER_MARKERS = {"kafka_bootstrap": "kafka", "redis_url": "redis", "airflow_home": "airflow",
                  "redis_cluster_url": "redis", "ray_address": "ray"}


def unavailable(reason: str):
    """Skip locally, fail under CI."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: integration tests must run)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")     # session: set up before any redis-server a test starts
def chromium() -> str:
    """Debian's headless Chromium (``infra/test-tools.sh``): its path; skips (fails under CI)
    when there is none."""
    import shutil

    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        unavailable("no chromium on PATH (infra/test-tools.sh installs it): this check needs "
                    "a real browser")
    return found


def pytest_collection_modifyitems(items):
    for item in items:
        for fixture, marker in SERVER_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)
        if "multihost" in item.path.parts:     # `pytest -m "not multihost"` skips them
            item.add_marker("multihost")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path of ``../shared/data``; skips (saying so) when the data sets are absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data sets not found at {SHARED_DATA} (set RANKSTREAM_DATA)")
    return SHARED_DATA


def _server(name: str, tmp_path_factory, url_of):
    try:
        with infra_server(name, tmp_path_factory.mktemp(name)) as port:
            yield url_of(port)
            return
    except RuntimeError as err:
        unavailable(str(err))


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory):
    """``host:port`` of a real Kafka 4 broker (KRaft) for this test session."""
    if os.environ.get("RANKSTREAM_KAFKA_BOOTSTRAP"):
        yield os.environ["RANKSTREAM_KAFKA_BOOTSTRAP"]
        return
    yield from _server("kafka", tmp_path_factory, lambda port: f"127.0.0.1:{port}")


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """``redis://`` URL of a real redis-server for this test session."""
    if os.environ.get("RANKSTREAM_REDIS_URL"):
        yield os.environ["RANKSTREAM_REDIS_URL"]
        return
    yield from _server("redis", tmp_path_factory, lambda port: f"redis://127.0.0.1:{port}/0")


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory):
    """``redis://`` URL of one node of a real 6-node Redis Cluster (3 primaries, 3 replicas,
    ``infra/redis/cluster-start.sh``) for this session; started only when a test asks for it.
    ``RANKSTREAM_REDIS_CLUSTER_URL`` names an existing cluster instead."""
    if os.environ.get("RANKSTREAM_REDIS_CLUSTER_URL"):
        yield os.environ["RANKSTREAM_REDIS_CLUSTER_URL"]
        return
    try:
        with redis_cluster(tmp_path_factory.mktemp("cluster")) as (base, _):
            yield f"redis://127.0.0.1:{base}/0"
            return
    except RuntimeError as err:
        unavailable(str(err))


@pytest.fixture(scope="session")
def ray_cluster_info(tmp_path_factory):
    """(address, session dir) of a real local Ray cluster (``infra/ray/start.sh``: a head and
    two worker nodes of one CPU, separate ``ray start`` processes on loopback) for this
    session; started only when a test asks for it, stopped by its pids at the end.
    ``RANKSTREAM_RAY_ADDRESS`` names an existing one instead (its session dir unknown)."""
    if os.environ.get("RANKSTREAM_RAY_ADDRESS"):
        yield os.environ["RANKSTREAM_RAY_ADDRESS"], None
        return
    tmp = tmp_path_factory.mktemp("ray")
    try:
        with ray_cluster(tmp, workers=2) as port:
            yield f"127.0.0.1:{port}", tmp / "s"
            return
    except RuntimeError as err:
        unavailable(str(err))


@pytest.fixture(scope="session")
def ray_address(ray_cluster_info) -> str:
    """``HOST:PORT`` of the session's Ray cluster (see ``ray_cluster_info``)."""
    return ray_cluster_info[0]


@pytest.fixture(scope="session")
def ray_session(ray_cluster_info) -> Path:
    """The session directory of the cluster (its nodes' command lines name it)."""
    if ray_cluster_info[1] is None:
        pytest.skip("RANKSTREAM_RAY_ADDRESS names a cluster this session did not start")
    return ray_cluster_info[1]


@pytest.fixture
def redis_client(redis_url):
    """A redis-py client on a freshly flushed database."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory):
    """A migrated SQLite ``AIRFLOW_HOME`` for ``airflow dags test`` runs (one per session)."""
    from tests import airflow_runner

    if airflow_runner.airflow_executable() is None:
        unavailable("apache-airflow is not installed (pip install -e '.[airflow]')")
    home = tmp_path_factory.mktemp("airflow_home")
    airflow_runner.migrate(airflow_runner.airflow_env(home, REPO / "dags"))
    return home
